"""Runs merged away stay readable for a grace (longer than the longest read of an
older snapshot); only collection deletes them, judged on the collector's own
monotonic clock ("merged away since I first saw it so"). Clocks are injected."""

from __future__ import annotations

import numpy as np
import pytest

from embedcache.store import LeasePolicy, reads
from embedcache.store.snapshots import RunRetiredError
from tests.store.worker import DIM, KEY, Clock, dataset

N = 60


def old_snapshot_reader(store):
    """A read of every row through the snapshot ``store`` holds now, kept."""
    view, snap = store._snapshot(KEY, max_age=0.0)
    hashes, _ = dataset(N)
    digests = np.array([bytes.fromhex(h) for h in hashes], "S32")

    def read() -> tuple[np.ndarray, np.ndarray]:
        out = np.full((N, DIM), np.nan, np.float32)
        found = reads.read_many(store._backend, view, snap, digests, out)
        return out, found

    return read, [r.record.run for r in snap.runs]


def run_objects(handle, run: str) -> list[str]:
    return handle.paths(f"{KEY.digest}/shards/{run}/*")


def run_folders(handle) -> set[str]:
    """The runs with objects on disk (a glob's ``*`` spans ``/``: split once)."""
    paths = handle.paths(f"{KEY.digest}/shards/*/zarr.json")
    return {p.split("/")[2] for p in paths}


def test_an_old_snapshot_reads_a_merged_away_run_until_collection_after_the_grace(
    handle,
):
    hashes, vectors = dataset(N)
    clock = Clock()
    writer = handle.open(auto_merge=0, lease=LeasePolicy(clock=clock))
    for lo in range(0, N, 20):
        writer.put(KEY, hashes[lo : lo + 20], vectors[lo : lo + 20])
    read_old, old_runs = old_snapshot_reader(handle.open())
    assert len(old_runs) == 3

    writer.compact(KEY)  # merged: the three runs are merged away, not deleted
    assert writer.keys()[0].n_runs == 1
    grace = writer.refresh_seconds + LeasePolicy().margin_seconds
    clock.now += grace - 1
    writer.compact(KEY)  # collects: still within the grace on its clock
    handle.open().compact(KEY)  # another collector: it has only just seen them
    out, found = read_old()
    assert found.all()
    np.testing.assert_array_equal(out, vectors)
    assert all(run_objects(handle, r) for r in old_runs)
    assert writer.garbage() == []  # readable still: not garbage yet

    clock.now += 2
    writer.compact(KEY)  # past the grace: collection deletes them
    assert not any(run_objects(handle, r) for r in old_runs)
    with pytest.raises(RunRetiredError):
        read_old()
    # a reader of a fresh snapshot reads the merged run: same vectors
    got, found = handle.open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert writer.verify() == []
    assert writer.garbage() == []


def test_a_long_lived_writer_deletes_its_runs_merged_away_at_a_put_after_the_grace(
    handle,
):
    hashes, vectors = dataset(N)
    clock = Clock()
    writer = handle.open(auto_merge=2, lease=LeasePolicy(clock=clock))
    writer.put(KEY, hashes[:20], vectors[:20])
    writer.put(KEY, hashes[20:40], vectors[20:40])  # the two merge into one
    before = run_folders(handle)
    assert len(before) == 3  # two inputs and the merged run
    clock.now += writer.refresh_seconds + LeasePolicy().margin_seconds + 1
    writer.put(KEY, hashes[40:], vectors[40:])
    left = run_folders(handle)
    assert len(left) == 2  # the merged run and the new one
    assert len(left & before) == 1
    got, found = handle.open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
