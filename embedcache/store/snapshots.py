"""Each key's snapshots: what a reader sees of a key, immutable and swapped whole.

A process keeps one :class:`KeyView` per model key. Its :class:`Snapshot` (the
visible runs in commit order, their records, the superseded ones) is replaced under
the view's short lock and read outside any lock; ``refresh`` lists the key's log
again when the snapshot is older than the caller allows, and ``adopt`` adds a run
this process just committed without reading it back. A run that fails its checks
is quarantined here: left out of every later snapshot of this process.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store.layout import CommitRecord, log_name, log_path, log_prefix
from embedcache.store.run_reads import MissingObjectError, corrupt, open_run
from embedcache.store.runs import BlockCache, Run

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from embedcache.specs import ModelKey
    from embedcache.store.backend import Backend

logger = logging.getLogger(__name__)

RETRIES = 5
# seqs below a listing's last one read directly when the listing lacks them
LAG_WINDOW = 64
# log entries a cold reader reads at a time, newest first: the live merges among
# them name the older entries it need not read
READ_BATCH = 32


class RunRetiredError(Exception):
    """A run vanished because another process retired it; refresh and retry."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One immutable state of a key: what readers use, outside any lock.

    A new state replaces the old under the view's short lock; a reader keeps the one
    it took for its whole call.
    """

    runs: tuple[Run, ...] = ()  # visible runs, in commit order
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
    # read every log entry, the runs merged away too (a collector must see them
    # to delete them once their grace is over); readers skip those
    whole_log: bool = False

    # the current state's parts (maintenance reads these under the writer's lock)
    @property
    def runs(self) -> tuple[Run, ...]:
        return self.snap.runs

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
        return tuple(sorted({a for s in self.runs for a in s.record.aliases}))

    @property
    def kernels(self) -> tuple[str, ...]:
        """What computed the visible runs' vectors (canonical JSON objects)."""
        return tuple(sorted({k for s in self.runs for k in s.record.kernels}))

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
        return RunRetiredError(record.run)
    return corrupt(backend, path, "object is missing", view.digest, record.run)


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
    """The view's state brought up to the committed runs, if older than ``max_age``.

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
            except RunRetiredError:
                continue
            return view.snap
    finally:
        view.lock.release()
    raise retries_exhausted(backend, view.key)


def refresh_whole(backend: Backend, view: KeyView) -> Snapshot:
    """:func:`refresh`, reading from now on every log entry, those of runs merged
    away too: what a collector judges must include what readers skip."""
    if not view.whole_log:
        view.whole_log = True
        view.forget_listing()
    return refresh(backend, view)


def _rebuild(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    names: frozenset[str],
    now: float,
    stamp: tuple[int, float] | None,
) -> Snapshot:
    """The state of ``names``: known runs kept, new records and fences read.

    Entries are read newest first, and an entry a merge read here replaced
    (``CommitRecord.retires``) is not read at all (``view.whole_log`` aside): its
    run is merged away either way, and a key filled by many commits costs a cold
    reader its few live merges, not its whole history.
    """
    known = {r.seq: r for r in snap.records.values() if r.seq is not None}
    seqs = {int(n) for n in names}
    found = {q: r for q, r in known.items() if log_name(q) in names}
    bad = {q for q in seqs if f"log {log_name(q)}" in view.quarantined}
    unread = sorted(seqs - known.keys() - bad, reverse=True)
    covered: set[int] = set()
    while True:
        # a merge known already (or read in the last batch) spares its entries;
        # a collector reads them all (it deletes those runs, entries first)
        skip = (
            set()
            if view.whole_log
            else {q for q in unread if _replaced(found.values(), q)}
        )
        covered |= skip
        unread = [q for q in unread if q not in skip]
        if not unread:
            break
        batch = unread if view.whole_log else unread[:READ_BATCH]
        _read_entries(backend, view, batch, found, bad)
        unread = unread[len(batch) :]
    # a lagging LIST can hide an entry while showing a later one: the seqs
    # missing near the end are read directly (a GET sees every landed create),
    # save those a merge read here says it replaced (retired, not hidden)
    top = max(seqs, default=0)
    gaps = set(range(max(snap.top, top - LAG_WINDOW) + 1, top)) - seqs - known.keys()
    gaps = {q for q in gaps - bad if not _replaced(found.values(), q)}
    _read_entries(backend, view, sorted(gaps), found, bad)
    records: dict[str, CommitRecord] = {}
    for seq in sorted(found):  # a run published twice (a helper) sits at its first
        records.setdefault(found[seq].run, found[seq])
    hidden = merged_away(records)
    loaded = {s.record.run: s for s in snap.runs}

    def load(record: CommitRecord) -> Run | None:
        try:
            return open_run(backend, view.digest, record)
        except MissingObjectError as err:
            lost = missing_or_retired(backend, view, record, err.path)
            if isinstance(lost, RunRetiredError):
                raise lost from None
            quarantine(view, record.run, lost)
        except CorruptStoreError as err:
            quarantine(view, record.run, err)
        return None

    runs = [r for s, r in records.items() if s not in hidden]
    opened = backend.map(
        load,
        [r for r in runs if r.run not in loaded and r.run not in view.quarantined],
    )
    loaded.update((s.record.run, s) for s in opened if s is not None)
    visible = sorted(
        (r for r in runs if r.run not in view.quarantined), key=CommitRecord.order
    )
    # names without a record (being created, or retired since listed) are left
    # out, so the next listing differs and reads them again
    return Snapshot(
        runs=tuple(loaded[r.run] for r in visible),
        records=records,
        hidden=hidden,
        # entries listed but not read (being created, or retired) are left out,
        # so the next listing differs and reads them again
        listing=frozenset(log_name(q) for q in found.keys() | bad | covered),
        top=max(snap.top, max(found.keys() | bad | covered, default=0)),
        listed_at=now,
        stamp=stamp if len(found) + len(bad) + len(covered) == len(names) else None,
    )


def _replaced(records: Iterable[CommitRecord], seq: int) -> bool:
    """Whether one of ``records`` (a merge) replaced log entry ``seq``'s run."""
    return any(r.replaced(seq) for r in records if r.retires)


def _read_entries(
    backend: Backend,
    view: KeyView,
    seqs: list[int],
    found: dict[int, CommitRecord],
    bad: set[int],
) -> None:
    """Read log entries ``seqs`` into ``found`` (absent ones: retired since
    listed, or a gap); an unreadable one is quarantined into ``bad``."""
    docs = backend.read_many(log_path(view.digest, n) for n in seqs)
    for seq, doc in zip(seqs, docs, strict=True):
        if doc is None:
            continue
        where = backend.describe(log_path(view.digest, seq))
        try:
            record = CommitRecord.from_log_entry(
                doc, seq=seq, dim=view.dim, where=where
            )
        except CorruptStoreError as err:
            quarantine(view, f"log {log_name(seq)}", err)
            bad.add(seq)
            continue
        found[seq] = record.for_reading()


def merged_away(records: Mapping[str, CommitRecord]) -> dict[str, str]:
    """The published runs a reader skips, each with the run that holds its rows:
    those a published run supersedes, and a merge that lost a race (two writers
    merged the same runs: the later published of the two, whose inputs an
    earlier-ordered merge merged as well, holds nothing the first does not
    serve). Collection deletes them after the grace."""
    hidden: dict[str, str] = {}
    for record in sorted(records.values(), key=lambda r: r.run):
        for old in record.supersedes:
            if old in records:
                hidden.setdefault(old, record.run)
    # a run whose entry a merge replaced (``retires``), even where that merge no
    # longer names it: readers that skip such entries and those that read them
    # see the same runs
    replacing = sorted((r for r in records.values() if r.retires), key=lambda r: r.run)
    for record in records.values():
        if record.seq is not None and record.run not in hidden:
            by = next((m for m in replacing if m.replaced(record.seq)), None)
            if by is not None:
                hidden[record.run] = by.run
    merges = sorted(
        (r for r in records.values() if r.supersedes and r.run not in hidden),
        key=CommitRecord.order,
    )
    for i, late in enumerate(merges):
        inputs = set(late.supersedes)
        for early in merges[:i]:
            if early.run not in hidden and inputs <= set(early.supersedes):
                hidden[late.run] = early.run
                break
    return hidden


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


def drop_quarantined(view: KeyView, err: CorruptStoreError) -> None:
    """:func:`quarantine` the run ``err`` names, met broken while reading, and take
    it out of the current state (a reader then retries without it); re-raise
    ``err`` if it names no run."""
    run = getattr(err, "run", None)
    if run is None:
        raise err
    quarantine(view, run, err)
    with view.lock:
        snap = view.snap
        view.snap = replace(
            snap, runs=tuple(s for s in snap.runs if s.record.run != run)
        )


def adopt(view: KeyView, run: Run) -> None:
    """Add a run this process just committed to the view, without reading it back.

    The new run comes with its fences and filter, made as it was written; the
    other runs are shared with the previous state.
    """
    if run.fences is None or run.bloom is None:
        msg = f"run {run.record.run} has no fences and filter to adopt"
        raise ValueError(msg)
    record = run.record.for_reading()
    run = replace(run, record=record)
    assert record.seq is not None
    with view.lock:
        snap = view.snap
        if record.run in snap.records:  # a refresh listed it meanwhile
            return
        if snap.listing is None or record.seq != snap.top + 1:
            # runs published between this view's listing and ours may come before
            # it: only a listing tells (the view reads it at its next look-up)
            view.snap = replace(snap, listing=None, listed_at=-math.inf)
            return
        # a merged run hides the runs it supersedes (they stay for older snapshots)
        hidden = {**snap.hidden}
        for old in record.supersedes:
            if old in snap.records:
                hidden.setdefault(old, record.run)
        runs = [s for s in snap.runs if s.record.run not in hidden]
        view.snap = replace(
            snap,
            runs=tuple(sorted([*runs, run], key=lambda s: s.record.order())),
            records={**snap.records, record.run: record},
            hidden=hidden,
            listing=snap.listing | {log_name(record.seq)},
            top=record.seq,
            stamp=None,  # our own change: the folder's next mtime is not news
        )


def retries_exhausted(backend: Backend, key: ModelKey) -> StoreError:
    msg = (
        f"runs of {key.short()} kept vanishing while reading {backend.location}: "
        "another process is compacting it; retry when it is done"
    )
    return StoreError(msg)
