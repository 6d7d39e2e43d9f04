"""Each key's view: immutable snapshots of its committed shards, and look-ups in them.

A process keeps one :class:`KeyView` per model key. Its :class:`Snapshot` (the
visible runs in commit order, their records, the superseded ones) is replaced under
the view's short lock and read outside any lock; ``refresh`` lists the commit
records again when the snapshot is older than the caller allows, and ``adopt`` adds
a shard this process just committed without reading it back. Look-ups go through
each run's sorted index (:mod:`embedcache.store.runs`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store.index import argsort_keys
from embedcache.store.layout import (
    CommitRecord,
    log_name,
    log_path,
    log_prefix,
)
from embedcache.store.runs import BlockCache, ChunkError, probe, read_sorted
from embedcache.store.shards import (
    MissingObjectError,
    Shard,
    corrupt,
    open_shard,
    read_keys,
    read_rows,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from embedcache.specs import ModelKey
    from embedcache.store.backend import Backend

logger = logging.getLogger(__name__)

RETRIES = 5
# seqs below a listing's last one read directly when the listing lacks them
LAG_WINDOW = 64


class ShardRetiredError(Exception):
    """A shard vanished because another process retired it; refresh and retry."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One immutable state of a key: what readers use, outside any lock.

    A new state replaces the old under the view's short lock; a reader keeps the one
    it took for its whole call.
    """

    shards: tuple[Shard, ...] = ()  # visible runs, in commit order
    records: Mapping[str, CommitRecord] = field(default_factory=dict)
    hidden: Mapping[str, str] = field(default_factory=dict)  # superseded -> superseder
    listing: frozenset[str] | None = None  # log entries listed; None: list again
    top: int = 0  # the largest seq seen in the key's log
    listed_at: float = -math.inf  # time.monotonic() of that listing
    stamp: tuple[int, float] | None = None  # local store: commits folder's mtime


@dataclass(slots=True)
class KeyView:
    """What one process knows of a model key: its current :class:`Snapshot`."""

    key: ModelKey
    digest: str
    dim: int
    snap: Snapshot = field(default_factory=Snapshot)
    lock: threading.Lock = field(default_factory=threading.Lock)  # swaps, refreshes
    cache: BlockCache = field(default_factory=BlockCache)
    # runs (and "log <seq>" entries) that failed their checks: not served
    quarantined: set[str] = field(default_factory=set)
    quarantine_lock: threading.Lock = field(default_factory=threading.Lock)

    # the current state's parts (maintenance reads these under the writer's lock)
    @property
    def shards(self) -> tuple[Shard, ...]:
        return self.snap.shards

    @property
    def records(self) -> Mapping[str, CommitRecord]:
        return self.snap.records

    @property
    def hidden(self) -> Mapping[str, str]:
        return self.snap.hidden

    @property
    def listing(self) -> frozenset[str] | None:
        return self.snap.listing

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(sorted({a for s in self.shards for a in s.record.aliases}))

    @property
    def kernels(self) -> tuple[str, ...]:
        """What computed the visible runs' vectors (canonical JSON objects)."""
        return tuple(sorted({k for s in self.shards for k in s.record.kernels}))

    def forget_listing(self) -> None:
        with self.lock:
            self.snap = replace(self.snap, listing=None, listed_at=-math.inf)


def list_records(backend: Backend, digest: str) -> frozenset[str]:
    """Names of the key's log entries (zero-padded seqs): the published runs.

    One directory listing, not a walk: a folder whose ``zarr.json`` is not there
    (yet, or any more) is skipped when its entry is read.
    """
    folders, _ = backend.list_dir(log_prefix(digest))
    return frozenset(n for n in folders if n.isdigit())


def missing_or_retired(
    backend: Backend, view: KeyView, record: CommitRecord, path: str
) -> Exception:
    """A published run lacks ``path``: retired if its log entry is gone (retiring
    deletes the entries first), else lost."""
    if record.seq is None or not backend.exists(log_path(view.digest, record.seq)):
        return ShardRetiredError(record.shard)
    return corrupt(backend, path, "object is missing", view.digest, record.shard)


def _commits_stamp(backend: Backend, digest: str) -> tuple[int, float] | None:
    """A local store's cheap change check: the log folder's mtime, and now.

    Creating or removing a log entry's folder changes it. None on object stores.
    """
    if backend.local is None:
        return None
    try:
        return (backend.local / log_prefix(digest)).stat().st_mtime_ns, time.time()
    except OSError:
        return None


def _unchanged(old: tuple[int, float] | None, new: tuple[int, float] | None) -> bool:
    # an mtime is as coarse as the kernel's clock tick: a listing taken within a
    # tick of the folder's last change may have missed a later change in that tick
    return (
        old is not None
        and new is not None
        and old[0] == new[0]
        and old[1] - old[0] / 1e9 > _MTIME_SLACK_S
    )


_MTIME_SLACK_S = 0.1
# how often a look-up on a local store checks the commits folder (seconds; never
# less often than refresh_seconds asks)
LOCAL_CHECK_S = 0.05


def refresh(
    backend: Backend, view: KeyView, *, max_age: float = 0.0, check_folder: bool = True
) -> Snapshot:
    """The view's state brought up to the committed shards, if older than ``max_age``.

    Listing and reading new records and fences happen under the view's lock (one
    refresh at a time), never under a reader's: a reader that accepts a stale state
    (``max_age`` > 0) takes the current one while another thread refreshes. On a
    local store the commits folder's mtime decides instead of the age: unchanged,
    the listing stays current; changed, it is taken again (a directory read).
    Without ``check_folder`` (this process is committing, and lists at each commit)
    a local store too keeps a state younger than ``max_age`` without any I/O.
    """
    snap = view.snap
    if snap.listing is not None:
        age = time.monotonic() - snap.listed_at
        if backend.local is None or not check_folder:
            if age < max_age:
                return snap
        elif age < min(max_age, LOCAL_CHECK_S):
            return snap
        elif _unchanged(snap.stamp, _commits_stamp(backend, view.digest)):
            # a local folder: the change check decides (checked again after a while:
            # a stat releases the GIL, which a busy writer thread then holds)
            if view.lock.acquire(blocking=False):  # else a refresh is under way
                try:
                    if view.snap is snap:
                        view.snap = replace(snap, listed_at=time.monotonic())
                finally:
                    view.lock.release()
            return view.snap
    if not view.lock.acquire(blocking=max_age <= 0 or snap.listing is None):
        return snap
    try:
        for _ in range(RETRIES):
            snap = view.snap
            now = time.monotonic()
            stamp = _commits_stamp(backend, view.digest)
            names = list_records(backend, view.digest)
            if names == snap.listing:
                view.snap = replace(snap, listed_at=now, stamp=stamp)
                return view.snap
            try:
                view.snap = _rebuild(backend, view, snap, names, now, stamp)
            except ShardRetiredError:
                continue
            return view.snap
    finally:
        view.lock.release()
    raise retries_exhausted(backend, view.key)


def _rebuild(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    names: frozenset[str],
    now: float,
    stamp: tuple[int, float] | None,
) -> Snapshot:
    """The state of ``names``: known runs kept, new records and fences read."""
    known = {r.seq: r for r in snap.records.values() if r.seq is not None}
    seqs = {int(n) for n in names}
    # a lagging LIST can hide an entry while showing a later one: the seqs
    # missing near the end are read directly (a GET sees every landed create)
    top = max(seqs, default=0)
    low = max(snap.top, top - LAG_WINDOW)
    seqs |= set(range(low + 1, top)) - seqs
    bad = {q for q in seqs if f"log {log_name(q)}" in view.quarantined}
    new = sorted(seqs - known.keys() - bad)
    docs = backend.read_many(log_path(view.digest, n) for n in new)
    found = {q: r for q, r in known.items() if log_name(q) in names}
    for seq, doc in zip(new, docs, strict=True):
        if doc is None:
            continue  # retired since listed, or a gap
        where = backend.describe(log_path(view.digest, seq))
        try:
            record = CommitRecord.from_doc(doc, shard=None, dim=view.dim, where=where)
            if record.seq != seq:
                msg = f"{where}: log entry names seq {record.seq}"
                raise CorruptStoreError(msg)
        except CorruptStoreError as err:
            quarantine(view, f"log {log_name(seq)}", err)
            bad.add(seq)
            continue
        found[seq] = record.for_reading()
    records: dict[str, CommitRecord] = {}
    for seq in sorted(found):  # a run published twice (a helper) sits at its first
        records.setdefault(found[seq].shard, found[seq])
    hidden: dict[str, str] = {}
    for record in sorted(records.values(), key=lambda r: r.shard):
        for old in record.supersedes:
            if old in records:
                hidden.setdefault(old, record.shard)
    loaded = {s.record.shard: s for s in snap.shards}

    def load(record: CommitRecord) -> Shard | None:
        try:
            return open_shard(backend, view.digest, record)
        except MissingObjectError as err:
            lost = missing_or_retired(backend, view, record, err.path)
            if isinstance(lost, ShardRetiredError):
                raise lost from None
            quarantine(view, record.shard, lost)
        except CorruptStoreError as err:
            quarantine(view, record.shard, err)
        return None

    runs = [r for s, r in records.items() if s not in hidden]
    opened = backend.map(
        load,
        [r for r in runs if r.shard not in loaded and r.shard not in view.quarantined],
    )
    loaded.update((s.record.shard, s) for s in opened if s is not None)
    visible = sorted(
        (r for r in runs if r.shard not in view.quarantined), key=CommitRecord.order
    )
    # names without a record (being created, or retired since listed) are left
    # out, so the next listing differs and reads them again
    return Snapshot(
        shards=tuple(loaded[r.shard] for r in visible),
        records=records,
        hidden=hidden,
        # entries listed but not read (being created, or retired) are left out,
        # so the next listing differs and reads them again
        listing=frozenset(log_name(q) for q in found.keys() | bad),
        top=max(snap.top, max(found.keys() | bad, default=0)),  # the last read
        listed_at=now,
        stamp=stamp if len(found) + len(bad) == len(names) else None,
    )


def quarantine(view: KeyView, run: str, err: Exception) -> None:
    """Stop serving a run that fails its checks (or an unreadable log entry):
    its rows read as absent (and are recomputed), logged once, counted in
    ``view.quarantined``; ``store verify`` lists it. No single object makes a
    whole key unreadable."""
    with view.quarantine_lock:
        if run in view.quarantined:
            return
        view.quarantined.add(run)
    logger.error("quarantined %s of %s: %s", run, view.key.short(), err)


def drop_quarantined(view: KeyView, run: str, err: Exception) -> None:
    """:func:`quarantine` a run met broken while reading, and take it out of the
    current state (a reader then retries without it)."""
    quarantine(view, run, err)
    with view.lock:
        snap = view.snap
        view.snap = replace(
            snap, shards=tuple(s for s in snap.shards if s.record.shard != run)
        )


def lookup(
    backend: Backend, view: KeyView, snap: Snapshot, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(run position in ``snap``, stored row) of each S32 key; -1 where absent."""
    try:
        return probe(backend, snap.shards, q, view.cache)
    except ChunkError as err:
        raise _index_error(backend, view, err, snap.shards) from None


def sorted_index(
    backend: Backend, view: KeyView, shard: Shard, lo: int, hi: int, cache: BlockCache
) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``lo..hi`` of a run's sorted index: its hashes (S32) and the stored
    row of each (int64)."""
    try:
        return read_sorted(backend, shard, lo, hi, cache)
    except ChunkError as err:
        raise _index_error(backend, view, err, [shard]) from None


def _index_error(
    backend: Backend, view: KeyView, err: ChunkError, runs: Sequence[Shard]
) -> Exception:
    shard = err.path.split("/")[2]
    record = next((s.record for s in runs if s.record.shard == shard), None)
    if err.missing:
        if record is None:  # not a run of this snapshot: cannot be told apart
            return ShardRetiredError(shard)
        return missing_or_retired(backend, view, record, err.path)
    return corrupt(backend, err.path, err.problem, view.digest, shard)


def read_vectors(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    which: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
    dest: np.ndarray,
) -> None:
    """out[dest] = vectors of (run ``which``, stored row ``rows``) (crc-checked)."""
    if not len(which):
        return
    order = np.argsort(which, kind="stable")
    bounds = np.flatnonzero(np.diff(which[order])) + 1
    parts = np.split(order, bounds)

    def run(part: np.ndarray) -> None:
        shard = snap.shards[int(which[part[0]])]
        try:
            read_rows(
                backend, view.digest, shard, rows[part], out, dest[part], view.cache
            )
        except MissingObjectError as err:
            raise missing_or_retired(backend, view, shard.record, err.path) from None

    backend.map(run, parts)


# rows a bulk read resolves per look-up (in sorted order: each reads the blocks
# of its own range of hashes; a look-up holds ~240 bytes a row at its peak, so a
# 2^20-row one was a fill's peak), and bytes of vectors it reads per step
BULK_LOOKUP = 1 << 17
BULK_READ_BYTES = 1 << 24


def read_many(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    digests: np.ndarray,
    out: np.ndarray,
) -> np.ndarray:
    """out[i] = vector of S32 ``digests[i]`` where stored; which were found.

    Linear in the rows asked plus the key's index: the digests are looked up in
    sorted order, a range of hashes at a time (each block read once), then each
    run's rows are read in stored order (each vector chunk read once). Beside
    ``out`` it holds ~20 bytes a digest, and a look-up's ~30 MiB.
    """
    n = len(digests)
    which = np.full(n, -1, np.int32)
    rows = np.zeros(n, np.int64)
    order = argsort_keys(digests)
    for lo in range(0, n, BULK_LOOKUP):
        part = order[lo : lo + BULK_LOOKUP]
        found, at = lookup(backend, view, snap, digests[part])
        which[part], rows[part] = found, at
    del order
    window = max(1, BULK_READ_BYTES // (4 * max(view.dim, 1)))
    for pos, shard in enumerate(snap.shards):
        dest = np.flatnonzero(which == pos)
        dest = dest[np.argsort(rows[dest], kind="stable")]
        for lo in range(0, len(dest), window):
            part = dest[lo : lo + window]
            try:
                read_rows(backend, view.digest, shard, rows[part], out, part)
            except MissingObjectError as err:
                raise missing_or_retired(
                    backend, view, shard.record, err.path
                ) from None
    return which >= 0


def all_keys(backend: Backend, view: KeyView, snap: Snapshot) -> list[np.ndarray]:
    """Every run's hashes in stored order (a whole-key read), in commit order."""
    return backend.map(lambda s: stored_keys(backend, view, s), snap.shards)


def stored_keys(
    backend: Backend, view: KeyView, shard: Shard, lo: int = 0, hi: int | None = None
) -> np.ndarray:
    """The hashes of a run's stored rows ``lo..hi`` (default: all), S32."""
    try:
        return read_keys(backend, view.digest, shard, lo, hi)
    except MissingObjectError as err:
        raise missing_or_retired(backend, view, shard.record, err.path) from None


def adopt(view: KeyView, shard: Shard) -> None:
    """Add a shard this process just committed to the view, without reading it back.

    The new run comes with its fences and filter, made as it was written; the
    other runs are shared with the previous state.
    """
    if shard.fences is None or shard.bloom is None:
        msg = f"shard {shard.record.shard} has no fences and filter to adopt"
        raise ValueError(msg)
    record = shard.record.for_reading()
    shard = replace(shard, record=record)
    assert record.seq is not None
    with view.lock:
        snap = view.snap
        if record.shard in snap.records:  # a refresh listed it meanwhile
            return
        if snap.listing is None or record.seq != snap.top + 1:
            # runs published between this view's listing and ours may come before
            # it: only a listing tells (the view reads it at its next look-up)
            view.snap = replace(snap, listing=None, listed_at=-math.inf)
            return
        view.snap = replace(
            snap,
            shards=tuple(sorted([*snap.shards, shard], key=lambda s: s.record.order())),
            records={**snap.records, record.shard: record},
            listing=snap.listing | {log_name(record.seq)},
            top=record.seq,
            stamp=None,  # our own change: the folder's next mtime is not news
        )


def retries_exhausted(backend: Backend, key: ModelKey) -> StoreError:
    msg = (
        f"shards of {key.short()} kept vanishing while reading {backend.location}: "
        "another process is compacting it; retry when it is done"
    )
    return StoreError(msg)
