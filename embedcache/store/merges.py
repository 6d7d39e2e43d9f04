"""Merges: a key's runs merged into one that supersedes them, by levels after each
put (whoever wrote the runs) or all at once (``compact``).

A merged run takes the place of the earliest run it merged and keeps only the rows
that win there, so what readers were served stays what they are served. The runs
it supersedes are left to collection (``collection``), which deletes them once no
reader can still be reading them. The merge itself is streamed (``merged_runs``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from embedcache.store.collection import collect_pass, log_seqs, merged_for
from embedcache.store.commits import commit_run
from embedcache.store.layout import seq_ranges
from embedcache.store.merged_runs import merge_cache, merged_rows, winning_rows
from embedcache.store.snapshots import (
    RETRIES,
    RunRetiredError,
    adopt,
    refresh,
    retries_exhausted,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from embedcache.store.backend import Backend
    from embedcache.store.commits import Writer
    from embedcache.store.layout import CommitRecord
    from embedcache.store.snapshots import KeyView, Snapshot

logger = logging.getLogger(__name__)

# a writer merges the key's runs once this many are visible at one level, so
# many short writers, or a long run that commits every batch, leave few runs
AUTO_MERGE = 4


def merge(
    backend: Backend, view: KeyView, writer: Writer, run_ids: Iterable[str]
) -> CommitRecord | None:
    """Commit one run holding the winning rows of ``run_ids``, superseding them.

    The runs merged away stay readable (a reader of an older snapshot may be
    reading them) until collection deletes them after the grace
    (:func:`~embedcache.store.collection.retire_merged`).

    The merged run keeps the rows in the chosen runs' stored order (whole-key
    reads stay sequential) and only those that win in the whole key: a hash an
    earlier, unchosen run holds stays served by that run. Streamed
    (``merged_runs``): its memory is a few bytes a row, not the keys. A run every
    chosen run lacks (``CommitRecord.lacks``) is not looked in, and the merged
    run lacks it too, as it lacks the runs before it.
    """
    snap = refresh(backend, view)
    chosen = set(run_ids) & {s.record.run for s in snap.runs}
    # runs hidden by a chosen one go too, or they would reappear once their
    # superseder is retired
    grew = True
    while grew:
        extra = {old for old, sup in snap.hidden.items() if sup in chosen} - chosen
        chosen |= extra
        grew = bool(extra)
    if not chosen:  # merged away by another process meanwhile
        return None
    positions = [i for i, s in enumerate(snap.runs) if s.record.run in chosen]
    lacked = [frozenset(snap.records[s].lacks) for s in chosen]
    lacked_by_all = frozenset.intersection(*lacked) if lacked else frozenset()
    # winning_rows drops the rows an earlier unchosen run holds: the merged run,
    # at its earliest chosen run's place, lacks every run before that
    first = positions[0] if positions else 0
    before = frozenset(s.record.run for s in snap.runs[:first])
    cache = merge_cache(len(positions))
    kept = winning_rows(backend, view, snap, positions, cache, skip=lacked_by_all)
    merged = commit_run(
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
        retires=_replaced(snap, chosen),
    )
    # readers in this process move to the merged run before the old ones go (its
    # fences and filter as written: no read back, no block read of it for a hash
    # it lacks)
    adopt(view, merged)
    refresh(backend, view)
    for run in chosen:  # the grace starts now, on this process's clock
        merged_for(writer, run)
    return merged.record


def _replaced(snap: Snapshot, runs: Iterable[str]) -> tuple[tuple[int, int], ...]:
    """The log seqs a merge of ``runs`` makes unnecessary: theirs and those they
    replaced in turn (a reader then probes only unexplained gaps)."""
    records = [snap.records[r] for r in runs if r in snap.records]
    inner = (q for r in records for lo, hi in r.retires for q in range(lo, hi + 1))
    return seq_ranges([*log_seqs(snap, runs), *inner])


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
        for run in snap.runs:
            by_level.setdefault(run.record.level, []).append(run.record.run)
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
    """Merge all of a key's runs into one, then remove its dead garbage."""
    refresh(backend, view)
    for _ in range(RETRIES):
        if len(view.runs) <= 1:
            break
        try:
            merged = merge(backend, view, writer, [s.record.run for s in view.runs])
        except RunRetiredError:  # another process compacted meanwhile
            view.forget_listing()
            refresh(backend, view)
            continue
        if merged is not None:
            logger.info("compacted %s into run %s", view.key.short(), merged.run)
        break
    else:
        raise retries_exhausted(backend, view.key)
    collect_pass(backend, [view], writer)
    refresh(backend, view)
