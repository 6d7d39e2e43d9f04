"""Two writers that merge the same runs at once publish two merged runs of the same
rows: readers skip the later one (an earlier merge holds its inputs), and the
collection after the grace deletes it."""

from __future__ import annotations

import numpy as np

from embedcache.store import LeasePolicy, merges
from tests.store.worker import KEY, Clock, dataset


def test_a_merge_that_lost_a_race_is_skipped_then_collected(handle, monkeypatch):
    hashes, vectors = dataset(60)
    clock = Clock()
    first = handle.open(auto_merge=0, lease=LeasePolicy(clock=clock))
    for lo in range(0, 60, 20):
        first.put(KEY, hashes[lo : lo + 20], vectors[lo : lo + 20])
    second = handle.open(auto_merge=0)
    view = second._view(KEY)  # its look at the three runs, before either merge
    inputs = [r.record.run for r in view.runs]

    winner = merges.merge(first._backend, first._view(KEY), first._writer, inputs)
    # the second merges from its older look (its refresh raced the first's publish)
    monkeypatch.setattr(merges, "refresh", lambda backend, view, **kw: view.snap)
    loser = merges.merge(second._backend, view, second._writer, inputs)
    monkeypatch.undo()
    assert winner is not None
    assert loser is not None
    assert set(loser.supersedes) == set(winner.supersedes) == set(inputs)

    reader = handle.open()
    (info,) = reader.keys()
    assert info.n_runs == 1  # the second merge is skipped, not a second copy
    assert [r.record.run for r in reader._view(KEY).runs] == [winner.run]
    got, found = reader.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)

    first.compact(KEY)  # the first sighting of the runs merged away
    clock.now += first.refresh_seconds + LeasePolicy().margin_seconds + 1
    first.compact(KEY)
    left = {p.split("/")[2] for p in handle.paths(f"{KEY.digest}/shards/*/zarr.json")}
    assert left == {winner.run}
    got, found = handle.open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert first.verify() == []
