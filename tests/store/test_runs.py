"""Sorted runs and snapshot views: look-ups through fences equal a brute-force dict
(first commit wins, across overlapping runs, before and after compaction), new
runs join a view without reopening the others, and a second instance sees another
writer's commits after ``refresh_seconds`` (at once with 0)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore

from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, reads, runs, snapshots
from embedcache.store.commits import commit_run
from embedcache.store.run_writes import rows_in_hand
from embedcache.store.snapshots import adopt

KEY = ModelKey(
    model_id="test/runs", revision="0" * 40, adapter="t", adapter_version="1"
)


def hash_of(i: int) -> str:
    return hashlib.sha256(f"r{i}".encode()).hexdigest()


def commit_raw(store: EmbeddingStore, ids: list[int], vectors: np.ndarray) -> None:
    """Commit one run of exactly these hashes (``put`` would skip stored ones), as
    a writer with a stale view would."""
    view = store._snapshot(KEY, max_age=0.0, create_dim=vectors.shape[1])[0]
    keys = np.frombuffer(b"".join(bytes.fromhex(hash_of(i)) for i in ids), "S32")
    run = commit_run(store._backend, view, store._writer, rows_in_hand(keys, vectors))
    adopt(view, run)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    put_ids=st.lists(
        st.lists(st.integers(0, 60), min_size=0, max_size=40, unique=True),
        min_size=1,
        max_size=6,
    ),
    asked=st.lists(st.integers(0, 70), max_size=60),
    block=st.sampled_from([1, 3, 8, 1024]),
    bloom=st.booleans(),
    compact=st.booleans(),
)
def test_look_ups_through_fences_equal_a_dict_first_commit_wins(
    put_ids, asked, block, bloom, compact
):
    with pytest.MonkeyPatch.context() as mp:
        # tiny blocks: a look-up crosses many of them; the filters on or off
        mp.setattr(runs, "BLOCK_ROWS", block)
        mp.setattr(runs, "ROWS_CHUNK", 2 * block)
        mp.setattr(runs, "BLOOM_MIN_QUERY", 0 if bloom else 10**9)
        mp.setattr(reads, "BULK_LOOKUP", 7)  # read_into resolves ranges of 7
        memory = MemoryStore()
        writer = EmbeddingStore(memory, auto_merge=0)
        rng = np.random.default_rng(len(put_ids))
        expected: dict[int, np.ndarray] = {}
        for ids in put_ids:
            vectors = rng.standard_normal((len(ids), 3)).astype(np.float32)
            commit_raw(writer, ids, vectors)
            for i, v in zip(ids, vectors, strict=True):
                expected.setdefault(i, v)  # the first commit holding it wins
        if compact:
            writer.compact()
        for store in (writer, EmbeddingStore(memory)):  # own view, and a cold one
            got, found = store.get(KEY, [hash_of(i) for i in asked])
            want = [i in expected for i in asked]
            np.testing.assert_array_equal(found, want)
            for row, i in enumerate(asked):
                if i in expected:
                    np.testing.assert_array_equal(got[row], expected[i])
            assert store.keys()[0].n_vectors == len(expected)
            assert store.hashes(KEY) == sorted(hash_of(i) for i in expected)
            out = np.full((len(asked), 3), -1, np.float32)
            q = np.frombuffer(b"".join(bytes.fromhex(hash_of(i)) for i in asked), "S32")
            np.testing.assert_array_equal(store.read_into(KEY, q, out), want)
            np.testing.assert_array_equal(out[found], got[found])
        assert writer.verify() == []


def test_new_runs_join_the_view_without_reopening_the_others():
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=0)
    vectors = np.arange(40, dtype=np.float32).reshape(20, 2)
    hashes = [hash_of(i) for i in range(20)]
    store.put(KEY, hashes[:10], vectors[:10])
    before = store._view(KEY).runs
    store.put(KEY, hashes[10:], vectors[10:])
    after = store._view(KEY).runs
    assert len(after) == 2
    assert after[0] is before[0]  # the same opened run, not read again
    assert not hasattr(after[1], "keys")  # a view holds fences, never every hash
    assert len(after[1].fences) == 1
    got, found = store.get(KEY, hashes[::-1])
    assert found.all()
    np.testing.assert_array_equal(got, vectors[::-1])


def test_a_small_look_up_reads_later_runs_only_for_keys_the_largest_lacks(
    monkeypatch,
):
    monkeypatch.setattr(runs, "BLOCK_ROWS", 4)  # many blocks in every run
    monkeypatch.setattr(runs, "ROWS_CHUNK", 8)
    memory = MemoryStore()
    writer = EmbeddingStore(memory, auto_merge=0)
    rng = np.random.default_rng(0)
    commit_raw(writer, [0, 1], rng.random((2, 2), dtype=np.float32))
    commit_raw(writer, list(range(100, 400)), rng.random((300, 2), dtype=np.float32))
    for lo in range(1000, 1200, 40):  # later, smaller runs
        ids = list(range(lo, lo + 40))
        commit_raw(writer, ids, rng.random((40, 2), dtype=np.float32))
    prefixes = [s.prefix for s in writer._view(KEY).runs]
    reader = EmbeddingStore(memory)  # cold: no block cached
    reader.contains(KEY, [hash_of(0)])  # opens the view (records, fences)
    reader._cache.clear()
    read: list[str] = []
    real = type(reader._backend).read

    def counted(self, path):
        read.append(path)
        return real(self, path)

    monkeypatch.setattr(type(reader._backend), "read", counted)
    asked = [*range(100, 400, 10), 1, 1005]  # the largest run's, the first's, a later
    found = reader.contains(KEY, [hash_of(i) for i in asked])
    assert found.all()
    blocks = [p for p in read if "/sorted_hashes/" in p]
    by_run = [sum(p.startswith(prefix + "/") for p in blocks) for prefix in prefixes]
    assert by_run[1] >= 20  # the largest run: a block per asked key, about
    assert by_run[0] >= 1
    # later runs: one read each at most, for the one key the first two lack
    assert all(k <= 1 for k in by_run[2:]), by_run
    assert by_run[2] == 1  # 1005 lives in the first later run


def test_the_first_round_ends_where_a_stored_key_costs_fewest_block_reads():
    # a key's largest run holds 80% of it: one run, then the rest for the 20%
    assert runs.first_round([12_800_000, *[800_000] * 4, 50_000]) == 1
    # runs of one size: three first (3 + 0.41 x 3 = 4.2 reads a key, against
    # 1 + 0.8 x 5 = 5.0 with the first alone and 6 in one round)
    assert runs.first_round([*[800_000] * 5, 50_000]) == 3
    assert runs.first_round([2, 300, *[40] * 5]) == 2  # up to the largest
    assert runs.first_round([]) == 0
    assert runs.first_round([7]) == 1


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_another_instance_sees_commits_after_refresh_seconds(
    kind, tmp_path, monkeypatch
):
    monkeypatch.setattr(snapshots, "LOCAL_CHECK_S", 0.0)  # check the folder each time
    root = MemoryStore() if kind == "memory" else str(tmp_path / "store")
    writer = EmbeddingStore(root)
    vectors = np.ones((2, 4), np.float32)
    writer.put(KEY, [hash_of(0)], vectors[:1])
    lazy = EmbeddingStore(root, refresh_seconds=3600.0)
    eager = EmbeddingStore(root, refresh_seconds=0)
    assert lazy.contains(KEY, [hash_of(0), hash_of(1)]).tolist() == [True, False]
    assert eager.contains(KEY, [hash_of(1)]).tolist() == [False]
    writer.put(KEY, [hash_of(1)], vectors[1:])
    assert eager.contains(KEY, [hash_of(1)]).tolist() == [True]
    if kind == "memory":  # no change check on an object store: the period rules
        assert lazy.contains(KEY, [hash_of(1)]).tolist() == [False]
        lazy.refresh(KEY)
    else:  # a local folder's commits folder changed: seen at once
        pass
    assert lazy.contains(KEY, [hash_of(1)]).tolist() == [True]
    # the writer's own commits are seen at once, whatever its period
    slow_writer = EmbeddingStore(root, refresh_seconds=3600.0)
    slow_writer.put(KEY, [hash_of(2)], vectors[:1])
    assert slow_writer.contains(KEY, [hash_of(2)]).tolist() == [True]


def test_refresh_seconds_must_be_a_non_negative_number():
    with pytest.raises(ValueError, match="refresh_seconds"):
        EmbeddingStore(MemoryStore(), refresh_seconds=-1)


def test_readers_in_threads_see_every_row_while_the_writer_merges_and_compacts(
    tmp_path,
):
    import threading

    store = EmbeddingStore(str(tmp_path / "store"), auto_merge=2)
    vectors = np.arange(2 * 400, dtype=np.float32).reshape(400, 2)
    hashes = [hash_of(i) for i in range(400)]
    store.put(KEY, hashes[:40], vectors[:40])
    done = threading.Event()
    errors: list[Exception] = []

    def read() -> None:
        try:
            while not done.is_set():
                got, found = store.get(KEY, hashes[:40][::-1])
                assert found.all()
                np.testing.assert_array_equal(got, vectors[:40][::-1])
        except Exception as err:  # noqa: BLE001 (reported below, in the test thread)
            errors.append(err)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for lo in range(40, 400, 20):  # each put a run; merges every 2 at a level
            store.put(KEY, hashes[lo : lo + 20], vectors[lo : lo + 20])
        store.compact()
    finally:
        done.set()
        for reader in readers:
            reader.join()
    assert not errors, errors[0]
    assert store.keys()[0].n_runs == 1
    got, found = EmbeddingStore(str(tmp_path / "store")).get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)


@pytest.mark.parametrize("n_keys", [1, 300, 5_000])
def test_a_filter_probe_answers_as_the_bits_of_its_block_say(n_keys):
    """may_hold is exactly the split-block rule, key by key in plain Python: held
    keys always pass; an absent key passes only where all 8 of its bits are set."""
    rng = np.random.default_rng(n_keys)
    held = np.frombuffer(rng.bytes(32 * n_keys), "S32")
    asked = np.concatenate([held, np.frombuffer(rng.bytes(32 * 20_000), "S32")])
    words = runs.bloom_of(held).tolist()
    n_blocks = len(words) // runs.BLOOM_WORDS
    want = []
    for key in asked.tolist():
        block = int.from_bytes(key[8:16], "little") % n_blocks
        want.append(
            all(
                words[runs.BLOOM_WORDS * block + w] >> (key[16 + w] & 63) & 1
                for w in range(runs.BLOOM_WORDS)
            )
        )
    got = np.zeros(len(asked), bool)
    got[runs.may_hold(np.array(words, np.uint64), runs.bloom_hashes(asked))] = True
    np.testing.assert_array_equal(got, want)
    assert got[:n_keys].all()
    if n_keys > 1:  # some absent keys pass (rarely): the rule is checked on both
        assert 0 < np.count_nonzero(got[n_keys:]) < 20
