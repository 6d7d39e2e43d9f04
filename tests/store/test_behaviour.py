"""The store's behaviour, one suite run on every backend (local folder, memory, S3)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore

from embedcache.errors import (
    DimensionMismatchError,
    InvalidAliasError,
    InvalidHashError,
    InvalidVectorError,
    StoreError,
)
from embedcache.specs import ModelKey
from embedcache.store import (
    SCHEMA_VERSION,
    EmbeddingStore,
    Fault,
    KeyInfo,
    merges,
)
from tests.store.worker import KEY, dataset, watching_collector

KEY_A = ModelKey(model_id="m/a", revision="a" * 40, adapter="t", adapter_version="1")
KEY_B = dataclasses.replace(KEY_A, rc_mode="average")


def hashes_of(n: int, prefix: str = "s") -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


def vectors_of(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


# --- basic behaviour ----------------------------------------------------------------


def test_put_get_roundtrip_in_any_order_with_missing(handle):
    store = handle.open()
    hs, vs = hashes_of(300), vectors_of(300)
    assert store.put(KEY_A, hs[:200], vs[:200]) == 200
    order = [*hs[250:], *hs[::-1][100:]]  # missing ones interleaved, reversed order
    got, found = store.get(KEY_A, order)
    assert got.dtype == np.float32
    assert got.shape == (len(order), 8)
    expected_found = np.array([hs.index(h) < 200 for h in order])
    np.testing.assert_array_equal(found, expected_found)
    np.testing.assert_array_equal(
        got[found], vs[[hs.index(h) for h in np.array(order)[found]]]
    )
    assert np.isnan(got[~found]).all()
    np.testing.assert_array_equal(store.contains(KEY_A, order), expected_found)
    sparse = [hs[199], hs[0], hs[199]]  # far apart, one twice: zarr picks the rows
    np.testing.assert_array_equal(store.get(KEY_A, sparse)[0], vs[[199, 0, 199]])
    # another instance (another process, on a shared backend) sees the same
    got2, found2 = handle.open(create=False).get(KEY_A, order)
    np.testing.assert_array_equal(found2, found)
    np.testing.assert_array_equal(got2[found], got[found])


def test_absent_key_gives_zero_width_and_nothing_found(handle):
    store = handle.open()
    got, found = store.get(KEY_A, hashes_of(3))
    assert got.shape == (3, 0)
    assert not found.any()
    assert not store.contains(KEY_A, hashes_of(3)).any()
    assert store.keys() == []


def test_reput_is_idempotent_and_in_call_duplicates_stored_once(handle):
    store = handle.open()
    hs, vs = hashes_of(10), vectors_of(10)
    assert store.put(KEY_A, [*hs, hs[0]], np.vstack([vs, vs[:1] + 1])) == 10
    before = handle.objects()
    assert store.put(KEY_A, hs, vs + 5) == 0
    assert handle.objects() == before  # nothing written at all
    got, _ = store.get(KEY_A, hs)
    np.testing.assert_array_equal(got, vs)  # first vector kept
    assert store.put(KEY_A, hashes_of(12), vectors_of(12)) == 2
    (info,) = store.keys()
    assert isinstance(info, KeyInfo)
    assert (info.n_vectors, info.dim, info.n_runs) == (12, 8, 2)
    assert info.nbytes > 12 * 8 * 4
    assert store.hashes(KEY_A) == sorted(hashes_of(12))
    assert store.hashes(KEY_B) == []


def test_dimension_mismatch_raises_naming_key_and_writes_nothing(handle):
    store = handle.open()
    store.put(KEY_A, hashes_of(4), vectors_of(4, dim=8))
    before = handle.objects()
    with pytest.raises(DimensionMismatchError, match=KEY_A.digest[:12]) as err:
        store.put(KEY_A, hashes_of(6), vectors_of(6, dim=9))
    assert "m/a" in str(err.value)
    with pytest.raises(DimensionMismatchError):
        store.put(KEY_A, hashes_of(6), vectors_of(5))  # rows disagree with hashes
    with pytest.raises(DimensionMismatchError, match="dtype"):
        store.put(KEY_A, hashes_of(2, "x"), np.ones((2, 8), dtype=np.int64))
    with pytest.raises(InvalidVectorError, match="row 1"):
        store.put(KEY_A, hashes_of(2, "y"), np.array([[0.0] * 8, [np.nan] * 8]))
    assert handle.objects() == before
    # another instance's view agrees: nothing was committed
    assert handle.open().keys()[0].n_vectors == 4


def test_malformed_hash_and_alias_are_named(handle):
    store = handle.open()
    bad = hashes_of(3)
    bad[1] = bad[1].upper()
    with pytest.raises(InvalidHashError, match=r"#1 '"):
        store.get(KEY_A, bad)
    with pytest.raises(InvalidHashError, match="abc"):
        store.put(KEY_A, ["abc"], vectors_of(1))
    with pytest.raises(InvalidHashError):
        store.contains(KEY_A, [hashes_of(1)[0][:-1] + "g"])
    with pytest.raises(InvalidAliasError, match="alias ''"):
        store.put(KEY_A, hashes_of(1), vectors_of(1), alias="")


def test_keys_with_different_fields_never_share_vectors(handle):
    store = handle.open()
    hs = hashes_of(20)
    va, vb = vectors_of(20, seed=1), vectors_of(20, seed=2)
    store.put(KEY_A, hs, va)
    assert not store.contains(KEY_B, hs).any()
    assert store.put(KEY_B, hs, vb) == 20
    np.testing.assert_array_equal(store.get(KEY_A, hs)[0], va)
    np.testing.assert_array_equal(store.get(KEY_B, hs)[0], vb)
    infos = {info.digest: info for info in store.keys()}  # noqa: SIM118
    assert set(infos) == {KEY_A.digest, KEY_B.digest}
    assert infos[KEY_B.digest].key == KEY_B
    # a key of another dim is fine: it is a separate group
    key_c = ModelKey(
        model_id="m/a", revision="a" * 40, adapter="t", adapter_version="2"
    )
    assert store.put(key_c, hs, vectors_of(20, dim=3)) == 20


def test_aliases_are_recorded_per_commit_and_survive_compaction(handle):
    store = handle.open(auto_merge=0)
    hs, vs = hashes_of(30), vectors_of(30)
    store.put(KEY_A, hs[:10], vs[:10], alias="caduceus-ph-local")
    store.put(KEY_A, hs[10:20], vs[10:20])
    # nothing new, but an alias the key does not list yet: an empty commit records it
    assert store.put(KEY_A, hs[:10], vs[:10], alias="renamed-copy") == 0
    assert store.put(KEY_A, hs[:10], vs[:10], alias="renamed-copy") == 0  # known now
    (info,) = handle.open().keys()
    assert info.aliases == ("caduceus-ph-local", "renamed-copy")
    assert (info.n_vectors, info.n_runs) == (20, 3)
    store.compact()
    (info,) = handle.open().keys()
    assert info.aliases == ("caduceus-ph-local", "renamed-copy")
    assert (info.n_vectors, info.n_runs) == (20, 1)
    np.testing.assert_array_equal(handle.open().get(KEY_A, hs[:20])[0], vs[:20])


def test_kernels_are_recorded_per_commit_kept_out_of_the_key_and_merged(handle):
    store = handle.open(auto_merge=0)
    hs, vs = hashes_of(30), vectors_of(30)
    amx = {"cpu_kind": "AMX", "torch": "2.13.0", "attention <=128": "math"}
    avx2 = {"cpu_kind": "AVX2", "torch": "2.13.0", "attention <=128": "flash"}
    store.put(KEY_A, hs[:10], vs[:10], kernels=amx)
    store.put(KEY_A, hs[10:20], vs[10:20], kernels=avx2)
    store.put(KEY_A, hs[20:], vs[20:])  # a writer that records none
    (info,) = handle.open().keys()
    # in the order of their canonical JSON ("flash" before "math")
    assert [json.loads(k) for k in info.kernels] == [avx2, amx]
    assert info.key == KEY_A  # one key whatever computed the vectors
    store.compact()
    (info,) = handle.open().keys()
    assert info.n_runs == 1
    assert [json.loads(k) for k in info.kernels] == [avx2, amx]


def test_a_record_without_kernels_reads_as_none_recorded():
    from embedcache.store.layout import CommitRecord

    bare = CommitRecord(
        run="r1", writer="w", n_rows=1, dim=4, order_ns=1, committed_ns=1,
        supersedes=(), aliases=(), files={},
    )  # fmt: skip
    doc = bare.to_doc()
    assert b"kernels" not in doc  # what an older writer wrote
    assert CommitRecord.from_doc(doc, run="r1", dim=4, where="t").kernels == ()
    kernels = ('{"cpu_kind": "AMX"}',)
    doc = dataclasses.replace(bare, kernels=kernels).to_doc()
    assert CommitRecord.from_doc(doc, run="r1", dim=4, where="t").kernels == kernels


def test_unknown_schema_version_and_foreign_data_are_rejected(handle):
    assert handle.open().put(KEY_A, hashes_of(3), vectors_of(3)) == 3
    doc = handle.read("zarr.json")
    written = f'"schema_version": {SCHEMA_VERSION}'.encode()
    assert written in doc
    handle.write("zarr.json", doc.replace(written, b'"schema_version": 99'))
    with pytest.raises(StoreError, match="schema_version 99") as err:
        handle.open()
    assert handle.location("zarr.json") in str(err.value)
    handle.write("zarr.json", doc.replace(b"embedcache-store", b"something-else"))
    with pytest.raises(StoreError, match="not an embedcache"):
        handle.open()


def test_foreign_location_is_not_adopted(handle):
    handle.write("notes.txt", b"hello")
    with pytest.raises(StoreError, match="not an embedcache store"):
        handle.open()
    handle.delete("notes.txt")
    with pytest.raises(StoreError, match="no embedcache store"):
        handle.open(create=False)


def test_a_store_another_writer_creates_while_we_look_is_adopted(handle, monkeypatch):
    from embedcache.store.backend import Backend

    assert handle.open().put(KEY_A, hashes_of(3), vectors_of(3)) == 3
    # we looked for zarr.json a moment before the other writer wrote it and its keys
    real = Backend.read_or_none
    looked: list[str] = []

    def stale_once(self, path):
        if path == "zarr.json" and not looked:
            looked.append(path)
            return None
        return real(self, path)

    monkeypatch.setattr(Backend, "read_or_none", stale_once)
    store = handle.open()
    assert looked
    np.testing.assert_array_equal(store.get(KEY_A, hashes_of(3))[0], vectors_of(3))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 60), dim=st.integers(1, 20), data=st.data())
def test_put_then_get_returns_the_same_vectors_in_any_order(n, dim, data):
    hs = hashes_of(n, prefix=f"{dim}-")
    vs = vectors_of(n, dim=dim, seed=n)
    perm = data.draw(st.permutations(range(n)))
    split = data.draw(st.integers(0, n))
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=2)
    stored = store.put(KEY_A, hs[:split], vs[:split])
    stored += store.put(KEY_A, hs, vs)
    assert stored == n
    got, found = EmbeddingStore(memory).get(KEY_A, [hs[i] for i in perm])
    assert found.all()
    np.testing.assert_array_equal(got, vs[perm])


# --- integrity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "damage"),
    [
        ("vectors/c/0/0", "flip"),
        ("vectors/c/0/0", "truncate"),
        ("hashes/c/0/0", "flip"),
        ("vectors/zarr.json", "flip"),
        ("sorted_hashes/c/0/0", "flip"),
        ("sorted_rows/c/0", "truncate"),
        ("fences/c/0/0", "flip"),
    ],
)
def test_a_corrupt_run_is_named_by_verify_and_quarantined_by_readers(
    handle, pattern, damage
):
    """Issue 41: one bad run never takes the key down. Readers skip it (its rows
    read as absent, to be recomputed), count it, and serve every other run."""
    store = handle.open(auto_merge=0)
    hs, vs = hashes_of(100), vectors_of(100)
    store.put(KEY_A, hs[:50], vs[:50])
    store.put(KEY_A, hs[50:], vs[50:])
    assert store.verify() == []
    target = handle.paths(f"{KEY_A.digest}/shards/*/{pattern}")[1]
    data = bytearray(handle.read(target))
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[-7:]
    handle.write(target, bytes(data))
    faults = handle.open().verify()
    assert faults
    assert all(isinstance(f, Fault) for f in faults)
    assert handle.location(target) in {f.path for f in faults}
    damaged = target.split("/")[2]
    first = store._view(KEY_A).runs[0].record.run
    bad, good = (slice(0, 50), slice(50, 100))[:: 1 if damaged == first else -1]
    fresh = handle.open()
    # stored-order hashes are read by whole-key reads, not by look-ups
    if pattern.startswith("hashes/"):
        assert fresh.hashes(KEY_A) == sorted(hs[good])
    else:
        got, found = fresh.get(KEY_A, hs)
        assert not found[bad].any()  # nothing served from the damaged run
        assert found[good].all()
        np.testing.assert_array_equal(got[good], vs[good])
    assert fresh.n_quarantined == 1
    # the already-open instance must not serve from the damaged object either
    # (its index was loaded before the damage, so only the chunk checks stand guard)
    if pattern.startswith("vectors/c"):
        got, found = store.get(KEY_A, hs)
        assert not found[bad].any()
        np.testing.assert_array_equal(got[good], vs[good])
        assert store.n_quarantined == 1


def test_a_deleted_chunk_is_never_read_as_fill_values(handle):
    store = handle.open(auto_merge=0)
    hs, vs = hashes_of(40), vectors_of(40)
    store.put(KEY_A, hs, vs)
    (chunk,) = handle.paths(f"{KEY_A.digest}/shards/*/vectors/c/0/0")
    handle.delete(chunk)
    assert not store.get(KEY_A, hs[:3])[1].any()  # quarantined, not zeros
    assert store.n_quarantined == 1
    assert handle.location(chunk) in {f.path for f in store.verify()}


def test_an_unparsable_log_entry_is_skipped_not_fatal(handle):
    store = handle.open(auto_merge=0)
    hs, vs = hashes_of(20), vectors_of(20)
    store.put(KEY_A, hs[:10], vs[:10])
    store.put(KEY_A, hs[10:], vs[10:])
    entries = handle.paths(f"{KEY_A.digest}/log/*/zarr.json")
    handle.write(entries[-1], b"{not json")
    fresh = handle.open()
    got, found = fresh.get(KEY_A, hs)
    assert found[:10].all()
    assert not found[10:].any()
    np.testing.assert_array_equal(got[:10], vs[:10])
    assert fresh.n_quarantined == 1
    assert handle.location(entries[-1]) in {f.path for f in fresh.verify()}


def test_compact_is_atomic_if_interrupted_after_commit(handle, monkeypatch):
    store = handle.open(auto_merge=0)
    hs, vs = hashes_of(90), vectors_of(90)
    for i in range(0, 90, 30):
        store.put(KEY_A, hs[i : i + 30], vs[i : i + 30])

    def crash(view, run):
        raise KeyboardInterrupt  # the merged run is published; nothing else done

    monkeypatch.setattr(merges, "adopt", crash)
    with pytest.raises(KeyboardInterrupt):
        store.compact()
    monkeypatch.undo()
    fresh = handle.open()
    got, found = fresh.get(KEY_A, hs)
    assert found.all()
    np.testing.assert_array_equal(got, vs)
    assert fresh.verify() == []
    assert fresh.keys()[0].n_runs == 1  # the merged run hides the old ones
    # merged away: readers of an older snapshot may read them for the grace
    assert len(handle.paths(f"{KEY_A.digest}/shards/*/zarr.json")) >= 4
    assert fresh.garbage() == []
    later = watching_collector(handle)  # has watched them for longer than it
    later.compact()
    assert later.garbage() == []
    assert {
        p.split("/")[2] for p in handle.paths(f"{KEY_A.digest}/shards/*/zarr.json")
    } == {fresh._view(KEY_A).runs[0].record.run}
    np.testing.assert_array_equal(handle.open().get(KEY_A, hs)[0], vs)


def test_uncommitted_leftovers_are_garbage_not_faults(handle):
    store = handle.open()
    hs, vs = hashes_of(10), vectors_of(10)
    store.put(KEY_A, hs, vs)
    # an older writer's run name (writer~host~pid~random): it has no lease
    leftover = f"{KEY_A.digest}/shards/w~otherhost~1~000001"
    handle.write(f"{leftover}/zarr.json", b"{half written")
    assert store.verify() == []
    assert store.garbage() == [handle.location(leftover)]
    np.testing.assert_array_equal(handle.open().get(KEY_A, hs)[0], vs)
    store.compact()
    assert store.garbage() == [handle.location(leftover)]  # recent: may be at work
    # gone once a collector saw it unchanged for a lease and margin of its clock
    later = watching_collector(handle)
    later.compact()
    assert later.garbage() == []
    np.testing.assert_array_equal(handle.open().get(KEY_A, hs)[0], vs)


# --- concurrency and crash safety ---------------------------------------------------


N_ROWS = 1200


def test_concurrent_writers_in_threads_lose_nothing(handle):
    """Two instances writing overlapping sets at once, as two processes would."""
    hashes, vectors = dataset(600)
    handle.open()

    def write(rows):
        store = handle.open(auto_merge=4)
        for i in range(0, len(rows), 30):
            part = rows[i : i + 30]
            store.put(KEY, [hashes[r] for r in part], vectors[part])

    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(write, list(range(450))),
            pool.submit(write, list(range(150, 600))[::-1]),
        ]
        for run in runs:
            run.result()  # re-raises a writer's error
    store = handle.open()
    got, found = store.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert store.verify() == []
    store.compact()
    assert store.keys()[0].n_runs == 1
    assert store.keys()[0].n_vectors == 600


def test_two_concurrent_writer_processes_with_overlapping_sets(process_handle):
    hashes, vectors = dataset(N_ROWS)
    process_handle.open()  # both writers open an existing, empty store
    args = [
        ["--start", "0", "--stop", str(N_ROWS * 3 // 4), "--batch", "30"],
        ["--start", str(N_ROWS // 4), "--stop", str(N_ROWS), "--batch", "30", "-r"],
    ]
    procs = [
        subprocess.Popen(process_handle.worker(*a), stdout=subprocess.PIPE, text=True)
        for a in args
    ]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    store = process_handle.open()
    got, found = store.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)  # same values as one writer
    assert store.keys()[0].n_vectors == N_ROWS  # each hash once in the logical view
    assert store.verify() == []
    store.compact()
    (merged,) = store._view(KEY).runs  # the runs merged away wait for their grace
    hashes_chunk = f"{KEY.digest}/shards/{merged.record.run}/hashes/zarr.json"
    assert b"[\n    1200,\n    32\n  ]" in process_handle.read(hashes_chunk)
    np.testing.assert_array_equal(process_handle.open().get(KEY, hashes)[0], vectors)
    assert store.verify() == []


def test_kill_minus_9_at_random_moments_loses_no_committed_row(process_handle):
    hashes, vectors = dataset(N_ROWS)
    rng = random.Random(20261006)
    n_trials = 4 if process_handle.kind == "local" else 2
    base = process_handle.root
    for trial in range(n_trials):
        process_handle.root = f"{base}-{trial}"  # a new store each trial
        proc = subprocess.Popen(
            process_handle.worker("--stop", str(N_ROWS), "--batch", "40"),
            stdout=subprocess.PIPE,
            text=True,
        )
        target = rng.randint(1, 20)
        committed: set[int] = set()
        assert proc.stdout is not None
        for line in proc.stdout:
            _, _, first, last = line.split()
            committed.update(range(int(first), int(last) + 1))
            if len(committed) >= target * 40:
                break
        time.sleep(rng.uniform(0, 0.05))  # land inside a put, a merge or an fsync
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()

        store = process_handle.open()
        got, found = store.get(KEY, hashes)
        assert found[sorted(committed)].all(), (
            f"trial {trial}: a committed row was lost"
        )
        np.testing.assert_array_equal(got[found], vectors[found])
        assert store.verify() == [], f"trial {trial}"
        n_before = int(found.sum())

        done = process_handle.run_worker("--stop", str(N_ROWS), "--batch", "40")
        total = int(done.stdout.split()[-1])
        assert total == N_ROWS - n_before  # resuming wrote only what was missing
        # a collector past the killed writer's lease and margin also removes its
        # leftovers (its lease would keep them until then)
        reopened = watching_collector(process_handle)
        reopened.compact()
        assert reopened.garbage() == []
        got, found = reopened.get(KEY, hashes)
        assert found.all()
        np.testing.assert_array_equal(got, vectors)  # identical to an uninterrupted run
        assert reopened.verify() == []
        assert reopened.keys()[0].n_vectors == N_ROWS


def test_compacting_while_two_processes_write_and_read(process_handle):
    hashes, vectors = dataset(N_ROWS)
    process_handle.open()
    args = [
        ["--start", "0", "--stop", str(N_ROWS * 3 // 4), "--batch", "20"],
        ["--start", str(N_ROWS // 4), "--stop", str(N_ROWS), "--reverse"],
    ]
    procs = [
        subprocess.Popen(process_handle.worker(*a), stdout=subprocess.DEVNULL)
        for a in args
    ]
    compactor = process_handle.open()
    n_compactions = 0
    ever_found = np.zeros(N_ROWS, bool)
    while any(p.poll() is None for p in procs):
        compactor.compact()
        n_compactions += 1
        got, found = compactor.get(KEY, hashes)  # never a torn or wrong row
        if found.any():
            np.testing.assert_array_equal(got[found], vectors[found])
        assert found[ever_found].all()  # a row once visible never disappears
        ever_found |= found
    assert all(p.returncode == 0 for p in procs)
    assert n_compactions > 1
    compactor.compact()
    got, found = process_handle.open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert compactor.verify() == []
    assert compactor.keys()[0].n_runs == 1


def test_scattered_rows_of_a_big_run_read_window_by_window(handle, monkeypatch):
    from embedcache.store import run_reads

    store = handle.open(auto_merge=0)
    hs, vs = hashes_of(900), vectors_of(900)
    store.put(KEY_A, hs[:600], vs[:600])
    store.put(KEY_A, hs[600:], vs[600:])
    rng = np.random.default_rng(1)
    # dense, sparse, repeated and in reverse: each read path of a run
    order = [*hs[::2], *hs[700:300:-1], *rng.choice(hs, 50).tolist(), hs[5]]
    expected = vs[[hs.index(h) for h in order]]
    whole, _ = store.get(KEY_A, order)
    # a span of at most 3 rows (dim 8): every pick from a window of its own
    monkeypatch.setattr(run_reads, "SPAN_BYTES", 3 * 4 * 8)
    fresh = handle.open()  # no chunk or view cached from the first read
    windowed, found = fresh.get(KEY_A, order)
    assert found.all()
    np.testing.assert_array_equal(whole, expected)
    np.testing.assert_array_equal(windowed, expected)
    # the whole key in stored order (across both runs) and in sorted order
    np.testing.assert_array_equal(fresh.get(KEY_A, hs)[0], vs)
    sorted_hs = sorted(hs)
    np.testing.assert_array_equal(
        fresh.get(KEY_A, sorted_hs)[0], vs[[hs.index(h) for h in sorted_hs]]
    )


def test_a_look_up_of_a_missing_key_frees_its_hashes_at_once(handle):
    import gc
    import weakref

    class Hashes(list):  # a list that can be watched
        pass

    store = handle.open()
    hashes = Hashes(hashes_of(3))
    watch = weakref.ref(hashes)
    gc.disable()  # only reference counting: a cycle would keep the caller's frame
    try:
        assert not store.contains(KEY_A, hashes).any()
        assert store.get(KEY_A, hashes)[0].shape == (3, 0)
        del hashes
        assert watch() is None
    finally:
        gc.enable()
