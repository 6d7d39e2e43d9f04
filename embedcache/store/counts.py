"""How many distinct vectors a key holds, read from its commit records where they
can tell.

A run holds each of its hashes once, and two runs share none when one's record
says it lacks the other (``CommitRecord.lacks``), or lacks every run a merged one
was made of. A writer's runs all say so of each other, so a key one writer filled
is counted from its records alone. Runs that may share hashes (two writers that
put the same sequences at once, records of earlier versions) are counted together
by merging their sorted indexes. :class:`KeyInfo` is a key with its counts, as
``EmbeddingStore.keys()`` and ``embedcache store ls`` show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcache.store.merged_runs import distinct_count

if TYPE_CHECKING:
    from embedcache.specs import ModelKey
    from embedcache.store.backend import Backend
    from embedcache.store.layout import CommitRecord
    from embedcache.store.snapshots import KeyView, Snapshot


def n_distinct(backend: Backend, view: KeyView, snap: Snapshot) -> int:
    """Distinct hashes of the runs of ``snap``."""
    records = [s.record for s in snap.runs]
    total = 0
    for group in overlapping_groups(records):
        if len(group) == 1:
            total += records[group[0]].n_rows
        else:
            total += distinct_count(backend, view, snap, group)
    return total


def overlapping_groups(records: list[CommitRecord]) -> list[list[int]]:
    """The runs (positions in ``records``) split into groups that share no hash
    with each other: runs not known to be disjoint, and those linked to them by
    such pairs, fall in one group."""
    group = list(range(len(records)))  # union-find: each run's representative
    lacks = [frozenset(r.lacks) for r in records]  # once a run, not once a pair

    def root(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    for b in range(len(records)):
        for a in range(b):
            if not _lacks(lacks[a], records[b]) and not _lacks(lacks[b], records[a]):
                group[root(a)] = root(b)
    by_root: dict[int, list[int]] = {}
    for i in range(len(records)):
        by_root.setdefault(root(i), []).append(i)
    return list(by_root.values())


def _lacks(lacks: frozenset[str], b: CommitRecord) -> bool:
    # a run lacks b, or lacks every run b was merged from (its look-up saw those)
    return b.run in lacks or (bool(b.supersedes) and lacks.issuperset(b.supersedes))


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """One model key in the store, as ``keys()`` and ``embedcache store ls`` show it."""

    key: ModelKey
    digest: str
    n_vectors: int  # distinct hashes in the logical view
    dim: int
    n_runs: int  # committed, visible runs
    nbytes: int  # bytes stored by the visible runs
    aliases: tuple[str, ...] = ()  # display names recorded by put(..., alias=)
    # what computed the vectors, as recorded by put(..., kernels=): JSON objects
    kernels: tuple[str, ...] = ()
