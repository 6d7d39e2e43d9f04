"""Garbage collection and compaction: merge shards, remove what readers ignore.

Leftovers are *garbage*, not faults: a killed writer's uncommitted shard, or a
superseded shard whose retirement was interrupted. Readers never look at them.
``compact`` merges a key's shards into one committed shard that supersedes them,
retires them, and removes garbage whose writer's lease expired more than the
margin ago (see ``lease``; a shard without a lease: its newest object is older
than the lease plus the margin), and leases that expired as long ago.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store.commits import claim, commit_shard, publish, retire
from embedcache.store.layout import (
    LEASES,
    CommitRecord,
    is_tombstone,
    lease_path,
    record_path,
    session_of,
    shard_prefix,
    shards_prefix,
)
from embedcache.store.merged_runs import merge_cache, merged_rows, winning_rows
from embedcache.store.views import (
    RETRIES,
    ShardRetiredError,
    adopt,
    refresh,
    retries_exhausted,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from embedcache.store.backend import Backend
    from embedcache.store.commits import Writer
    from embedcache.store.views import KeyView, Snapshot

logger = logging.getLogger(__name__)

# a writer merges the key's runs once this many are visible at one level, so
# many short writers, or a long run that commits every batch, leave few runs
AUTO_MERGE = 4


@dataclass(frozen=True, slots=True)
class Leftover:
    """One shard readers ignore, and whether it may be removed now."""

    shard: str
    paths: tuple[str, ...]  # its commit record (if any) and its shard folder
    removable: bool
    superseded: bool = False  # committed, and replaced by a merged run


def merge(
    backend: Backend, view: KeyView, writer: Writer, shard_ids: Iterable[str]
) -> CommitRecord | None:
    """Commit one shard holding the winning rows of ``shard_ids``; retire them.

    The merged run keeps the rows in the chosen shards' stored order (whole-key
    reads stay sequential) and only those that win in the whole key: a hash an
    earlier, unchosen shard holds stays served by that shard. Streamed
    (``merged_runs``): its memory is a few bytes a row, not the keys. A run every
    chosen run lacks (``CommitRecord.lacks``) is not looked in, and the merged
    run lacks it too, as it lacks the runs before it.
    """
    snap = refresh(backend, view)
    chosen = set(shard_ids) & {s.record.shard for s in snap.shards}
    # shards hidden by a chosen one go too, or they would reappear once their
    # superseder is retired
    grew = True
    while grew:
        extra = {old for old, sup in snap.hidden.items() if sup in chosen} - chosen
        chosen |= extra
        grew = bool(extra)
    if not chosen:  # merged away by another process meanwhile
        return None
    positions = [i for i, s in enumerate(snap.shards) if s.record.shard in chosen]
    lacked = [frozenset(snap.records[s].lacks) for s in chosen]
    lacked_by_all = frozenset.intersection(*lacked) if lacked else frozenset()
    # winning_rows drops the rows an earlier unchosen run holds: the merged run,
    # at its earliest chosen run's place, lacks every run before that
    first = positions[0] if positions else 0
    before = frozenset(s.record.shard for s in snap.shards[:first])
    cache = merge_cache(len(positions))
    kept = winning_rows(backend, view, snap, positions, cache, skip=lacked_by_all)
    merged = commit_shard(
        backend,
        view,
        writer,
        merged_rows(backend, view, snap, positions, kept, cache),
        supersedes=chosen,
        # the merged run takes the earliest merged run's place: what readers were
        # served from any of them stays what they are served
        place=min(snap.records[s].order()[0] for s in chosen),
        level=1 + max(snap.records[s].level for s in chosen),
        aliases={a for s in chosen for a in snap.records[s].aliases},
        kernels={k for s in chosen for k in snap.records[s].kernels},
        lacks=(before | lacked_by_all) - chosen,
    )
    # readers in this process move to the merged run before the old ones go (its
    # fences and filter as written: no read back, no block read of it for a hash
    # it lacks)
    adopt(view, merged)
    refresh(backend, view)
    retire(backend, view.digest, sorted(chosen), _seqs(snap, chosen))
    refresh(backend, view)
    return merged.record


def _seqs(snap: Snapshot, runs: Iterable[str]) -> list[int]:
    """The log entries that published ``runs``."""
    records = [snap.records.get(r) for r in runs]
    return sorted(r.seq for r in records if r is not None and r.seq is not None)


def merge_levels(
    backend: Backend, view: KeyView, writer: Writer, *, fan_in: int
) -> None:
    """Merge the key's visible runs level by level once ``fan_in`` of one level
    are visible, whoever wrote them: a run's level is in its record, so many
    short-lived writers leave a number of runs logarithmic in the rows.

    Best effort: a failed merge is logged and leaves the runs as they are.
    """
    if fan_in < 2:
        return
    snap = view.snap if view.snap.listing is not None else refresh(backend, view)
    for _ in range(MAX_MERGES):
        by_level: dict[int, list[str]] = {}
        for shard in snap.shards:
            by_level.setdefault(shard.record.level, []).append(shard.record.shard)
        full = [lv for lv, runs in sorted(by_level.items()) if len(runs) >= fan_in]
        if not full:
            return
        try:
            merged = merge(backend, view, writer, by_level[full[0]])
        except Exception as err:  # noqa: BLE001 (best effort: the put stands)
            logger.warning("could not merge runs of %s: %s", view.key.short(), err)
            return
        if merged is None:
            return
        snap = view.snap


# merges one merge_levels call makes at most (each lifts a level)
MAX_MERGES = 8


def compact(backend: Backend, view: KeyView, writer: Writer) -> None:
    """Merge all of a key's shards into one, then remove its dead garbage."""
    refresh(backend, view)
    for _ in range(RETRIES):
        if len(view.shards) <= 1 and not view.hidden:
            break
        try:
            merged = merge(backend, view, writer, [s.record.shard for s in view.shards])
        except ShardRetiredError:  # another process compacted meanwhile
            view.forget_listing()
            refresh(backend, view)
            continue
        if merged is not None:
            logger.info("compacted %s into run %s", view.key.short(), merged.shard)
        break
    else:
        raise retries_exhausted(backend, view.key)
    collect(backend, view, writer, find_garbage(backend, view, writer))
    collect_leases(backend, writer)
    refresh(backend, view)


def find_garbage(backend: Backend, view: KeyView, writer: Writer) -> list[Leftover]:
    """Every leftover under one key (the view must be fresh).

    An uncommitted run is dead once this collector has seen it, and its session's
    lease, unchanged for ``seconds + margin_seconds`` of its own monotonic clock
    (``lease.Sightings``): no two hosts' clocks are compared. A collector that
    has just started therefore judges nothing dead; a long-lived one (a service,
    a writer's later commits) collects what it saw sit still.
    """
    policy, seen = writer.lease.policy, writer.sightings
    assert seen is not None
    prefix = shards_prefix(view.digest) + "/"
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
    leases = _lease_docs(backend, {session_of(n) for n in uncommitted} - {None})
    out = []
    for name in sorted(listed.keys() | view.hidden.keys()):
        folder = (shard_prefix(view.digest, name),) if name in listed else ()
        if name in view.hidden:  # superseded by a committed run
            out.append(Leftover(name, (record_path(view.digest, name), *folder), True))
        elif name in retired and name not in view.records:
            paths = (record_path(view.digest, name), *folder)
            out.append(Leftover(name, paths, True, superseded=True))
        elif name not in view.records:  # never committed (or claimed already)
            lease = leases.get(session_of(name) or "")
            still = seen.unchanged_for(f"run {name}", (lease, tuple(listed[name])))
            dead = still > policy.dead_after and name not in writer.writing
            out.append(Leftover(name, folder, dead))
    return out


def _lease_docs(backend: Backend, sessions: Iterable[str]) -> dict[str, bytes]:
    """The lease document of each session that has one."""
    sessions = sorted(sessions)
    paths = [lease_path(s) for s in sessions]
    docs = backend.read_many(paths)
    return {s: doc for s, doc in zip(sessions, docs, strict=True) if doc is not None}


def collect_leases(backend: Backend, writer: Writer) -> None:
    """Remove leases this collector saw unchanged for a whole lease and margin."""
    sessions, _ = backend.list_dir(LEASES)
    docs = _lease_docs(backend, set(sessions) - {writer.lease.name})
    seen, policy = writer.sightings, writer.lease.policy
    assert seen is not None
    gone = [
        s
        for s, doc in docs.items()
        if seen.unchanged_for(f"lease {s}", doc) > policy.dead_after
    ]
    # a folder without a lease document is a lease being deleted, or not ours
    backend.delete_prefixes(f"{LEASES}/{s}" for s in gone)
    seen.forget(f"lease {s}" for s in gone)
    if gone:
        logger.info("removed %d expired writer leases", len(gone))


def collect(
    backend: Backend, view: KeyView, writer: Writer, leftovers: Iterable[Leftover]
) -> None:
    """Remove the removable leftovers; an uncommitted run only once claimed."""
    leftovers = [lo for lo in leftovers if lo.removable]
    superseded = [
        lo.shard for lo in leftovers if lo.shard in view.hidden or lo.superseded
    ]
    retire(backend, view.digest, superseded, _seqs(view.snap, superseded))
    uncommitted = [lo.shard for lo in leftovers if lo.shard not in superseded]
    # the fence: a tombstone where the record would go, so a paused writer's late
    # commit fails instead of publishing a run whose objects are going
    claimed = backend.map(
        lambda s: claim(backend, view.digest, s, writer.writer_id), uncommitted
    )
    dead = [s for s, ok in zip(uncommitted, claimed, strict=True) if ok]
    backend.delete_prefixes(shard_prefix(view.digest, s) for s in dead)
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


def _roll_forward(backend: Backend, view: KeyView, run: str) -> None:
    """Finish a committed run its writer left unpublished: publish it, unless it
    is a merge every run of which is superseded by a published run already."""
    path = record_path(view.digest, run)
    doc = backend.read_or_none(path)
    if doc is None:
        return  # retired meanwhile
    try:
        record = CommitRecord.from_doc(
            doc, shard=run, dim=view.dim, where=backend.describe(path)
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
    return all(doc is None or is_tombstone(doc) for doc in docs)
