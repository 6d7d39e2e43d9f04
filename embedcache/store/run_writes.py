"""Writing a run: its arrays' chunks and metadata, from rows handed over in pieces.

A new run's content (:class:`RunRows`) comes as three streams: vectors and
hashes in stored order, and the sorted index in key order. A put has every key in
hand (:func:`rows_in_hand`); a merge streams them (``merged_runs``), so its memory
does not grow with the rows it writes. Either way the objects are the same bytes:
each array's chunks are made as zarr stores them (:class:`ChunkStream`), and the
metadata documents as zarr writes them, but without zarr's write path (~100x the
CPU, all of it holding the GIL a server's readers wait for).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.storage import MemoryStore

from embedcache.store import runs
from embedcache.store.index import key_bytes
from embedcache.store.layout import HASH_WIDTH, group_doc, sha256
from embedcache.store.run_reads import _array, chunk_rows

if TYPE_CHECKING:
    from embedcache.store.backend import Backend

_NAN = math.nan  # one object: a key of _array_doc's cache
# an array of at least this many rows has its chunks' fsyncs started as each is
# written (a merge's disk writes overlap the rest of its work); a small run's
# few files are synced together at commit, where the extra threads' turns at the
# GIL would delay a server's reads more than they save
SYNC_SOON_ROWS = 1 << 16
# rows per chunk of each array of the sorted index, given its length
_INDEX_CHUNKS = {
    "sorted_hashes": lambda n: runs.BLOCK_ROWS,
    "sorted_rows": lambda n: runs.ROWS_CHUNK,
    "fences": lambda n: n,  # one chunk: a reader loads it whole at open
    "bloom": lambda n: min(n, runs.BLOOM_CHUNK),
}

Files = dict[str, tuple[int, str]]  # (size, sha256) of each object, by path in run
Append = Callable[[np.ndarray], None]
AddSorted = Callable[[np.ndarray, np.ndarray], None]


@dataclass(frozen=True, slots=True)
class RunRows:
    """What a new run holds, handed over in pieces.

    ``vectors(append)`` appends (k, dim) float32 rows and ``hashes(append)`` their
    (k,) S32 hashes, both in stored order; ``index(add)`` adds the hashes in key
    order, (k,) S32, with the stored row of each. Pieces may be of any size.
    """

    n: int
    vectors: Callable[[Append], None]
    hashes: Callable[[Append], None]
    index: Callable[[AddSorted], None]


def rows_in_hand(keys: np.ndarray, vectors: np.ndarray) -> RunRows:
    """A put's run: distinct S32 ``keys`` and their ``vectors``, in stored order."""

    def index(add: AddSorted) -> None:
        add(*runs.sort_keys(keys))

    return RunRows(
        n=len(keys),
        vectors=lambda append: append(vectors),
        hashes=lambda append: append(keys),
        index=index,
    )


@functools.lru_cache(maxsize=256)
def _array_doc(
    shape: tuple[int, ...],
    dtype: str,
    fill_value: float,
    chunk: int | None = None,
) -> bytes:
    """The ``zarr.json`` zarr writes for one of our arrays (made in memory).

    ``chunk``: rows per chunk (default: ~``runs.CHUNK_BYTES``); a chunk spans every
    column.
    """
    docs: dict[str, Any] = {}
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
    rows = chunk_rows(shape[0], row_bytes) if chunk is None else max(1, chunk)
    zarr.create_array(
        store=MemoryStore(docs),
        shape=shape,
        dtype=dtype,
        chunks=(rows, *shape[1:]),
        filters=None,
        compressors=[Crc32cCodec()],
        fill_value=fill_value,
    )
    return docs["zarr.json"].to_bytes()


def write_run(
    backend: Backend,
    prefix: str,
    *,
    attrs: dict[str, Any],
    dim: int,
    rows: RunRows,
) -> tuple[Files, Any, np.ndarray, np.ndarray]:
    """Write a complete run of ``rows`` under ``prefix``.

    Returns (size, sha256) of each object written, the vectors array to read, and
    the run's fences and Bloom filter (for a view to adopt it without reading).
    """
    n = rows.n
    docs = {
        "zarr.json": group_doc(attrs),
        "vectors/zarr.json": _array_doc((n, dim), "float32", _NAN),
        "hashes/zarr.json": _array_doc((n, HASH_WIDTH), "uint8", 0),
    }
    for rel, doc in docs.items():
        backend.write(f"{prefix}/{rel}", doc)
    files = {rel: (len(doc), sha256(doc)) for rel, doc in docs.items()}
    if n:
        vectors = ChunkStream(
            backend, prefix, "vectors", (n, dim), chunk_rows(n, 4 * dim), _NAN
        )
        rows.vectors(lambda part: vectors.append(np.asarray(part, np.float32)))
        files.update(vectors.close())
        hashes = ChunkStream(
            backend, prefix, "hashes", (n, HASH_WIDTH), chunk_rows(n, HASH_WIDTH), 0
        )
        rows.hashes(lambda keys: hashes.append(key_bytes(keys)))
        files.update(hashes.close())
    index = IndexWriter(backend, prefix, n)
    rows.index(index.add)
    index_files, fences, bloom = index.close()
    files.update(index_files)
    array = _array(backend.zarr_store(), f"{prefix}/vectors", docs["vectors/zarr.json"])
    return dict(sorted(files.items())), array, fences, bloom


def write_index(backend: Backend, prefix: str, keys: np.ndarray) -> Files:
    """Write the sorted index (``runs``) of a run holding S32 ``keys`` under
    ``prefix``; (size, sha256) of each object written, by path in the run.
    Deterministic: a rerun writes the same bytes."""
    index = IndexWriter(backend, prefix, len(keys))
    index.add(*runs.sort_keys(np.ascontiguousarray(keys, "S32")))
    return index.close()[0]


class IndexWriter:
    """A run's sorted index, written as its hashes come in key order.

    Holds the run's Bloom filter (2 bytes a row) and fences (32 bytes a block)
    until :meth:`close`, and less than a chunk of the other arrays.
    """

    def __init__(self, backend: Backend, prefix: str, n: int) -> None:
        self.backend, self.prefix, self.n = backend, prefix, n
        self.n_blocks = -(-n // runs.BLOCK_ROWS)
        self.bloom = np.zeros(runs.n_bloom_words(n), np.uint64)
        self.row_dtype = np.dtype(runs.row_dtype(n))
        shapes = {
            "sorted_hashes": ((n, HASH_WIDTH), "uint8"),
            "sorted_rows": ((n,), self.row_dtype.name),
            "fences": ((self.n_blocks, HASH_WIDTH), "uint8"),
            "bloom": ((len(self.bloom),), "uint64"),
        }
        self.files: Files = {}
        for name, (shape, dtype) in shapes.items():
            rel = f"{name}/zarr.json"
            doc = _array_doc(shape, dtype, 0, _INDEX_CHUNKS[name](shape[0]))
            backend.write(f"{prefix}/{rel}", doc)
            self.files[rel] = (len(doc), sha256(doc))
        self._hashes = ChunkStream(
            backend, prefix, "sorted_hashes", (n, HASH_WIDTH), runs.BLOCK_ROWS, 0
        )
        self._rows = ChunkStream(
            backend, prefix, "sorted_rows", (n,), runs.ROWS_CHUNK, 0
        )
        self._fences: list[np.ndarray] = []
        self._last: bytes | None = None

    def add(self, sorted_keys: np.ndarray, rows: np.ndarray) -> None:
        """The next ``sorted_keys`` (S32, each greater than all before) and the
        stored row of each."""
        if not len(sorted_keys):
            return
        if self._last is not None and not sorted_keys[0] > self._last:
            msg = "hashes added to a sorted index out of order"
            raise ValueError(msg)
        self._last = sorted_keys[-1]
        at = self._hashes.written
        # a copy: a view would keep every piece of keys alive
        self._fences.append(
            sorted_keys[-at % runs.BLOCK_ROWS :: runs.BLOCK_ROWS].copy()
        )
        runs.add_to_bloom(self.bloom, sorted_keys)
        self._hashes.append(key_bytes(sorted_keys))
        self._rows.append(np.asarray(rows).astype(self.row_dtype))

    def close(self) -> tuple[Files, np.ndarray, np.ndarray]:
        """Write the rest; the objects written, the run's fences (S32) and filter."""
        self.files.update(self._hashes.close())
        self.files.update(self._rows.close())
        fences = np.concatenate(self._fences) if self._fences else np.empty(0, "S32")
        for name, arr in (("fences", key_bytes(fences)), ("bloom", self.bloom)):
            if len(arr):
                per = _INDEX_CHUNKS[name](len(arr))
                self.files.update(
                    write_chunks(self.backend, self.prefix, name, arr, per, 0)
                )
        return self.files, fences, self.bloom


class ChunkStream:
    """One array of ``shape`` written as rows are appended: each whole chunk of
    ``per`` rows as soon as it is complete, the last one at :meth:`close`."""

    def __init__(
        self,
        backend: Backend,
        prefix: str,
        name: str,
        shape: tuple[int, ...],
        per: int,
        fill_value: float,
    ) -> None:
        self.backend, self.prefix, self.name = backend, prefix, name
        self.shape, self.per, self.fill_value = shape, per, fill_value
        self.written = 0  # rows appended
        self.files: Files = {}
        self._tail: np.ndarray | None = None  # appended rows short of a whole chunk

    def append(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        if rows.shape[1:] != self.shape[1:] or self.written + len(rows) > self.shape[0]:
            msg = (
                f"rows of shape {rows.shape} do not fit {self.name} "
                f"{self.shape} after {self.written} rows"
            )
            raise ValueError(msg)
        start = self.written - (0 if self._tail is None else len(self._tail))
        self.written += len(rows)
        if self._tail is not None:  # complete the pending chunk first
            k = min(len(rows), self.per - len(self._tail))
            rows, head = rows[k:], np.concatenate([self._tail, rows[:k]])
            self._tail = None
            if len(head) < self.per:
                self._tail = head
                return
            self._put(head, start)
            start += self.per
        whole = len(rows) // self.per * self.per
        if whole:  # straight from the caller's rows: no copy of them
            self._put(rows[:whole], start)
        if whole < len(rows):
            self._tail = rows[whole:].copy()

    def close(self) -> Files:
        """Write the last chunk; the objects written. Every row must be in."""
        if self.written != self.shape[0]:
            msg = f"{self.name}: {self.written} rows written of {self.shape[0]}"
            raise ValueError(msg)
        if self._tail is not None:
            self._put(self._tail, self.written - len(self._tail))
            self._tail = None
        return self.files

    def _put(self, rows: np.ndarray, start: int) -> None:
        self.files.update(
            write_chunks(
                self.backend,
                self.prefix,
                self.name,
                rows,
                self.per,
                self.fill_value,
                start,
                sync_soon=self.shape[0] >= SYNC_SOON_ROWS,
            )
        )


def write_chunks(
    backend: Backend,
    prefix: str,
    name: str,
    arr: np.ndarray,
    per: int,
    fill_value: float,
    start: int = 0,
    *,
    sync_soon: bool = False,
) -> Files:
    """Write rows ``start..`` of array ``name`` as its chunks of ``per`` rows.

    Each chunk is its rows' little-endian bytes (the last one padded with the fill
    value to a whole chunk, as zarr stores an edge chunk) followed by their
    crc32c. Returns (size, sha256) of each chunk by path in the run.
    ``sync_soon``: start each chunk's fsync as it is written (``Backend.write``).
    """
    suffix = "/0" * (arr.ndim - 1)  # a chunk spans every column
    dtype = arr.dtype.newbyteorder("<")

    def put(lo: int) -> tuple[str, tuple[int, str]]:
        body = np.ascontiguousarray(arr[lo : lo + per], dtype)
        if len(body) < per:
            whole = np.full((per, *arr.shape[1:]), fill_value, dtype)
            whole[: len(body)] = body
            body = whole
        data = body.tobytes()
        data += google_crc32c.value(data).to_bytes(4, "little")
        rel = f"{name}/c/{(start + lo) // per}{suffix}"
        backend.write(f"{prefix}/{rel}", data, sync_soon=sync_soon)
        return rel, (len(data), sha256(data))

    return dict(backend.map(put, range(0, len(arr), per)))
