"""The streamed merge writes the very objects the whole-key merge wrote.

The expected run is made here from the input runs with plain numpy (which rows
win, the stored order, the sorted index, the filter) and written to bytes by a
copy of the chunk and metadata layout the store wrote before the merge streamed
(bytes + crc32c chunks, zarr's ``zarr.json``). Every object of the merged run
but the group document (its attributes name the writer and the time) must have
the same size and sha256 in the commit record.
"""

from __future__ import annotations

import hashlib
import tracemalloc

import google_crc32c
import numpy as np
import pytest
import zarr
from obstore.store import MemoryStore
from zarr.codecs import Crc32cCodec
from zarr.storage import MemoryStore as ZarrMemoryStore

from embedcache.specs import ModelKey
from embedcache.store import (
    EmbeddingStore,
    merged_runs,
    merges,
    run_reads,
    run_writes,
)
from embedcache.store.commits import commit_run as commit
from embedcache.store.run_writes import rows_in_hand
from embedcache.store.snapshots import adopt

KEY = ModelKey(
    model_id="test/merge", revision="0" * 40, adapter="t", adapter_version="1"
)
DIM = 3


def digests(ids: np.ndarray) -> np.ndarray:
    return np.frombuffer(
        b"".join(hashlib.sha256(f"m{i}".encode()).digest() for i in ids), "S32"
    )


# --- the layout written before the merge streamed (a frozen copy) --------------------


def array_doc(shape, dtype, fill_value, per):
    docs = {}
    zarr.create_array(
        store=ZarrMemoryStore(docs),
        shape=shape,
        dtype=dtype,
        chunks=(max(1, per), *shape[1:]),
        filters=None,
        compressors=[Crc32cCodec()],
        fill_value=fill_value,
    )
    return docs["zarr.json"].to_bytes()


def array_files(name, arr, per, fill_value):
    """(size, sha256) of ``name``'s metadata and each chunk, by path in the run."""
    files = {}
    doc = array_doc(arr.shape, arr.dtype.name, fill_value, per)
    files[f"{name}/zarr.json"] = doc
    suffix = "/0" * (arr.ndim - 1)
    for lo in range(0, len(arr), max(1, per)):
        body = np.full((per, *arr.shape[1:]), fill_value, arr.dtype)
        body[: len(arr[lo : lo + per])] = arr[lo : lo + per]
        data = body.astype(arr.dtype.newbyteorder("<")).tobytes()
        data += google_crc32c.value(data).to_bytes(4, "little")
        files[f"{name}/c/{lo // per}{suffix}"] = data
    return {rel: (len(d), hashlib.sha256(d).hexdigest()) for rel, d in files.items()}


def rows_per_chunk(n, row_bytes):
    return max(
        1, min(max(n, 1), run_reads.CHUNK_BYTES // row_bytes, run_reads.CHUNK_MAX_ROWS)
    )


def bloom(keys):
    """The split-block Bloom filter: 20 bits a key; a key sets, in the block of 8
    words its bytes 8-15 choose, one bit in each word (the low 6 bits of bytes 16-23)."""
    raw = keys.view(np.uint8).reshape(-1, 32)
    n_blocks = max(1, -(-len(keys) * 20 // 512))
    words = [0] * (8 * n_blocks)
    for row in raw:
        block = int.from_bytes(row[8:16].tobytes(), "little") % n_blocks
        for w in range(8):
            words[8 * block + w] |= 1 << (int(row[16 + w]) & 63)
    return np.array(words, np.uint64)


def expected_files(keys, vectors):
    """Every object but the group document of a run holding ``keys`` (distinct,
    S32) and ``vectors`` in this stored order."""
    n = len(keys)
    raw = keys.view(np.uint8).reshape(-1, 32)
    order = np.argsort(keys, kind="stable")
    ranked = raw[order]
    words = bloom(keys)
    files = {}
    files.update(array_files("vectors", vectors, rows_per_chunk(n, 4 * DIM), np.nan))
    files.update(array_files("hashes", raw, rows_per_chunk(n, 32), 0))
    files.update(array_files("sorted_hashes", ranked, 1024, 0))
    files.update(array_files("sorted_rows", order.astype(np.uint32), 16384, 0))
    fences = ranked[::1024]
    files.update(array_files("fences", fences, len(fences), 0))
    files.update(array_files("bloom", words, min(len(words), 1 << 19), 0))
    return files


# --- the store ------------------------------------------------------------------------


def commit_run(store, keys, vectors):
    """One run of exactly these rows (``put`` would skip hashes stored already)."""
    view = store._snapshot(KEY, max_age=0.0, create_dim=DIM)[0]
    adopt(
        view,
        commit(store._backend, view, store._writer, rows_in_hand(keys, vectors)),
    )


def build_runs(rng):
    """Six runs in commit order; runs 1, 2 and 4 are merged. Shared hashes: inside
    the chosen runs (1 and 2, 2 and 4), with an earlier unchosen run (0 holds some
    of 1's, 2's and 4's: dropped; 3 holds some of 4's: dropped), and with later
    unchosen runs (3 and 5 hold some of 1's: kept)."""
    ids = [
        np.arange(0, 1500),  # 0, not chosen
        np.arange(1000, 4000),  # 1, chosen: 1000-1499 held by run 0
        np.concatenate([np.arange(3500, 5200), np.arange(200, 400)]),  # 2, chosen
        np.concatenate([np.arange(6000, 6300), np.arange(2000, 2100)]),  # 3
        np.concatenate([np.arange(6100, 8800), np.arange(4900, 5100)]),  # 4, chosen
        np.concatenate([np.arange(9000, 9100), np.arange(3000, 3300)]),  # 5
    ]
    runs = []
    for part in ids:
        part = rng.permutation(part)  # stored order is not key order
        runs.append(
            (digests(part), rng.standard_normal((len(part), DIM)).astype(np.float32))
        )
    return runs


def expected_merge(runs, chosen):
    """The merged run's keys and vectors in stored order, with plain numpy."""
    keys, vectors, seen = [], [], set()
    for j in chosen:
        unchosen = [i for i in range(j) if i not in chosen]
        earlier = set().union(*(runs[i][0].tolist() for i in unchosen))
        for key, vec in zip(runs[j][0].tolist(), runs[j][1], strict=True):
            if key not in seen and key not in earlier:
                keys.append(key)
                vectors.append(vec)
            seen.add(key)
    return np.array(keys, "S32"), np.array(vectors, np.float32).reshape(-1, DIM)


@pytest.mark.parametrize(
    ("merge_rows", "max_chunk"),
    [(64, 100), (1 << 17, run_reads.CHUNK_MAX_ROWS), (7, 333)],
)
def test_streamed_merge_writes_the_objects_of_the_whole_key_merge(
    monkeypatch, merge_rows, max_chunk
):
    # small steps and chunks: the runs span many steps of the merge and many
    # chunks of its vectors and hashes, each step across sorted-index blocks
    monkeypatch.setattr(merged_runs, "MERGE_ROWS", merge_rows)
    monkeypatch.setattr(merged_runs, "COPY_BYTES", 2 * max_chunk * 4 * DIM)
    monkeypatch.setattr(run_reads, "CHUNK_MAX_ROWS", max_chunk)
    # metadata documents are cached by shape: made again for these chunk sizes
    run_writes._array_doc.cache_clear()
    monkeypatch.setattr(run_writes, "_array_doc", run_writes._array_doc.__wrapped__)
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=0)
    runs = build_runs(np.random.default_rng(merge_rows))
    for keys, vectors in runs:
        commit_run(store, keys, vectors)
    view = store._snapshot(KEY, max_age=0.0)[0]
    ids = [s.record.run for s in view.runs]
    chosen = [1, 2, 4]
    record = merges.merge(store._backend, view, store._writer, [ids[j] for j in chosen])
    keys, vectors = expected_merge(runs, chosen)
    # each kind of shared hash occurs, and the merged run spans several blocks
    assert 6000 < len(keys) < sum(len(r[0]) for j, r in enumerate(runs) if j in chosen)
    assert record.n_rows == len(keys)
    got = {rel: v for rel, v in record.files.items() if rel != "zarr.json"}
    want = expected_files(keys, vectors)
    assert sorted(got) == sorted(want)
    assert got == want
    # and it reads back, with the unchosen runs, as the first commit of each hash
    fresh = EmbeddingStore(memory)
    every = np.unique(np.concatenate([r[0] for r in runs]))
    first = {}
    for keys_j, vectors_j in runs:
        for key, vec in zip(keys_j.tolist(), vectors_j, strict=True):
            first.setdefault(key, vec)
    out = np.empty((len(every), DIM), np.float32)
    assert fresh.read_into(KEY, every, out).all()
    np.testing.assert_array_equal(out, np.array([first[k] for k in every.tolist()]))
    assert fresh.verify() == []


def test_a_merge_whose_rows_an_earlier_run_holds_writes_an_empty_run():
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=0)
    rng = np.random.default_rng(3)
    every = digests(np.arange(2000))
    runs = [(every, rng.standard_normal((2000, DIM)).astype(np.float32))]
    for part in (every[:1500], every[700:]):
        runs.append((part, rng.standard_normal((len(part), DIM)).astype(np.float32)))
    for keys, vectors in runs:
        commit_run(store, keys, vectors)
    view = store._snapshot(KEY, max_age=0.0)[0]
    ids = [s.record.run for s in view.runs]
    record = merges.merge(store._backend, view, store._writer, ids[1:])
    assert record.n_rows == 0
    got = {rel: v for rel, v in record.files.items() if rel != "zarr.json"}
    assert got == expected_files(np.empty(0, "S32"), np.empty((0, DIM), np.float32))
    fresh = EmbeddingStore(memory)
    out = np.empty((len(every), DIM), np.float32)
    assert fresh.read_into(KEY, every, out).all()
    np.testing.assert_array_equal(out, runs[0][1])
    assert fresh.verify() == []


def test_a_key_of_several_runs_counts_its_distinct_hashes_a_step_at_a_time(
    monkeypatch,
):
    monkeypatch.setattr(merged_runs, "MERGE_ROWS", 256)
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=0)
    rng = np.random.default_rng(5)
    parts = [
        np.arange(0, 100_000),
        np.arange(80_000, 180_000),
        np.arange(150_000, 250_000),
    ]
    for ids in parts:  # overlapping runs, as two writers with stale views leave them
        keys = digests(ids)
        commit_run(store, keys, rng.standard_normal((len(ids), DIM)).astype(np.float32))
    every_bytes = 300_000 * 32
    fresh = EmbeddingStore(memory)
    tracemalloc.start()
    try:
        (info,) = fresh.keys()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.n_vectors == 250_000
    assert info.n_runs == 3
    # the whole-key count held every hash and a sorted copy (2x these bytes); a
    # step at a time holds a few steps and the merge's chunk cache
    assert peak < every_bytes / 2, peak
