"""The merge of sorted runs, streamed: a bounded step of rows at a time.

Each run's sorted index is already sorted, so the merged run's index is a k-way
merge of them (:func:`merged_steps`). A first pass marks the rows that win
(:func:`winning_rows`); the merged run keeps those, in the runs' stored order, so
its stored rows are each run's kept-row counts (:class:`Kept`), and a second pass
over the same merge writes its index while the vectors and hashes are copied in
stored order (:func:`merged_rows`). Beside a constant, a merge holds 1 byte then 4
bytes per row it reads (which rows it keeps), and 2 per row it writes (the
merged run's Bloom filter); never the keys themselves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from embedcache.store.index import argsort_keys
from embedcache.store.layout import HASH_WIDTH
from embedcache.store.reads import lookup, read_vectors, sorted_index, stored_keys
from embedcache.store.run_reads import chunk_rows
from embedcache.store.run_writes import RunRows
from embedcache.store.runs import BLOCK_ROWS, ROWS_CHUNK, BlockCache

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from embedcache.store.backend import Backend
    from embedcache.store.run_reads import Run
    from embedcache.store.run_writes import AddSorted, Append
    from embedcache.store.snapshots import KeyView, Snapshot

logger = logging.getLogger(__name__)

# rows of the chosen runs' sorted indexes merged per step, all runs together:
# ~100 bytes each while a step is sorted and looked up (a larger step was no
# faster: 2^17 rows took as long and held ~20 MiB more)
MERGE_ROWS = 1 << 15
# bytes of the merged run's vectors (or hashes) copied per step, in whole chunks
# of it (at least one; the merge before streaming copied 16 chunks of vectors)
COPY_BYTES = 1 << 22


@dataclass(frozen=True, slots=True)
class Kept:
    """Which rows of each chosen run the merged run keeps, as running counts.

    ``counts[j][r]``: rows of run ``j`` kept up to and including stored row ``r``
    (so row ``r`` is kept where the count steps up); ``starts[j]``: where run
    ``j``'s kept rows begin in the merged run.
    """

    counts: tuple[np.ndarray, ...]
    starts: tuple[int, ...]
    n: int

    @classmethod
    def from_masks(cls, masks: list[np.ndarray]) -> Kept:
        counts = []
        for j in range(len(masks)):  # one run's mask turned into counts at a time
            mask = masks[j]
            dtype = np.uint32 if len(mask) < 1 << 32 else np.uint64
            counts.append(np.cumsum(mask, dtype=dtype))
            masks[j] = np.empty(0, bool)
        sizes = [int(c[-1]) if len(c) else 0 for c in counts]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        return cls(counts=tuple(counts), starts=tuple(starts[:-1]), n=starts[-1])

    def new_rows(self, j: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of stored ``rows`` of run ``j``: which are kept, and where each lands in
        the merged run (meaningful where kept)."""
        count = self.counts[j][rows].astype(np.int64)
        before = self.counts[j][np.maximum(rows - 1, 0)].astype(np.int64)
        before[rows == 0] = 0
        return count > before, self.starts[j] + count - 1

    def kept_rows(self, j: int, lo: int, hi: int) -> np.ndarray:
        """The kept stored rows of run ``j`` among ``lo..hi``, in order."""
        part = self.counts[j][lo:hi].astype(np.int64)
        before = np.empty_like(part)
        before[0] = self.counts[j][lo - 1] if lo else 0
        before[1:] = part[:-1]
        return lo + np.flatnonzero(part > before)


def merge_cache(n_runs: int) -> BlockCache:
    """The chunks of a merge's sorted indexes kept while it reads them: each run's
    current sorted_rows chunk (read a window at a time) and a step's blocks, twice
    over. A small merge's second pass then reads nothing again."""
    return BlockCache(
        2 * n_runs * 8 * ROWS_CHUNK
        + 2 * HASH_WIDTH * (MERGE_ROWS + n_runs * BLOCK_ROWS)
    )


def merged_steps(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    positions: Sequence[int],
    cache: BlockCache,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The sorted indexes of runs ``positions`` (in commit order) merged, a step at a
    time: (hashes S32 in order, run as an index into ``positions``, stored row).

    A hash held by several runs comes once from each, in commit order, all in one
    step. Each run is read a window at a time; a step takes, from every window,
    the hashes up to the smallest last hash of a window that does not end its run
    (later hashes of any run are greater).
    """
    runs = [snap.runs[p] for p in positions]
    k = len(runs)
    window = max(1, MERGE_ROWS // max(k, 1))
    ends = [0] * k  # sorted positions read so far, per run
    keys = [np.empty(0, "S32")] * k
    rows = [np.empty(0, np.int64)] * k
    sizes = [s.record.n_rows for s in runs]
    while True:
        spans = [
            (j, ends[j], ends[j] + window - len(keys[j]))
            for j in range(k)
            if len(keys[j]) < window and ends[j] < sizes[j]
        ]
        reads = backend.map(  # the runs in parallel: one round trip, not k
            lambda span: sorted_index(
                backend, view, runs[span[0]], span[1], span[2], cache
            ),
            spans,
        )
        need = [j for j, _, _ in spans]
        for j, (more, at) in zip(need, reads, strict=True):
            keys[j] = np.concatenate([keys[j], more])
            rows[j] = np.concatenate([rows[j], at])
            ends[j] += len(more)
        live = [j for j in range(k) if len(keys[j])]
        if not live:
            return
        open_ends = [keys[j][-1] for j in live if ends[j] < sizes[j]]
        bound = min(open_ends) if open_ends else None
        takes = [
            len(keys[j])
            if bound is None
            else int(np.searchsorted(keys[j], bound, "right"))
            for j in range(k)
        ]
        step = np.concatenate([keys[j][: takes[j]] for j in range(k)])
        run = np.repeat(np.arange(k), takes)
        at = np.concatenate([rows[j][: takes[j]] for j in range(k)])
        for j in range(k):
            keys[j], rows[j] = keys[j][takes[j] :], rows[j][takes[j] :]
        order = argsort_keys(step)  # stable: equal hashes in commit order
        yield step[order], run[order], at[order]


def distinct_count(
    backend: Backend, view: KeyView, snap: Snapshot, positions: Sequence[int]
) -> int:
    """How many distinct hashes runs ``positions`` of ``snap`` hold together: their
    sorted indexes merged a step at a time (a hash's copies share a step), never
    every hash at once (a 16 M-row key: 81 MiB peak and 15 s, where reading every
    hash and sorting them took 2,699 MiB and 36 s)."""
    count = 0
    for keys, _, _ in merged_steps(
        backend, view, snap, positions, merge_cache(len(positions))
    ):
        count += 1 + int(np.count_nonzero(keys[1:] != keys[:-1]))  # never empty
    return count


def winning_rows(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    positions: Sequence[int],
    cache: BlockCache,
    *,
    skip: frozenset[str] = frozenset(),
) -> Kept:
    """Which rows of runs ``positions`` (in commit order) win in the whole key: the
    first copy among them, unless a run before it that is not among them holds the
    hash too (a look-up of each step's first copies in those runs' filters and
    blocks; the chosen runs' own blocks are read once, in the merge). Runs named
    in ``skip`` are known to hold none of the chosen runs' hashes: not looked in."""
    masks = [np.zeros(snap.runs[p].record.n_rows, bool) for p in positions]
    chosen = set(positions)
    last = max(positions, default=0)
    others = np.array(
        [
            i
            for i in range(last)
            if i not in chosen and snap.runs[i].record.run not in skip
        ],
        np.int64,
    )
    sub = replace(snap, runs=tuple(snap.runs[i] for i in others))
    where = np.asarray(positions, np.int64)
    for keys, run, rows in merged_steps(backend, view, snap, positions, cache):
        first = np.ones(len(keys), bool)
        first[1:] = keys[1:] != keys[:-1]
        if len(others):
            cand = np.flatnonzero(first)
            held, _ = lookup(backend, view, sub, keys[cand])
            hit = held >= 0
            earlier = others[held[hit]] < where[run[cand[hit]]]
            first[cand[hit][earlier]] = False
        for j in np.unique(run[first]).tolist():
            masks[j][rows[first & (run == j)]] = True
    return Kept.from_masks(masks)


def merged_rows(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    positions: Sequence[int],
    kept: Kept,
    cache: BlockCache,
) -> RunRows:
    """The merged run of runs ``positions`` keeping ``kept``, as a run's content:
    vectors and hashes copied in stored order, the index from a second merge."""
    where = np.asarray(positions, np.int64)
    n_read = sum(snap.runs[p].record.n_rows for p in positions)
    if n_read * (HASH_WIDTH + 8) > cache.max_bytes:  # the second pass reads it all
        cache.clear()  # again: none of it held while the vectors are copied

    def vectors(append: Append) -> None:
        block = _copy_rows(kept.n, 4 * view.dim)
        for run, rows in _stored_blocks(kept, block):
            buf = np.empty((len(rows), view.dim), np.float32)
            read_vectors(
                backend, view, snap, where[run], rows, buf, np.arange(len(rows))
            )
            append(buf)

    def pick(job: tuple[Run, np.ndarray]) -> np.ndarray:
        run, at = job  # stored rows of one run, sorted, within a block of it
        lo, hi = int(at[0]), int(at[-1]) + 1
        return stored_keys(backend, view, run, lo, hi)[at - lo]

    def hashes(append: Append) -> None:
        block = _copy_rows(kept.n, HASH_WIDTH)
        for run, rows in _stored_blocks(kept, block):
            out = np.empty(len(rows), "S32")
            # a read spans at most a block of a run's rows (many may be dropped)
            window = rows // block
            cuts = np.flatnonzero((np.diff(run) != 0) | (np.diff(window) != 0)) + 1
            parts = np.split(np.arange(len(rows)), cuts)
            picks = [(snap.runs[int(where[run[p[0]]])], rows[p]) for p in parts]
            for part, got in zip(parts, backend.map(pick, picks), strict=True):
                out[part] = got
            append(out)

    def index(add: AddSorted) -> None:
        for keys, run, rows in merged_steps(backend, view, snap, positions, cache):
            keep = np.zeros(len(keys), bool)
            new = np.empty(len(keys), np.int64)
            for j in np.unique(run).tolist():
                sel = np.flatnonzero(run == j)
                keep[sel], new[sel] = kept.new_rows(j, rows[sel])
            add(keys[keep], new[keep])

    return RunRows(n=kept.n, vectors=vectors, hashes=hashes, index=index)


def _copy_rows(n: int, row_bytes: int) -> int:
    """Rows copied per step: whole chunks of the merged run's array, ~COPY_BYTES."""
    per = chunk_rows(n, row_bytes)
    return per * max(1, COPY_BYTES // (per * row_bytes))


def _stored_blocks(kept: Kept, block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The kept rows in the merged run's order, ``block`` at a time (the last one
    shorter): (run as an index into the chosen runs, stored row in it)."""
    runs: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    held = 0
    for j, counts in enumerate(kept.counts):
        for lo in range(0, len(counts), block):
            part = kept.kept_rows(j, lo, min(len(counts), lo + block))
            runs.append(np.full(len(part), j, np.int64))
            rows.append(part)
            held += len(part)
            while held >= block:
                run, at = np.concatenate(runs), np.concatenate(rows)
                yield run[:block], at[:block]
                runs, rows, held = [run[block:]], [at[block:]], held - block
    if held:
        yield np.concatenate(runs), np.concatenate(rows)
