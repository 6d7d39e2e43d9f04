"""`embedcache store repair`: drops the runs readers quarantine (their rows read
as absent and are computed again), prints them, `--dry-run` changes nothing, and
nothing healthy is touched."""

from __future__ import annotations

import hashlib

import numpy as np

from embedcache.cli import main
from embedcache.specs import ModelKey

KEY = ModelKey(model_id="m/repair", revision="d" * 40, adapter="t", adapter_version="1")
OTHER = ModelKey(
    model_id="m/other", revision="e" * 40, adapter="t", adapter_version="1"
)


def hashes_of(n: int, prefix: str = "") -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


def vectors_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def without_leases(objects: dict[str, bytes]) -> dict[str, bytes]:
    return {p: b for p, b in objects.items() if not p.startswith("leases/")}


def test_repair_drops_only_the_corrupt_run_and_its_rows_are_recomputed(
    process_handle, capsys, monkeypatch
):
    for name, value in (process_handle.options or {}).items():
        monkeypatch.setenv(name.upper(), value)
    location = str(process_handle.root)
    hs, vs = hashes_of(90), vectors_of(90)
    with process_handle.open(auto_merge=0) as store:
        for lo in range(0, 90, 30):
            store.put(KEY, hs[lo : lo + 30], vs[lo : lo + 30])
        store.put(OTHER, hashes_of(10, "o"), vectors_of(10, 1))
        runs = [r.record.run for r in store._view(KEY).runs]
    damaged = runs[1]
    (chunk,) = process_handle.paths(f"{KEY.digest}/shards/{damaged}/vectors/c/0/0")
    data = bytearray(process_handle.read(chunk))
    data[len(data) // 2] ^= 0x40
    process_handle.write(chunk, bytes(data))
    before = without_leases(process_handle.objects())

    assert main(["store", "repair", "--store", location, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would drop run {damaged} of key {KEY.digest[:12]}" in out
    assert "crc32c" in out or "sha256" in out  # says what is wrong
    assert without_leases(process_handle.objects()) == before  # nothing changed

    assert main(["store", "repair", "--store", location]) == 0
    out = capsys.readouterr().out
    assert f"dropped run {damaged}" in out
    assert runs[0] not in out
    assert runs[2] not in out
    after = without_leases(process_handle.objects())
    gone = {p for p in before if p not in after}
    assert gone  # the run's objects, its record and its log entry
    assert all(damaged in p or "/log/" in p for p in gone)
    assert len([p for p in gone if "/log/" in p]) == 1
    # every healthy object is byte for byte what it was
    assert {p: after[p] for p in before if p in after} == {
        p: b for p, b in before.items() if p not in gone
    }

    fresh = process_handle.open()
    got, found = fresh.get(KEY, hs)
    np.testing.assert_array_equal(found, [not 30 <= i < 60 for i in range(90)])
    np.testing.assert_array_equal(got[found], vs[found])
    assert fresh.n_quarantined == 0  # dropped: nothing left to quarantine
    assert fresh.verify() == []
    # the next embed computes the dropped rows again
    assert fresh.put(KEY, hs, vs) == 30
    got, found = process_handle.open().get(KEY, hs)
    assert found.all()
    np.testing.assert_array_equal(got, vs)
    assert main(["store", "repair", "--store", location]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_repair_of_one_key_leaves_the_others_and_drops_an_unparsable_log_entry(
    handle,
):
    store = handle.open(auto_merge=0)
    store.put(KEY, hashes_of(20), vectors_of(20))
    store.put(OTHER, hashes_of(20, "o"), vectors_of(20, 1))
    for key in (KEY, OTHER):
        (entry,) = handle.paths(f"{key.digest}/log/*/zarr.json")
        handle.write(entry, b"{not json")
    (broken,) = store.repair(KEY.digest[:8])
    assert broken.run is None
    assert "not valid JSON" in broken.problem
    assert not handle.paths(f"{KEY.digest}/log/*/zarr.json")
    assert handle.paths(f"{OTHER.digest}/log/*/zarr.json")  # another key: kept
    assert handle.paths(f"{KEY.digest}/shards/*/zarr.json")  # the run: kept
