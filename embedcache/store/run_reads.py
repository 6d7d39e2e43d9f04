"""Run reads through zarr: open a committed run, read its rows and hashes.

A run is a group of arrays, all with the ``bytes`` + ``crc32c`` codecs, so every
chunk read is checked: ``vectors`` (n, dim) float32 and ``hashes`` (n, 32) uint8 in
stored order, and its sorted index (``runs``): ``sorted_hashes``, ``sorted_rows``,
``fences`` and ``bloom``. Opening a run reads only its fences, checked against the
sha256 in its commit record; the vectors' metadata is checked the same way at the
first read of a vector.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.core.array import AsyncArray
from zarr.core.buffer.cpu import NDBuffer
from zarr.storage import StorePath

from embedcache.errors import CorruptStoreError
from embedcache.store import runs
from embedcache.store.chunks import (
    MissingObjectError,
    find_bad_chunk,
    is_run,
    read_span,
)
from embedcache.store.layout import (
    HASH_WIDTH,
    RUN_META_FILES,
    log_prefix,
    parse_json,
    run_prefix,
    sha256,
)
from embedcache.store.runs import Run

if TYPE_CHECKING:
    from embedcache.store.backend import Backend
    from embedcache.store.layout import CommitRecord

logger = logging.getLogger(__name__)

# ~4 MiB chunks: 2048 rows at dim 512 (benchmarks/store_bench.py: fewer, larger
# chunks read faster through zarr and cost fewer requests on object stores)
CHUNK_BYTES = 1 << 22
# ...and at most this many rows (narrow vectors: a look-up of one row reads one
# chunk whole, as its crc32c covers it whole; 256 KiB at dim 4)
CHUNK_MAX_ROWS = 16384
# a read of scattered rows holds at most this much of a run at once beside the
# rows it picks, per reading thread (a merged run may hold a whole run: reading
# its span in one piece would cost as much memory as the run's output)
SPAN_BYTES = 1 << 23
# every chunk is written, so every one is checked (a missing one is an error)
_ARRAY_CONFIG = {"write_empty_chunks": True}
INDEX_ARRAYS = ("sorted_hashes", "sorted_rows", "fences", "bloom")


def chunk_rows(n: int, row_bytes: int) -> int:
    return max(1, min(max(n, 1), CHUNK_BYTES // row_bytes, CHUNK_MAX_ROWS))


def _array(zstore: Any, path: str, doc: bytes) -> Any:  # noqa: ANN401
    """A zarr array at ``path`` from its (already read and checked) metadata."""
    meta = json.loads(doc)
    return zarr.Array(AsyncArray(meta, StorePath(zstore, path), config=_ARRAY_CONFIG))


def corrupt(
    backend: Backend, path: str, problem: str, digest: str, run: str
) -> CorruptStoreError:
    msg = (
        f"{backend.describe(path)}: {problem}. Run {run} is not trusted and no data "
        f"is served from it. Run `embedcache store verify --store {backend.location}`; "
        "readers skip it (its rows are recomputed); to drop it for good delete the "
        f"entry naming it in {backend.describe(log_prefix(digest))}."
    )
    err = CorruptStoreError(msg)
    err.run = run  # type: ignore[attr-defined] (which run to quarantine)
    return err


def check_array_meta(meta: dict[str, Any], shape: tuple[int, ...], dtype: str) -> None:
    """Raise ValueError unless ``meta`` is an array this schema reads safely."""
    grid = meta.get("chunk_grid", {})
    chunk_shape = grid.get("configuration", {}).get("chunk_shape")
    codecs = meta.get("codecs")
    problems = []
    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        problems.append("not a zarr v3 array")
    if list(meta.get("shape", [])) != list(shape):
        problems.append(f"shape {meta.get('shape')} != {list(shape)} in commit record")
    if meta.get("data_type") != dtype:
        problems.append(f"data_type {meta.get('data_type')!r} != {dtype!r}")
    if (
        grid.get("name") != "regular"
        or not isinstance(chunk_shape, list)
        or len(chunk_shape) != len(shape)
        or list(chunk_shape[1:]) != list(shape[1:])
    ):
        problems.append(f"unexpected chunk grid {grid}")
    names = [c.get("name") for c in codecs] if isinstance(codecs, list) else []
    endian = (codecs[0].get("configuration") or {}).get("endian") if names else None
    # crc32c last: zarr checks every chunk against it before decoding anything
    if names != ["bytes", "crc32c"] or endian not in (None, "little"):
        problems.append(f"unexpected codecs {codecs} (the store writes bytes + crc32c)")
    if problems:
        raise ValueError("; ".join(problems))


def open_run(backend: Backend, digest: str, record: CommitRecord) -> Run:
    """Open a committed run as a sorted run: read its fences (one object).

    The fences chunk is checked against the record's sha256; the other arrays'
    chunks are checked by their crc32c as they are read, and the vectors' metadata
    against the record at the first read (:func:`vectors_of`).

    Raises
    ------
    MissingObjectError
        An object is absent (the caller tells retired from lost).
    CorruptStoreError
        The record lacks an array of the schema, or the fences differ from it.
    """
    prefix = run_prefix(digest, record.run)
    missing = [rel for rel in RUN_META_FILES if rel not in record.files]
    if missing:
        problem = f"commit record lists no {missing[0]}"
        raise corrupt(backend, prefix, problem, digest, record.run)
    run = Run(record=record, prefix=prefix)
    if record.n_rows:
        rel = "fences/c/0/0"
        path = f"{prefix}/{rel}"
        doc = backend.read_or_none(path)
        if doc is None:
            raise MissingObjectError(path)
        if rel not in record.files or sha256(doc) != record.files[rel][1]:
            problem = "sha256 differs from the commit record"
            raise corrupt(backend, path, problem, digest, record.run)
        run.fences = runs.load_fences_from(doc, record.n_rows)
    else:
        run.fences = np.empty(0, "S32")
    return run


def read_keys(
    backend: Backend, digest: str, run: Run, lo: int = 0, hi: int | None = None
) -> np.ndarray:
    """The hashes of a run's stored rows ``lo..hi`` (default: all), in stored
    order ((k,) S32): one sequential read.

    Raises
    ------
    MissingObjectError, CorruptStoreError
        As :func:`open_run`.
    """
    record, n = run.record, run.record.n_rows
    hi = n if hi is None else min(hi, n)
    hashes = _checked_array(backend, digest, record, "hashes", (n, HASH_WIDTH), "uint8")
    try:
        raw = (
            np.ascontiguousarray(hashes[lo:hi], np.uint8)
            if hi > lo
            else np.empty((0, HASH_WIDTH), np.uint8)
        )
    except ValueError as err:  # zarr: a chunk failed its crc32c or cannot decode
        path, problem = f"{run.prefix}/hashes", f"a chunk failed its check ({err})"
        raise corrupt(backend, path, problem, digest, record.run) from err
    # a missing chunk reads as zarr's fill value; no sha256 is all zero
    if len(raw) and not raw.any(axis=1).all():
        path = f"{run.prefix}/hashes/c"
        raise MissingObjectError(path)
    return raw.view("S32").reshape(-1)  # a view: no copy of the hashes


def vectors_of(backend: Backend, digest: str, run: Run) -> Any:  # noqa: ANN401
    """The run's vectors array, its metadata checked against the record once."""
    if run.vectors is None:
        shape = (run.record.n_rows, run.record.dim)
        run.vectors = _checked_array(
            backend, digest, run.record, "vectors", shape, "float32"
        )
    return run.vectors


def _checked_array(
    backend: Backend,
    digest: str,
    record: CommitRecord,
    name: str,
    shape: tuple[int, ...],
    dtype: str,
) -> Any:  # noqa: ANN401
    rel = f"{name}/zarr.json"
    path = f"{run_prefix(digest, record.run)}/{rel}"
    doc = backend.read_or_none(path)
    if doc is None:
        raise MissingObjectError(path)
    try:
        if sha256(doc) != record.files[rel][1]:
            msg = "sha256 differs from the commit record"
            raise ValueError(msg)
        check_array_meta(parse_json(doc, backend.describe(path)), shape, dtype)
    except (ValueError, CorruptStoreError) as err:
        raise corrupt(backend, path, str(err), digest, record.run) from err
    return _array(backend.zarr_store(), path.removesuffix("/zarr.json"), doc)


def read_rows(
    backend: Backend,
    digest: str,
    run: Run,
    rows: np.ndarray,
    out: np.ndarray,
    dest: np.ndarray,
    cache: runs.BlockCache | None = None,
) -> None:
    """out[dest] = rows ``rows`` of the run's vectors, every chunk crc-checked.

    With ``cache``, the chunks of scattered rows are kept there (a server's
    repeated hits then read nothing).
    """
    k = len(rows)
    if not k:
        return
    arr = vectors_of(backend, digest, run)
    try:
        if cache is not None and k < int(arr.chunks[0]):  # a few rows: cached chunks
            uniq, inverse = np.unique(rows, return_inverse=True)
            values = _sparse_rows(backend, run.prefix, arr, uniq, out.shape[1], cache)
            out[dest] = values[inverse]
            served = values[:, 0]
        elif is_run(rows) and is_run(dest):  # rows in stored order: no copy
            r0, d0 = int(rows[0]), int(dest[0])
            target = out[d0 : d0 + k]
            if not read_span(backend, run.prefix, arr, r0, target):
                arr.get_basic_selection(
                    (slice(r0, r0 + k), slice(None)),
                    out=NDBuffer.from_numpy_array(target),
                )
            served = target[:, 0]
        else:
            uniq, inverse = np.unique(rows, return_inverse=True)
            values = _pick_rows(backend, run.prefix, arr, uniq, out.shape[1], cache)
            if is_run(dest):  # one pass straight into the output
                d0 = int(dest[0])
                np.take(values, inverse, axis=0, out=out[d0 : d0 + k])
            else:
                out[dest] = values[inverse]
            served = values[:, 0]
    except ValueError as err:  # zarr: a chunk failed its crc32c or cannot decode
        path, problem = find_bad_chunk(arr, run.prefix, rows, err)
        raise corrupt(backend, path, problem, digest, run.record.run) from err
    # stored vectors are finite; NaN is zarr's fill value for a missing chunk
    if np.isnan(served).any():
        path = f"{run.prefix}/vectors/c"
        raise MissingObjectError(path)


def _pick_rows(
    backend: Backend,
    prefix: str,
    arr: Any,  # noqa: ANN401
    uniq: np.ndarray,
    dim: int,
    cache: runs.BlockCache | None = None,
) -> np.ndarray:
    """Rows ``uniq`` (sorted, distinct) of the vectors, window by window.

    A window spans at most :data:`SPAN_BYTES` of rows: where its rows are dense it
    is read whole and picked from in memory, else only their chunks are read.
    """
    values = np.empty((len(uniq), dim), np.float32)
    window = max(1, SPAN_BYTES // (4 * dim))
    j = 0
    while j < len(uniq):
        lo = int(uniq[j])
        k = int(np.searchsorted(uniq, lo + window))
        part, hi = uniq[j:k], int(uniq[k - 1]) + 1
        if 4 * len(part) >= hi - lo:  # dense: read the span, pick in memory
            whole = len(part) == hi - lo  # every row of the span: read in place
            span = values[j:k] if whole else np.empty((hi - lo, dim), np.float32)
            if not read_span(backend, prefix, arr, lo, span):
                span[...] = arr.get_basic_selection((slice(lo, hi), slice(None)))
            if not whole:
                values[j:k] = span[part - lo]
        else:  # sparse: only the chunks holding these rows
            values[j:k] = _sparse_rows(backend, prefix, arr, part, dim, cache)
        j = k
    return values


def _sparse_rows(
    backend: Backend,
    prefix: str,
    arr: Any,  # noqa: ANN401
    part: np.ndarray,
    dim: int,
    cache: runs.BlockCache | None,
) -> np.ndarray:
    """Rows ``part`` (sorted) read chunk by chunk, each chunk whole (its crc32c
    covers it whole), in parallel; through ``cache`` when given."""
    per, n = int(arr.chunks[0]), int(arr.shape[0])
    # not np.unique: its hashing releases the GIL (see runs.SMALL_SEARCH)
    wanted = sorted(set((part // per).tolist()))

    def load(c: int) -> np.ndarray:
        lo = c * per
        block = np.empty((min(per, n - lo), dim), np.float32)
        if not read_span(backend, prefix, arr, lo, block):
            block[...] = arr.get_basic_selection(
                (slice(lo, lo + len(block)), slice(None))
            )
        return block

    def get(c: int) -> np.ndarray:
        return (
            load(c) if cache is None else cache.get((prefix, "v", c), lambda: load(c))
        )

    loaded = (
        backend.map(get, wanted)
        if cache is None
        else runs.map_cached(
            backend, get, wanted, lambda c: cache.has((prefix, "v", c))
        )
    )
    blocks = dict(zip(wanted, loaded, strict=True))
    out = np.empty((len(part), dim), np.float32)
    which = part // per
    for c, block in blocks.items():
        sel = which == c
        out[sel] = block[part[sel] - c * per]
    return out
