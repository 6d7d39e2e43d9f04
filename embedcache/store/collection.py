"""Collection: remove what readers ignore, fenced so nothing committed is lost.

Leftovers are *garbage*, not faults: a killed writer's uncommitted run, a run
superseded by a published merge, or one whose retirement was interrupted. Readers
never look at them. An uncommitted run is claimed with a tombstone before any of
it is deleted (``commits.claim``), and judged dead only on this collector's own
monotonic clock (``lease.Sightings``); a committed run its writer left unpublished
is published (or, a merge merged again since, retired).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store import layout
from embedcache.store.commits import claim, publish, retire
from embedcache.store.layout import CommitRecord, record_path, run_prefix, runs_prefix
from embedcache.store.snapshots import refresh_whole

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from embedcache.store.backend import Backend
    from embedcache.store.commits import Writer
    from embedcache.store.snapshots import KeyView, Snapshot

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Leftover:
    """One run readers ignore, and whether it may be removed now."""

    run: str
    paths: tuple[str, ...]  # its commit record (if any) and its run folder
    removable: bool
    superseded: bool = False  # committed, and replaced by a merged run
    # merged away, and still readable from an older snapshot: not garbage yet
    in_grace: bool = False


def merged_for(writer: Writer, run: str) -> float:
    """How long this collector has seen ``run`` merged away (superseded by a
    published run), on its own monotonic clock: 0 at the first sighting."""
    assert writer.sightings is not None
    return writer.sightings.unchanged_for(f"merged {run}", None)


def retire_merged(backend: Backend, view: KeyView, writer: Writer) -> list[str]:
    """Delete the key's runs merged away that this process has seen so for its
    whole grace (no listing: the view's own state); the runs deleted. Best
    effort (after a put): a failure is logged, and the next collection retries."""
    snap = view.snap
    due = sorted(r for r in snap.hidden if merged_for(writer, r) > writer.grace_seconds)
    if due:
        try:
            retire(backend, view.digest, due, log_seqs(snap, due))
        except Exception as err:  # noqa: BLE001 (best effort: collected later)
            logger.warning("could not delete runs merged away: %s", err)
            return []
        assert writer.sightings is not None
        writer.sightings.forget(f"merged {r}" for r in due)
        view.forget_listing()
        logger.info("deleted %d runs of %s merged away", len(due), view.key.short())
    return due


def log_seqs(snap: Snapshot, runs: Iterable[str]) -> list[int]:
    """The log entries that published ``runs``."""
    records = [snap.records.get(r) for r in runs]
    return sorted(r.seq for r in records if r is not None and r.seq is not None)


def find_garbage(backend: Backend, view: KeyView, writer: Writer) -> list[Leftover]:
    """Every leftover under one key (the view must be fresh).

    A run merged away stays until this collector has seen it so for
    ``writer.grace_seconds`` (readers of an older snapshot may be reading it).
    An uncommitted run is dead once this collector has seen it, and its session's
    lease, unchanged for ``seconds + margin_seconds`` of its own monotonic clock
    (``lease.Sightings``): no two hosts' clocks are compared. A collector that
    has just started therefore judges nothing dead; a long-lived one (a service,
    a writer's later commits) collects what it saw sit still.
    """
    policy, seen = writer.lease.policy, writer.sightings
    assert seen is not None
    refresh_whole(backend, view)
    prefix = runs_prefix(view.digest) + "/"
    listed: dict[str, list[tuple[str, int, float]]] = {}
    for entry in backend.list(prefix):
        name, _, rest = entry.path[len(prefix) :].partition("/")
        if rest:
            listed.setdefault(name, []).append((rest, entry.size, entry.modified))
    # a local folder may hold only obstore's hidden staging files (a writer killed
    # during its first write): it is judged by its lease alone
    folders, _ = backend.list_dir(prefix)
    for name in set(folders) - listed.keys():
        listed[name] = []
    # a folder named in a committed record's supersedes whose own record is gone
    # was retired half way (records go first): never a run still being written
    retired = {old for r in view.records.values() for old in r.supersedes}
    uncommitted = sorted(
        n for n in listed if n not in view.records and n not in view.hidden
    )
    leases = _lease_docs(backend, {layout.session_of(n) for n in uncommitted} - {None})
    out = []
    for name in sorted(listed.keys() | view.hidden.keys()):
        folder = (run_prefix(view.digest, name),) if name in listed else ()
        if name in view.hidden:  # merged away: an older snapshot may still read it
            paths = (record_path(view.digest, name), *folder)
            due = merged_for(writer, name) > writer.grace_seconds
            out.append(Leftover(name, paths, due, in_grace=not due))
        elif name in retired and name not in view.records:
            paths = (record_path(view.digest, name), *folder)
            out.append(Leftover(name, paths, True, superseded=True))
        elif name not in view.records:  # never committed (or claimed already)
            lease = leases.get(layout.session_of(name) or "")
            still = seen.unchanged_for(f"run {name}", (lease, tuple(listed[name])))
            dead = still > policy.dead_after and name not in writer.writing
            out.append(Leftover(name, folder, dead))
    return out


def _lease_docs(backend: Backend, sessions: Iterable[str]) -> dict[str, bytes]:
    """The lease document of each session that has one."""
    sessions = sorted(sessions)
    paths = [layout.lease_path(s) for s in sessions]
    docs = backend.read_many(paths)
    return {s: doc for s, doc in zip(sessions, docs, strict=True) if doc is not None}


def collect_leases(backend: Backend, writer: Writer) -> None:
    """Remove leases this collector saw unchanged for a whole lease and margin."""
    sessions, _ = backend.list_dir(layout.LEASES)
    docs = _lease_docs(backend, set(sessions) - {writer.lease.name})
    seen, policy = writer.sightings, writer.lease.policy
    assert seen is not None
    gone = [
        s
        for s, doc in docs.items()
        if seen.unchanged_for(f"lease {s}", doc) > policy.dead_after
    ]
    # a folder without a lease document is a lease being deleted, or not ours
    backend.delete_prefixes(f"{layout.LEASES}/{s}" for s in gone)
    seen.forget(f"lease {s}" for s in gone)
    if gone:
        logger.info("removed %d expired writer leases", len(gone))


def collect_pass(
    backend: Backend, views: Iterable[KeyView], writer: Writer
) -> list[str]:
    """One collection of the keys of ``views`` (fresh) and of the leases: the
    runs removed, as ``<run> of key <digest>``. What it judges dead rests on what
    this ``writer`` saw before (``lease.Sightings``): a first pass removes only
    what needs no waiting; a long-lived collector calls it again and again."""
    removed = []
    for view in views:
        gone = collect(backend, view, writer, find_garbage(backend, view, writer))
        removed += [f"{run} of key {view.digest[:12]}" for run in gone]
    collect_leases(backend, writer)
    return removed


def collect(
    backend: Backend, view: KeyView, writer: Writer, leftovers: Iterable[Leftover]
) -> list[str]:
    """Remove the removable leftovers, an uncommitted run only once claimed; the
    runs removed."""
    leftovers = [lo for lo in leftovers if lo.removable]
    superseded = [lo.run for lo in leftovers if lo.run in view.hidden or lo.superseded]
    retire(backend, view.digest, superseded, log_seqs(view.snap, superseded))
    uncommitted = [lo.run for lo in leftovers if lo.run not in superseded]
    # the fence: a tombstone where the record would go, so a paused writer's late
    # commit fails instead of publishing a run whose objects are going
    claimed = backend.map(
        lambda s: claim(backend, view.digest, s, writer.writer_id), uncommitted
    )
    dead = [s for s, ok in zip(uncommitted, claimed, strict=True) if ok]
    backend.delete_prefixes(run_prefix(view.digest, s) for s in dead)
    # committed, but its writer stopped before it won a place in the log: it is
    # published now (its record is there, its objects durable), or retired if it
    # is a merge whose runs a published run merged meanwhile
    for run in [s for s, ok in zip(uncommitted, claimed, strict=True) if not ok]:
        _roll_forward(backend, view, run)
    assert writer.sightings is not None
    writer.sightings.forget(f"run {s}" for s in uncommitted)
    if leftovers:
        logger.info(
            "removed %d leftover runs of %s",
            len(superseded) + len(dead),
            view.key.short(),
        )
    return sorted([*superseded, *dead])


def _roll_forward(backend: Backend, view: KeyView, run: str) -> None:
    """Finish a committed run its writer left unpublished: publish it, unless it
    is a merge every run of which is superseded by a published run already."""
    path = record_path(view.digest, run)
    doc = backend.read_or_none(path)
    if doc is None:
        return  # retired meanwhile
    try:
        record = CommitRecord.from_doc(
            doc, run=run, dim=view.dim, where=backend.describe(path)
        )
    except (CorruptStoreError, StoreError) as err:
        logger.warning("run %s has a record that cannot be published: %s", run, err)
        return
    if _merged_already(backend, view, record):
        # never published, so never served; its rows are held by the published
        # runs that superseded its inputs: published, it would only duplicate them
        retire(backend, view.digest, [run])
        logger.info("retired run %s, a merge of runs merged again meanwhile", run)
        return
    publish(backend, view.digest, record, start=view.snap.top + 1)
    logger.info("published run %s, left unpublished by its writer", run)


def _merged_already(backend: Backend, view: KeyView, record: CommitRecord) -> bool:
    """True if ``record`` merges runs and each of them is named in a published
    record's supersedes (that run holds its winning rows) or was retired (its
    record gone or a tombstone: retiring follows a superseder's publication)."""
    if not record.supersedes:
        return False
    merged = {old for r in view.records.values() for old in r.supersedes}
    rest = [s for s in record.supersedes if s not in merged]
    if any(s in view.records for s in rest):
        return False  # still visible: the run takes its place
    docs = backend.read_many([record_path(view.digest, s) for s in rest])
    return all(doc is None or layout.is_tombstone(doc) for doc in docs)


def watch(
    collect_once: Callable[[], list[str]],
    *,
    every: float,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[list[str]]:
    """The long-lived collector: ``collect_once`` (``EmbeddingStore.collect``)
    every ``every`` seconds, ``rounds`` times or for ever; yields what each pass
    removed. One process keeps its sightings from pass to pass, so it removes an
    abandoned run once it has itself seen the run's lease lapse (a one-shot
    process, having seen nothing before, judges nothing dead)."""
    done = 0
    while rounds is None or done < rounds:
        if done:
            sleep(every)
        yield collect_once()
        done += 1
