"""The commit protocol: claim a run, publish it in the key's log, retire runs.

A writer fills a new run completely and makes it durable, then claims it with
put-if-absent of its commit record at ``commits/<run>``; a collector that judged
the run dead claims it first with a tombstone there, so exactly one of them wins.
A claimed (committed) run is then published with put-if-absent of ``log/<seq>``
at the first free seq: the storage, not a clock, orders the key's runs. Retiring
deletes log entries first (readers stop seeing the runs), then claims, then
objects, so a reader that finds an object missing can tell retired from lost.
See ``docs/store-protocol.md``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from embedcache.errors import StoreError
from embedcache.store.layout import (
    HOST,
    RUN_ATTR,
    RUN_KIND,
    SCHEMA_VERSION,
    CommitRecord,
    commits_prefix,
    is_tombstone,
    log_name,
    log_path,
    log_prefix,
    new_run_name,
    record_path,
    run_prefix,
    tombstone_doc,
)
from embedcache.store.lease import Sightings
from embedcache.store.run_reads import Run
from embedcache.store.run_writes import write_run

if TYPE_CHECKING:
    from collections.abc import Iterable

    from embedcache.store.backend import Backend
    from embedcache.store.lease import Lease
    from embedcache.store.run_writes import RunRows
    from embedcache.store.snapshots import KeyView

logger = logging.getLogger(__name__)

# a record names at most this many runs its run lacks, the largest: a key of
# many runs would otherwise hold records that grow with the square of its runs
MAX_LACKS = 256


# a commit whose run a collector claimed (or whose lease was lost) is written
# again under a new run name at most this many times
COMMIT_ATTEMPTS = 3


class RunClaimedError(StoreError):
    """A run's commit failed cleanly: a collector claimed it (a tombstone is where
    its record would go), or its session's lease was lost, so one may have."""


@dataclass(slots=True)
class Writer:
    """Who writes: names this session's runs, holds its lease while it writes them,
    remembers those in progress, and what it saw of other writers' leases."""

    writer_id: str
    lease: Lease
    writing: set[str] = field(default_factory=set)
    sightings: Sightings | None = None
    # how long this collector leaves a run merged away readable, on its own clock:
    # longer than the longest read of an older snapshot (the store's refresh
    # interval plus the lease margin)
    grace_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.sightings is None:
            self.sightings = Sightings(self.lease.policy.clock)

    def owner_attrs(self) -> dict[str, Any]:
        return {
            "kind": RUN_KIND,
            "schema_version": SCHEMA_VERSION,
            "writer": self.writer_id,
            "session": self.lease.name,
            "host": HOST,
            "pid": os.getpid(),
            "created_ns": time.time_ns(),
        }

    def fresh_session(self) -> None:
        """Go on under a new session if this one's lease was ever lost."""
        if self.lease.lost:
            old, self.lease = self.lease, self.lease.successor()
            old.close()
            logger.warning(
                "writer session %s lost its lease; going on as %s",
                old.name,
                self.lease.name,
            )

    def close(self) -> None:
        self.lease.close()

    def close_when_dropped(self) -> None:
        """The store's finaliser: :meth:`close`, off the main thread in a thread of
        its own. A garbage collection runs it on whatever thread allocates, an
        in-process server's accept loop too, where a blocking close would wait on
        requests only that thread can accept."""
        if threading.current_thread() is threading.main_thread():
            self.close()
        else:
            threading.Thread(target=self.close, name="close-lease", daemon=True).start()


def commit_run(
    backend: Backend,
    view: KeyView,
    writer: Writer,
    rows: RunRows,
    *,
    supersedes: Iterable[str] = (),
    place: int | None = None,
    level: int = 0,
    aliases: Iterable[str] = (),
    lacks: Iterable[str] = (),
    retires: tuple[tuple[int, int], ...] = (),
    kernels: Iterable[str] = (),
) -> Run:
    """Write a complete run, make it durable, then publish it with put-if-absent.

    ``lacks``: runs known to hold none of its hashes (``CommitRecord.lacks``).
    ``kernels``: what computed its vectors (``CommitRecord.kernels``).
    A run a collector claimed first (or whose lease was lost) is written again
    under a new name (``rows`` is handed over again).

    The run returned holds its fences and filter (for ``snapshots.adopt``), not its
    hashes.
    """
    err: RunClaimedError | None = None
    for _ in range(COMMIT_ATTEMPTS):
        writer.fresh_session()
        try:
            return _commit_once(
                backend,
                view,
                writer,
                rows,
                supersedes=supersedes,
                place=place,
                level=level,
                aliases=aliases,
                lacks=lacks,
                retires=retires,
                kernels=kernels,
            )
        except RunClaimedError as claimed:
            logger.warning("%s; writing it again under a new name", claimed)
            err = claimed
    assert err is not None
    raise err


def _commit_once(
    backend: Backend,
    view: KeyView,
    writer: Writer,
    rows: RunRows,
    *,
    supersedes: Iterable[str],
    place: int | None,
    level: int,
    aliases: Iterable[str],
    lacks: Iterable[str],
    retires: tuple[tuple[int, int], ...],
    kernels: Iterable[str] = (),
) -> Run:
    run = new_run_name(writer.lease.name)
    prefix = run_prefix(view.digest, run)
    path = record_path(view.digest, run)
    writer.lease.hold()  # before the first object: a collector sees a live writer
    writer.writing.add(run)
    record: CommitRecord | None = None
    try:
        files, vectors, fences, bloom = write_run(
            backend,
            prefix,
            attrs=writer.owner_attrs(),
            dim=view.dim,
            rows=rows,
        )
        backend.sync(f"{prefix}/{rel}" for rel in files)
        now = time.time_ns()
        record = CommitRecord(
            run=run,
            writer=writer.writer_id,
            n_rows=rows.n,
            dim=view.dim,
            order_ns=now,  # for people: the order is the log's
            place=place,
            level=level,
            committed_ns=now,
            supersedes=tuple(sorted(supersedes)),
            aliases=tuple(sorted(set(aliases))),
            files=files,
            lacks=_largest(set(lacks), view),
            retires=retires,
            kernels=tuple(sorted(set(kernels))),
        )
        if writer.lease.lapsed():
            raise _lapsed(backend, writer, prefix)
        if not backend.create(path, record.to_doc()):
            found = backend.read_or_none(path)
            if found is not None and is_tombstone(found):
                msg = (
                    f"run {run} was claimed by a collector before its commit "
                    f"({backend.describe(path)} holds a tombstone)"
                )
                raise RunClaimedError(msg)
            # run names carry 48 random bits: only a reused name gets here, and
            # the objects under it may be the winner's, so they are left alone
            msg = (
                f"{backend.describe(path)} exists already: another writer committed "
                f"a run of the same name. Give each writer its own writer_id."
            )
            record = None
            raise StoreError(msg)
    except BaseException as err:
        if record is None:  # no record was sent: nothing can commit the run
            _delete_quietly(backend, prefix)
            if isinstance(err, Exception) and _claimed(backend, path):
                # its objects vanished under it: a collector claimed it
                msg = f"run {run} was claimed by a collector while it was written"
                raise RunClaimedError(msg) from err
            raise
        claimed: bool | None = None
        try:
            claimed = claim(backend, view.digest, run, writer.writer_id)
        except Exception as lost:  # noqa: BLE001 (the first error is the one to tell)
            # the create may still land: the run stays, a collector claims it later
            logger.warning("could not claim the failed run %s: %s", run, lost)
        if claimed is None:
            raise
        if not claimed:
            if not isinstance(err, Exception):
                raise
            # the record landed after all (a lost answer): the commit stands
            logger.warning(
                "%s after the commit of %s landed: the commit stands", err, run
            )
        else:
            _delete_quietly(backend, prefix)
            raise
    finally:
        writer.writing.discard(run)
        writer.lease.release()
    # committed: the run is the writer's for good; now its place in the key's order
    record = publish(backend, view.digest, record, start=view.snap.top + 1)
    return Run(
        record=record,
        prefix=prefix,
        vectors=vectors,
        fences=fences,
        bloom=bloom,
    )


def publish(
    backend: Backend, digest: str, record: CommitRecord, *, start: int
) -> CommitRecord:
    """Give a committed run the next free place in the key's log: put-if-absent
    of ``log/<seq>`` holding its record, from ``start`` up; the storage decides
    who gets which seq, so the order is the order the claims landed in, whatever
    the writers' clocks say. Returns the record with its seq.

    A seq is never used twice: retiring deletes log entries, but only ones below
    a later entry (the merged run's), so the claim starts past the last entry
    listed now, not in a hole a view remembers as free.
    """
    names, _ = backend.list_dir(log_prefix(digest))
    top = max((int(n) for n in names if n.isdigit()), default=0)
    seq = max(start, top + 1, 1)
    while True:
        entry = replace(record, seq=seq)
        if backend.create(log_path(digest, seq), entry.to_doc()):
            return entry
        found = backend.read_or_none(log_path(digest, seq))
        if found is not None and _names_run(found, record.run):
            return entry  # published already (a helper, a retried request)
        seq += 1


def _names_run(doc: bytes, run: str) -> bool:
    try:
        return json.loads(doc)["attributes"]["embedcache"][RUN_ATTR] == run
    except (ValueError, KeyError, TypeError):
        return False


def claim(backend: Backend, digest: str, run: str, collector: str) -> bool:
    """Fence a run off before deleting any of it: put a tombstone (if absent)
    where its commit record would go.

    True if the run is now claimed (by this call or an earlier one): a late
    commit of it fails, and its objects may go. False if it was committed (or
    its record is gone since, retired): leave it to ``retire``.
    """
    path = record_path(digest, run)
    if backend.create(path, tombstone_doc(run, collector)):
        return True
    found = backend.read_or_none(path)
    return found is not None and is_tombstone(found)


def _claimed(backend: Backend, path: str) -> bool:
    try:
        found = backend.read_or_none(path)
    except Exception:  # noqa: BLE001 (the first error is the one to tell)
        return False
    return found is not None and is_tombstone(found)


def _delete_quietly(backend: Backend, prefix: str) -> None:
    with contextlib.suppress(Exception):
        backend.delete_prefix(prefix)


def _largest(names: set[str], view: KeyView) -> tuple[str, ...]:
    """At most :data:`MAX_LACKS` of ``names``, the runs of the most rows first
    (names the view no longer holds last), sorted."""
    if len(names) > MAX_LACKS:
        records = view.snap.records
        rows = {n: records[n].n_rows if n in records else -1 for n in names}
        names = set(sorted(names, key=lambda n: (-rows[n], n))[:MAX_LACKS])
    return tuple(sorted(names))


def _lapsed(backend: Backend, writer: Writer, prefix: str) -> StoreError:
    msg = (
        f"the lease of writer {writer.lease.name} was not renewed for "
        f"{writer.lease.policy.seconds:g} s while it wrote {backend.describe(prefix)}, "
        "so garbage collection may have claimed the run; it was not committed"
    )
    return RunClaimedError(msg)


def retire(
    backend: Backend, digest: str, runs: Iterable[str], seqs: Iterable[int] = ()
) -> None:
    """Delete superseded runs: their log entries (``seqs``) first, so readers stop
    seeing them, then every claim, then the objects."""
    runs = list(runs)
    backend.delete_many(log_path(digest, seq) for seq in seqs)
    if backend.local is not None:
        backend.delete_prefixes(f"{log_prefix(digest)}/{log_name(seq)}" for seq in seqs)
    backend.delete_many(record_path(digest, run) for run in runs)
    backend.delete_prefixes(run_prefix(digest, run) for run in runs)
    if backend.local is not None:  # a record folder may hold staging leftovers
        backend.delete_prefixes(f"{commits_prefix(digest)}/{s}" for s in runs)
