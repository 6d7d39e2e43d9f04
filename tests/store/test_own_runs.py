"""A writer's auto-merge skips the runs its own runs are known to lack: a put's
look-up saw them, so they hold none of its hashes. A run another writer commits
after that look-up is still looked in, and wins for a hash both hold."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from obstore.store import MemoryStore

from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, embedding_store, merged_runs

KEY = ModelKey(
    model_id="test/own-runs", revision="0" * 40, adapter="t", adapter_version="1"
)


def hashes(lo: int, hi: int) -> list[str]:
    return [hashlib.sha256(f"o{i}".encode()).hexdigest() for i in range(lo, hi)]


def vectors(n: int, value: float) -> np.ndarray:
    return np.full((n, 2), value, np.float32)


@pytest.fixture
def looked_in(monkeypatch):
    """The runs (by run name) each merge's winning_rows looked hashes up in."""
    seen: list[set[str]] = []
    lookup = merged_runs.lookup

    def recording(backend, view, snap, q):
        seen[-1].update(s.record.run for s in snap.runs)
        return lookup(backend, view, snap, q)

    winning_rows = merged_runs.winning_rows

    def each_merge(*args, **kwargs):
        seen.append(set())
        return winning_rows(*args, **kwargs)

    monkeypatch.setattr(merged_runs, "lookup", recording)
    monkeypatch.setattr("embedcache.store.merges.winning_rows", each_merge)
    return seen


def test_an_auto_merge_does_not_look_in_runs_its_puts_saw(looked_in):
    memory = MemoryStore()
    other = EmbeddingStore(memory, auto_merge=0)
    other.put(KEY, hashes(0, 25), vectors(25, 1.0))
    other.put(KEY, hashes(25, 50), vectors(25, 1.0))
    other.compact()  # a level-1 run: the level-0 merge below leaves it be
    earlier = other._view(KEY).runs[0].record.run
    store = EmbeddingStore(memory, auto_merge=3)
    for lo in (40, 100, 200):  # 40-49 are stored already: skipped by put
        store.put(KEY, hashes(lo, lo + 60), vectors(60, 2.0))
    assert len(looked_in) == 2  # the compaction, then one auto-merge
    assert looked_in[-1] == set()  # ...which did not read `earlier`
    view = store._view(KEY)
    assert [s.record.n_rows for s in view.runs] == [50, 170]
    assert view.runs[0].record.run == earlier
    got, found = EmbeddingStore(memory).get(KEY, hashes(0, 260))
    np.testing.assert_array_equal(found, [i < 160 or i >= 200 for i in range(260)])
    np.testing.assert_array_equal(got[:50], vectors(50, 1.0))
    np.testing.assert_array_equal(got[found][50:], vectors(170, 2.0))


def test_a_run_committed_after_a_puts_look_up_is_looked_in_and_wins(
    looked_in, monkeypatch
):
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=2)
    rival = EmbeddingStore(memory, auto_merge=0)
    store.put(KEY, hashes(0, 10), vectors(10, 1.0))
    commit_run = embedding_store.commit_run

    def rival_first(*args, **kwargs):
        # between this put's look-up and its commit, another writer stores 15
        monkeypatch.setattr(embedding_store, "commit_run", commit_run)
        rival.put(KEY, hashes(15, 16), vectors(1, 9.0))
        return commit_run(*args, **kwargs)

    monkeypatch.setattr(embedding_store, "commit_run", rival_first)
    store.put(KEY, hashes(10, 20), vectors(10, 2.0))  # holds 15 too, unknowing
    fresh = EmbeddingStore(memory)
    runs = fresh._view(KEY).runs
    # the auto-merge takes every level-0 run, the rival's too (levels are in the
    # records); in the merged run the rival's 15, committed first, wins
    assert len(looked_in) == 1
    assert [s.record.n_rows for s in runs] == [20]
    got, found = fresh.get(KEY, hashes(0, 20))
    assert found.all()
    np.testing.assert_array_equal(got[15], [9.0, 9.0])  # the first commit wins
    assert fresh.keys()[0].n_vectors == 20
