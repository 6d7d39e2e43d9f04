from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedcache.cli import main as cli_main
from embedcache.errors import (
    CorruptStoreError,
    DimensionMismatchError,
    InvalidHashError,
    InvalidVectorError,
    StoreError,
)
from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, Fault, KeyInfo

WORKER = Path(__file__).with_name("store_worker.py")
sys.path.insert(0, str(WORKER.parent))
from store_worker import KEY, dataset

KEY_A = ModelKey(model_id="m/a", revision="a" * 40, adapter="t", adapter_version="1")
KEY_B = ModelKey(
    model_id="m/a",
    revision="a" * 40,
    adapter="t",
    adapter_version="1",
    rc_mode="average",
)


def hashes_of(n: int, prefix: str = "s") -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


def vectors_of(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def shard_files(root: Path, key: ModelKey, pattern: str) -> list[Path]:
    return sorted((root / key.digest / "shards").glob(f"*/{pattern}"))


def run_worker(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), str(store), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


# --- basic behaviour ----------------------------------------------------------------


def test_put_get_roundtrip_in_any_order_with_missing(tmp_path):
    store = EmbeddingStore(tmp_path / "s")
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


def test_absent_key_gives_zero_width_and_nothing_found(tmp_path):
    store = EmbeddingStore(tmp_path / "s")
    got, found = store.get(KEY_A, hashes_of(3))
    assert got.shape == (3, 0)
    assert not found.any()
    assert not store.contains(KEY_A, hashes_of(3)).any()
    assert store.keys() == []


def test_reput_is_idempotent_and_in_call_duplicates_stored_once(tmp_path):
    store = EmbeddingStore(tmp_path / "s")
    hs, vs = hashes_of(10), vectors_of(10)
    assert store.put(KEY_A, [*hs, hs[0]], np.vstack([vs, vs[:1] + 1])) == 10
    before = tree(tmp_path / "s")
    assert store.put(KEY_A, hs, vs + 5) == 0
    assert tree(tmp_path / "s") == before  # nothing written at all
    got, _ = store.get(KEY_A, hs)
    np.testing.assert_array_equal(got, vs)  # first vector kept
    assert store.put(KEY_A, hashes_of(12), vectors_of(12)) == 2
    (info,) = store.keys()
    assert isinstance(info, KeyInfo)
    assert (info.n_vectors, info.dim, info.n_shards) == (12, 8, 2)
    assert info.nbytes > 12 * 8 * 4
    assert store.hashes(KEY_A) == sorted(hashes_of(12))
    assert store.hashes(KEY_B) == []


def test_dimension_mismatch_raises_naming_key_and_writes_nothing(tmp_path):
    store = EmbeddingStore(tmp_path / "s")
    store.put(KEY_A, hashes_of(4), vectors_of(4, dim=8))
    before = tree(tmp_path / "s")
    with pytest.raises(DimensionMismatchError, match=KEY_A.digest[:12]) as err:
        store.put(KEY_A, hashes_of(6), vectors_of(6, dim=9))
    assert "m/a" in str(err.value)
    with pytest.raises(DimensionMismatchError):
        store.put(KEY_A, hashes_of(6), vectors_of(5))  # rows disagree with hashes
    with pytest.raises(DimensionMismatchError, match="dtype"):
        store.put(KEY_A, hashes_of(2, "x"), np.ones((2, 8), dtype=np.int64))
    with pytest.raises(InvalidVectorError, match="row 1"):
        store.put(KEY_A, hashes_of(2, "y"), np.array([[0.0] * 8, [np.nan] * 8]))
    assert tree(tmp_path / "s") == before
    # another process's view agrees: nothing was committed
    assert EmbeddingStore(tmp_path / "s").keys()[0].n_vectors == 4


def test_malformed_hash_is_named(tmp_path):
    store = EmbeddingStore(tmp_path / "s")
    bad = hashes_of(3)
    bad[1] = bad[1].upper()
    with pytest.raises(InvalidHashError, match=r"#1 '"):
        store.get(KEY_A, bad)
    with pytest.raises(InvalidHashError, match="abc"):
        store.put(KEY_A, ["abc"], vectors_of(1))
    with pytest.raises(InvalidHashError):
        store.contains(KEY_A, [hashes_of(1)[0][:-1] + "g"])


def test_keys_with_different_fields_never_share_vectors(tmp_path):
    store = EmbeddingStore(tmp_path / "s")
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


def test_layout_is_plain_zarr_v3(tmp_path):
    store = EmbeddingStore(tmp_path / "s")
    hs, vs = hashes_of(50), vectors_of(50)
    store.put(KEY_A, hs, vs)
    group = zarr.open_group(tmp_path / "s" / KEY_A.digest, mode="r")
    attrs = group.attrs["embedcache"]
    assert attrs["schema_version"] == 1
    assert attrs["dim"] == 8
    assert ModelKey.from_json(attrs["key_json"]) == KEY_A
    (shard,) = (tmp_path / "s" / KEY_A.digest / "shards").iterdir()
    arr = zarr.open_array(shard / "vectors", mode="r")
    np.testing.assert_array_equal(arr[:], vs)
    raw = zarr.open_array(shard / "hashes", mode="r")[:]
    assert [bytes(r).hex() for r in raw] == hs


def test_unknown_schema_version_is_rejected_clearly(tmp_path):
    root = tmp_path / "s"
    EmbeddingStore(root).put(KEY_A, hashes_of(3), vectors_of(3))
    for meta in (root / KEY_A.digest / "zarr.json", root / "zarr.json"):
        doc = json.loads(meta.read_text())
        doc["attributes"]["embedcache"]["schema_version"] = 99
        meta.write_text(json.dumps(doc))
        with pytest.raises(StoreError, match="schema_version 99") as err:
            EmbeddingStore(root).get(KEY_A, hashes_of(3))
        assert str(meta) in str(err.value)


def test_foreign_directory_is_not_adopted(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(StoreError, match="not an embedcache store"):
        EmbeddingStore(tmp_path)
    with pytest.raises(StoreError, match="no embedcache store"):
        EmbeddingStore(tmp_path / "absent", create=False)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    dim=st.integers(1, 20),
    data=st.data(),
)
def test_put_then_get_returns_the_same_vectors_in_any_order(n, dim, data):
    hs = hashes_of(n, prefix=f"{dim}-")
    vs = vectors_of(n, dim=dim, seed=n)
    perm = data.draw(st.permutations(range(n)))
    split = data.draw(st.integers(0, n))
    with tempfile.TemporaryDirectory() as tmp:
        store = EmbeddingStore(tmp, auto_merge=2)
        stored = store.put(KEY_A, hs[:split], vs[:split])
        stored += store.put(KEY_A, hs, vs)
        assert stored == n
        got, found = EmbeddingStore(tmp).get(KEY_A, [hs[i] for i in perm])
        assert found.all()
        np.testing.assert_array_equal(got, vs[perm])


# --- integrity ----------------------------------------------------------------------


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("pattern", "damage"),
    [
        ("vectors/c/0/0", "flip"),
        ("vectors/c/0/0", "truncate"),
        ("hashes/c/0/0", "flip"),
        ("vectors/zarr.json", "flip"),
    ],
)
def test_corrupt_shard_is_named_by_verify_and_get_refuses(tmp_path, pattern, damage):
    root = tmp_path / "s"
    store = EmbeddingStore(root, auto_merge=0)
    hs, vs = hashes_of(100), vectors_of(100)
    store.put(KEY_A, hs[:50], vs[:50])
    store.put(KEY_A, hs[50:], vs[50:])
    assert store.verify() == []
    target = shard_files(root, KEY_A, pattern)[1]
    if damage == "flip":
        flip_byte(target, target.stat().st_size // 2)
    else:
        with target.open("r+b") as f:
            f.truncate(target.stat().st_size - 7)
    faults = EmbeddingStore(root).verify()
    assert faults
    assert all(isinstance(f, Fault) for f in faults)
    assert target in {f.path for f in faults}
    with pytest.raises(CorruptStoreError, match=str(target.parent.parent)):
        EmbeddingStore(root).get(KEY_A, hs)
    # the already-open instance must not serve from the damaged file either
    # (its index was loaded before the damage, so only the chunk checks stand guard)
    if pattern.startswith("vectors/c"):
        with pytest.raises(CorruptStoreError):
            store.get(KEY_A, hs[50:])
    # the CLI exits non-zero and prints the path
    assert cli_main(["store", "verify", "--store", str(root)]) == 1


def test_cli_store_commands(tmp_path, capsys):
    root = tmp_path / "s"
    store = EmbeddingStore(root, auto_merge=0)
    for i in range(3):
        store.put(KEY_A, hashes_of(10, f"{i}-"), vectors_of(10, seed=i))
    assert cli_main(["store", "ls", "--store", str(root)]) == 0
    out = capsys.readouterr().out
    assert KEY_A.digest[:12] in out
    assert "30" in out
    assert cli_main(["store", "info", "--store", str(root)]) == 0
    assert KEY_A.canonical_json() in capsys.readouterr().out
    assert cli_main(["store", "verify", "--store", str(root)]) == 0
    assert cli_main(["store", "compact", "--store", str(root)]) == 0
    assert EmbeddingStore(root).keys()[0].n_shards == 1
    assert cli_main(["store", "ls", "--store", str(tmp_path / "absent")]) == 2


# --- crash safety and concurrency (real processes) ---------------------------------


N_ROWS = 1200


def test_kill_minus_9_at_random_moments_loses_no_committed_row(tmp_path):
    hashes, vectors = dataset(N_ROWS)
    rng = random.Random(20261006)
    for trial in range(4):
        root = tmp_path / f"trial{trial}"
        proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(root),
                "--stop",
                str(N_ROWS),
                "--batch",
                "40",
            ],
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

        store = EmbeddingStore(root)
        got, found = store.get(KEY, hashes)
        assert found[sorted(committed)].all(), (
            f"trial {trial}: a committed row was lost"
        )
        np.testing.assert_array_equal(got[found], vectors[found])
        assert store.verify() == [], f"trial {trial}"
        n_before = int(found.sum())

        done = run_worker(root, "--stop", str(N_ROWS), "--batch", "40")
        total = int(done.stdout.split()[-1])
        assert total == N_ROWS - n_before  # resuming wrote only what was missing
        reopened = EmbeddingStore(root)
        reopened.compact()  # also removes the killed writer's leftovers
        assert reopened.garbage() == []
        got, found = reopened.get(KEY, hashes)
        assert found.all()
        np.testing.assert_array_equal(got, vectors)  # identical to an uninterrupted run
        assert reopened.verify() == []
        assert reopened.keys()[0].n_vectors == N_ROWS


def test_two_concurrent_writers_with_overlapping_sets(tmp_path):
    hashes, vectors = dataset(N_ROWS)
    root = tmp_path / "s"
    EmbeddingStore(root)  # both writers open an existing, empty store
    args = [
        ["--start", "0", "--stop", str(N_ROWS * 3 // 4), "--batch", "30"],
        [
            "--start",
            str(N_ROWS // 4),
            "--stop",
            str(N_ROWS),
            "--batch",
            "30",
            "--reverse",
        ],
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(root), *a],
            stdout=subprocess.PIPE,
            text=True,
        )
        for a in args
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    store = EmbeddingStore(root)
    got, found = store.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)  # same values as one writer
    assert store.keys()[0].n_vectors == N_ROWS  # each hash once in the logical view
    assert store.verify() == []
    store.compact()
    (shard,) = (root / KEY.digest / "shards").iterdir()
    on_disk = zarr.open_array(shard / "hashes", mode="r")[:]
    assert on_disk.shape == (N_ROWS, 32)  # duplicates gone after compact
    np.testing.assert_array_equal(EmbeddingStore(root).get(KEY, hashes)[0], vectors)
    assert store.verify() == []


def test_compact_is_atomic_if_interrupted_after_commit(tmp_path, monkeypatch):
    root = tmp_path / "s"
    store = EmbeddingStore(root, auto_merge=0)
    hs, vs = hashes_of(90), vectors_of(90)
    for i in range(0, 90, 30):
        store.put(KEY_A, hs[i : i + 30], vs[i : i + 30])

    def crash(self, state, shard_ids):
        raise KeyboardInterrupt  # the merged shard is committed; nothing retired yet

    monkeypatch.setattr(EmbeddingStore, "_retire", crash)
    with pytest.raises(KeyboardInterrupt):
        store.compact()
    monkeypatch.undo()
    fresh = EmbeddingStore(root)
    got, found = fresh.get(KEY_A, hs)
    assert found.all()
    np.testing.assert_array_equal(got, vs)
    assert fresh.verify() == []
    assert fresh.keys()[0].n_shards == 1  # the merged shard hides the old ones
    assert len(fresh.garbage()) == 6  # 3 superseded shard dirs + their records
    fresh.compact()
    assert fresh.garbage() == []
    np.testing.assert_array_equal(fresh.get(KEY_A, hs)[0], vs)


def test_uncommitted_leftovers_are_garbage_not_faults(tmp_path):
    root = tmp_path / "s"
    store = EmbeddingStore(root)
    hs, vs = hashes_of(10), vectors_of(10)
    store.put(KEY_A, hs, vs)
    (shard,) = (root / KEY_A.digest / "shards").iterdir()
    leftover = shard.with_name("w~otherhost~1~000001")
    leftover.mkdir()
    (leftover / "zarr.json").write_text("{half written")
    assert store.verify() == []
    assert store.garbage() == [leftover]
    np.testing.assert_array_equal(EmbeddingStore(root).get(KEY_A, hs)[0], vs)
    store.compact()
    assert leftover.exists()  # owner unknown and recent: kept for the grace period
    os.utime(leftover, (0, 0))
    store.compact()
    assert not leftover.exists()
    # a leftover of a dead process on this host goes at once
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    this_host = shard.name.split("~")[1]  # shard names carry writer~host~pid~n
    dead = shard.with_name(f"w~{this_host}~{exited.stdout.strip()}~000001")
    dead.mkdir()
    # a commit record's temp file of that dead writer, named as the store names it
    dead_tmp = (
        root
        / KEY_A.digest
        / "commits"
        / (f".{dead.name}.json~{this_host}~{exited.stdout.strip()}~0a1b2c3d.tmp")
    )
    dead_tmp.write_text("{")
    assert store.garbage() == sorted([dead, dead_tmp])
    store.compact()
    assert store.garbage() == []


def test_compacting_while_two_processes_write_and_read(tmp_path):
    hashes, vectors = dataset(N_ROWS)
    root = tmp_path / "s"
    EmbeddingStore(root)
    args = [
        ["--start", "0", "--stop", str(N_ROWS * 3 // 4), "--batch", "20"],
        ["--start", str(N_ROWS // 4), "--stop", str(N_ROWS), "--reverse"],
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(root), *a],
            stdout=subprocess.DEVNULL,
        )
        for a in args
    ]
    compactor = EmbeddingStore(root)
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
    got, found = EmbeddingStore(root).get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert compactor.verify() == []
    assert compactor.keys()[0].n_shards == 1
