"""Sorted runs: each run's hashes in sorted order, found through fences and filters.

A committed run (schema 4) stores, beside ``hashes`` in stored order, the same
hashes sorted (``sorted_hashes``, one zarr chunk per block of :data:`BLOCK_ROWS`),
the stored row of each (``sorted_rows``), the first hash of each block
(``fences``) and a split-block Bloom filter (``bloom``). A reader holds a run's fences
(32 bytes a block); a look-up reads only the blocks whose fence range holds an asked
hash, and a large look-up first drops the hashes the filter rules out, so a writer's
deduplication does not read every block of every run. Runs resolve in commit order:
a hash held by several runs is served by the first (first commit wins).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import google_crc32c
import numpy as np

from embedcache.store.index import argsort_keys, key_bytes
from embedcache.store.layout import HASH_WIDTH

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from embedcache.store.backend import Backend
    from embedcache.store.layout import CommitRecord

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class Run:
    """A committed run, opened: its record, fences, vectors array.

    Never holds every hash.
    """

    record: CommitRecord
    prefix: str
    vectors: Any = None  # zarr.Array (n, dim) float32, opened at the first read
    fences: np.ndarray | None = None  # (blocks,) S32: first hash of each block
    bloom: np.ndarray | None = None  # (words,) uint64, loaded for large look-ups


# rows per block of the sorted index: one 32 KiB chunk of sorted hashes is what a
# look-up of one hash reads from a run (fences: 32 bytes per 1,024 rows)
BLOCK_ROWS = 1024
# sorted rows are read only for hashes found: larger chunks, fewer objects
ROWS_CHUNK = 16 * BLOCK_ROWS
# Bloom filter (split-block): each hash sets one bit in each word of one block of
# BLOOM_WORDS 64-bit words (a 64-byte cache line), so a probe touches one line. At
# 20 bits a hash 0.025% of absent hashes pass (schema 3's one-word blocks at 16 bits
# let 0.47% through), and each that passes costs a block read of every run it
# passes in: a writer's look-ups against dozens of runs paid more for those reads
# than for the filters
BLOOM_BITS = 20
BLOOM_WORDS = 8
BLOOM_CHUNK = 1 << 19  # words per chunk (4 MiB)
_BLOOM_SLICE = 1 << 16  # keys whose filter bits are made at once
# a look-up of at least this many hashes consults the filters first (a small one
# reads fewer bytes from blocks than from a run's filter)
BLOOM_MIN_QUERY = 512
# at most this many needles are searched in Python: numpy's searchsorted releases
# the GIL, and taking it back from a busy writer thread costs a switch interval
SMALL_SEARCH = 16
# decoded blocks kept per store (an LRU): a server's repeated hits read nothing
CACHE_BYTES = 64 << 20


# --- building -----------------------------------------------------------------------


def sort_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A run's (distinct) keys sorted, and the stored row of each."""
    order = argsort_keys(keys)
    return keys[order], order


def fences_of(sorted_keys: np.ndarray) -> np.ndarray:
    """The first key of each block (S32)."""
    return np.ascontiguousarray(sorted_keys[::BLOCK_ROWS])


def n_bloom_words(n: int) -> int:
    blocks = max(1, -(-n * BLOOM_BITS // (64 * BLOOM_WORDS)))
    return blocks * BLOOM_WORDS


def bloom_hashes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What a filter needs of each key, whatever its size: a uint64 from bytes 8-15
    (the block, modulo the blocks) and, from bytes 16-23, the bit each word of the
    block gets (low 6 bits; sha256 bytes are uniform: no rehash), as shifts
    (words, n) uint64: a word's shifts lie together, the layout a probe reads."""
    raw = key_bytes(keys)
    block = raw[:, 8:16].copy().view("<u8")[:, 0]
    bits = np.ascontiguousarray((raw[:, 16 : 16 + BLOOM_WORDS] & np.uint8(63)).T)
    return block, bits.astype(np.uint64)


def bloom_of(keys: np.ndarray) -> np.ndarray:
    """A split-block Bloom filter of ``keys``: (words,) uint64."""
    words = np.zeros(n_bloom_words(len(keys)), np.uint64)
    add_to_bloom(words, keys)
    return words


def add_to_bloom(words: np.ndarray, keys: np.ndarray) -> None:
    """Set the bits of ``keys`` in the filter ``words`` (sized for all its keys):
    a filter is the same whatever order or pieces its keys come in."""
    blocks = words.reshape(-1, BLOOM_WORDS)
    # a slice of keys at a time: the masks are 64 bytes a key (a merge of 12.8 M
    # keys would hold 820 MB of them at once)
    for lo in range(0, len(keys), _BLOOM_SLICE):
        block, shifts = bloom_hashes(keys[lo : lo + _BLOOM_SLICE])
        at = _block_of(block, len(blocks))
        masks = np.left_shift(np.uint64(1), shifts.T)
        np.bitwise_or.at(blocks, at, masks)  # a block many keys share gets each


def may_hold(bloom: np.ndarray, hashed: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The positions (ascending) of the keys (``hashed`` by :func:`bloom_hashes`)
    that may be in the filter; the others certainly are not."""
    block, shifts = hashed
    base = _block_of(block, len(bloom) // BLOOM_WORDS)
    base *= BLOOM_WORDS
    word = bloom.take(base)
    word >>= shifts[0]
    word &= np.uint64(1)
    alive = np.flatnonzero(word)
    # word by word over the keys still in: ~2/3 of absent keys fail each word
    for w in range(1, BLOOM_WORDS):
        at = base.take(alive)
        at += w
        word = bloom.take(at)
        word >>= shifts[w].take(alive)
        alive = alive[(word & np.uint64(1)).astype(bool)]
    return alive


def _block_of(block: np.ndarray, n_blocks: int) -> np.ndarray:
    """``block % n_blocks`` as intp: through a floor division by a scalar, which
    numpy does with a multiply (libdivide), 1.5 ns a key where % took 15."""
    n = np.uint64(n_blocks)
    out = block // n
    out *= n
    np.subtract(block, out, out=out)
    return out.view(np.int64)


def row_dtype(n: int) -> str:
    return "uint32" if n < 1 << 32 else "uint64"


# --- reading ------------------------------------------------------------------------


def search_sorted(
    haystack: np.ndarray, needles: np.ndarray, *, side: str = "left"
) -> np.ndarray:
    """``np.searchsorted``, holding the GIL for a few needles (a server's hit)."""
    if len(needles) > SMALL_SEARCH:
        return np.searchsorted(haystack, needles, side=side)  # type: ignore[call-overload]
    find = bisect.bisect_right if side == "right" else bisect.bisect_left
    return np.array([find(haystack, x) for x in needles], np.int64)


class ChunkError(Exception):
    """A chunk of a run's index is absent (``missing``) or fails its checks."""

    def __init__(self, path: str, problem: str, *, missing: bool = False) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem, self.missing = path, problem, missing


def read_chunk(backend: Backend, path: str, nbytes: int) -> np.ndarray:
    """The body of one uncompressed chunk (bytes + crc32c codecs), checked.

    Raises
    ------
    ChunkError
        The chunk is absent, or its size or its crc32c is wrong.
    """
    try:
        data = backend.read(path)
    except FileNotFoundError:
        raise ChunkError(path, "object is missing", missing=True) from None
    if len(data) != nbytes + 4:
        raise ChunkError(path, f"{len(data)} bytes, not {nbytes + 4}")
    body = np.frombuffer(data, np.uint8)[:-4]
    if google_crc32c.value(body).to_bytes(4, "little") != data[-4:]:
        raise ChunkError(path, "stored and computed crc32c differ")
    return body


class BlockCache:
    """Decoded index chunks by (run, array, chunk), least recently used first out."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def has(self, key: tuple[str, str, int]) -> bool:
        with self._lock:
            return key in self._items

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def get(
        self, key: tuple[str, str, int], load: Callable[[], np.ndarray]
    ) -> np.ndarray:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        value = load()  # outside the lock: reads run in parallel
        with self._lock:
            if key not in self._items:
                self._items[key] = value
                self._bytes += value.nbytes
            while self._bytes > self.max_bytes and self._items:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes
        return value


def map_cached(
    backend: Backend,
    fn: Callable[[T], R],
    items: Sequence[T],
    cached: Callable[[T], bool],
) -> list[R]:
    """``[fn(x) for x in items]``: items whose data is cached in this thread, the
    rest through ``backend.map``. A server's hit then hands no work to other
    threads, each hand-off a wait for the GIL while a writer thread holds it."""
    out: list[R | None] = [None] * len(items)
    cold = []
    for i, item in enumerate(items):
        if cached(item):
            out[i] = fn(item)
        else:
            cold.append(i)
    for i, value in zip(cold, backend.map(fn, [items[i] for i in cold]), strict=True):
        out[i] = value
    return out  # type: ignore[return-value]


def _sorted_block(
    backend: Backend, run: Run, block: int, cache: BlockCache
) -> np.ndarray:
    n = run.record.n_rows
    path = f"{run.prefix}/sorted_hashes/c/{block}/0"

    def load() -> np.ndarray:
        body = read_chunk(backend, path, BLOCK_ROWS * HASH_WIDTH)
        rows = min(BLOCK_ROWS, n - block * BLOCK_ROWS)
        return np.frombuffer(body[: rows * HASH_WIDTH].tobytes(), "S32")

    return cache.get((run.record.run, "h", block), load)


def _rows_chunk(
    backend: Backend, run: Run, chunk: int, cache: BlockCache
) -> np.ndarray:
    dtype = np.dtype(row_dtype(run.record.n_rows))
    path = f"{run.prefix}/sorted_rows/c/{chunk}"

    def load() -> np.ndarray:
        body = read_chunk(backend, path, ROWS_CHUNK * dtype.itemsize)
        return body.view(dtype.newbyteorder("<")).astype(np.int64)

    return cache.get((run.record.run, "r", chunk), load)


def probe(
    backend: Backend,
    runs: Sequence[Run],
    q: np.ndarray,
    cache: BlockCache,
) -> tuple[np.ndarray, np.ndarray]:
    """Where each S32 key in ``q`` is served: (run position, stored row), -1 if absent.

    Reads, in parallel, only the blocks whose fences bracket an asked key; a run's
    filter (for a large ``q``) skips the keys it certainly lacks. First run wins.
    Two rounds: the first runs (:func:`first_round`), then the later runs only for
    the keys not found. A small look-up reads no filter, so in one round it read a
    block of every run for every key.
    """
    first = first_round([s.record.n_rows for s in runs])
    which, rows = _probe_round(backend, runs[:first], q, cache)
    rest = np.flatnonzero(which < 0)
    if first < len(runs) and len(rest):
        later, at = _probe_round(backend, runs[first:], q[rest], cache)
        hit = later >= 0
        which[rest[hit]] = later[hit] + first
        rows[rest[hit]] = at[hit]
    return which, rows


def first_round(sizes: Sequence[int]) -> int:
    """How many runs (in commit order) a look-up's first round probes: the prefix
    that minimises the block reads of a stored key, which are one a run of the
    prefix and then one a later run for the share of rows the prefix lacks. It
    ends at a key's largest run (its oldest merged one: 80% of a 16 M-row key),
    or past it where runs of one size follow (five of 800 k rows: three)."""
    m, total = len(sizes), sum(sizes)
    if m < 2 or not total:
        return m
    # plain Python: it runs at every look-up, a server's one-hash hit included
    best, best_reads, held = m, math.inf, 0
    for taken, size in enumerate(sizes, 1):
        held += size
        reads = taken + (1 - held / total) * (m - taken)
        if reads < best_reads:  # the first prefix of the fewest reads
            best, best_reads = taken, reads
    return best


def _probe_round(
    backend: Backend,
    runs: Sequence[Run],
    q: np.ndarray,
    cache: BlockCache,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`probe` in one round: every run for every key."""
    n = len(q)
    which = np.full(n, -1, np.int64)
    rows = np.full(n, -1, np.int64)
    if not n or not runs:
        return which, rows
    order = argsort_keys(q)
    qs = q[order]
    tasks: list[tuple[int, int, np.ndarray]] = []  # (run, block, positions in qs)
    hashed = bloom_hashes(qs)  # once for every run's filter
    small = n <= SMALL_SEARCH
    listed = (
        list(zip(hashed[0].tolist(), hashed[1].T.tolist(), strict=True))
        if small
        else []
    )
    for r, run in enumerate(runs):
        if not run.record.n_rows:
            continue
        if n >= BLOOM_MIN_QUERY and run.bloom is None:
            run.bloom = load_bloom(backend, run)  # kept: later views share it
        if small:  # a server's hit: Python ints, a few microseconds a run
            tasks += _small_tasks(r, run, qs, listed)
            continue
        # a filter in memory is consulted at any size
        cand = np.arange(n) if run.bloom is None else may_hold(run.bloom, hashed)
        blocks = search_sorted(run.fences, qs[cand], side="right") - 1
        keep = blocks >= 0
        cand, blocks = cand[keep], blocks[keep]
        if not len(cand):
            continue
        cuts = np.flatnonzero(np.diff(blocks)) + 1
        for part in np.split(np.arange(len(cand)), cuts):
            tasks.append((r, int(blocks[part[0]]), cand[part]))

    def search(task: tuple[int, int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        r, block, pos = task
        keys = _sorted_block(backend, runs[r], block, cache)
        at = search_sorted(keys, qs[pos])
        at[at == len(keys)] = 0
        hit = keys[at] == qs[pos]
        return pos[hit], block * BLOCK_ROWS + at[hit]

    found = map_cached(
        backend,
        search,
        tasks,
        lambda t: cache.has((runs[t[0]].record.run, "h", t[1])),
    )
    # position in each run's sorted index; tasks go in commit order: first run wins
    best = np.full(n, -1, np.int64)
    where = np.full(n, -1, np.int64)
    for (r, _, _), (pos, sorted_at) in zip(tasks, found, strict=True):
        new = best[pos] < 0
        best[pos[new]] = r
        where[pos[new]] = sorted_at[new]
    hits = np.flatnonzero(best >= 0)
    stored = _stored_rows(backend, runs, best[hits], where[hits], cache)
    which[order[hits]] = best[hits]
    rows[order[hits]] = stored
    return which, rows


def _small_tasks(
    r: int, run: Run, qs: np.ndarray, hashed: list[tuple[int, list[int]]]
) -> list[tuple[int, int, np.ndarray]]:
    """:func:`probe`'s (run, block, positions) for a few keys, without numpy calls
    per key (each a few microseconds, times every run of the key)."""
    bloom, fences = run.bloom, run.fences
    by_block: dict[int, list[int]] = {}
    for i, (at, bits) in enumerate(hashed):
        if bloom is not None:
            base = at % (len(bloom) // BLOOM_WORDS) * BLOOM_WORDS
            words = bloom[base : base + BLOOM_WORDS].tolist()
            if not all(x >> b & 1 for x, b in zip(words, bits, strict=True)):
                continue
        block = bisect.bisect_right(fences, qs[i]) - 1
        if block >= 0:
            by_block.setdefault(block, []).append(i)
    return [(r, b, np.array(pos)) for b, pos in sorted(by_block.items())]


def read_sorted(
    backend: Backend, run: Run, lo: int, hi: int, cache: BlockCache
) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``lo..hi`` of a run's sorted index: the hashes (S32), in order, and
    the stored row of each (int64); its chunks read in parallel through ``cache``.

    Raises
    ------
    ChunkError
        A chunk is absent or fails its checks.
    """
    hi = min(hi, run.record.n_rows)
    if hi <= lo:
        return np.empty(0, "S32"), np.empty(0, np.int64)

    def piece(per: int, load: Callable[[int], np.ndarray]) -> np.ndarray:
        first, last = lo // per, (hi - 1) // per
        parts = backend.map(load, range(first, last + 1))
        return np.concatenate(parts)[lo - first * per : hi - first * per]

    keys = piece(BLOCK_ROWS, lambda b: _sorted_block(backend, run, b, cache))
    rows = piece(ROWS_CHUNK, lambda c: _rows_chunk(backend, run, c, cache))
    return keys, rows


def _stored_rows(
    backend: Backend,
    runs: Sequence[Run],
    run: np.ndarray,
    sorted_at: np.ndarray,
    cache: BlockCache,
) -> np.ndarray:
    """The stored row of each (run, position in its sorted index)."""
    out = np.empty(len(run), np.int64)
    chunk = sorted_at // ROWS_CHUNK
    pair = run * (1 << 32) + chunk
    uniq, inverse = np.unique(pair, return_inverse=True)
    pairs = [(int(p) >> 32, int(p) & 0xFFFFFFFF) for p in uniq]
    loaded = map_cached(
        backend,
        lambda p: _rows_chunk(backend, runs[p[0]], p[1], cache),
        pairs,
        lambda p: cache.has((runs[p[0]].record.run, "r", p[1])),
    )
    by = np.argsort(inverse, kind="stable")
    bounds = search_sorted(inverse[by], np.arange(len(pairs) + 1))
    for j, (_, c) in enumerate(pairs):
        sel = by[bounds[j] : bounds[j + 1]]
        out[sel] = loaded[j][sorted_at[sel] - c * ROWS_CHUNK]
    return out


def load_fences_from(chunk: bytes, n_rows: int) -> np.ndarray:
    """A run's fences (S32, one per block) from its one chunk, already checked."""
    n_blocks = -(-n_rows // BLOCK_ROWS)
    body = chunk[: n_blocks * HASH_WIDTH]
    if len(body) != n_blocks * HASH_WIDTH:
        msg = f"fences chunk has {len(chunk)} bytes for {n_blocks} blocks"
        raise ValueError(msg)
    return np.frombuffer(body, "S32").copy()


def load_bloom(backend: Backend, run: Run) -> np.ndarray:
    """A run's Bloom filter, read whole (2 bytes a row), chunks in parallel."""
    n_words = n_bloom_words(run.record.n_rows)
    per = min(n_words, BLOOM_CHUNK)
    paths = [f"{run.prefix}/bloom/c/{i}" for i in range(-(-n_words // per))]
    parts = backend.map(lambda p: read_chunk(backend, p, per * 8), paths)
    return np.concatenate(parts).view("<u8")[:n_words].astype(np.uint64)
