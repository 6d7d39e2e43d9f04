"""A key's vector count comes from its commit records where they tell (runs known
to share no hash), and from merging the runs' sorted indexes only where they
may share hashes: two writers that stored the same sequence at once, or records
written before records said what they lack."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from obstore.store import MemoryStore

from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, commits, counts, embedding_store

KEY = ModelKey(
    model_id="test/counts", revision="0" * 40, adapter="t", adapter_version="1"
)


def hashes(lo: int, hi: int) -> list[str]:
    return [hashlib.sha256(f"c{i}".encode()).hexdigest() for i in range(lo, hi)]


def vectors(n: int) -> np.ndarray:
    return np.ones((n, 2), np.float32)


def two_writers() -> tuple[MemoryStore, EmbeddingStore, EmbeddingStore]:
    """One store in memory and two writers on it, neither merging on its own."""
    memory = MemoryStore()
    return memory, *(EmbeddingStore(memory, auto_merge=0) for _ in range(2))


def before_the_next_commit(monkeypatch, action) -> None:
    """Run ``action`` between the next put's look-up and its commit."""
    commit_run = embedding_store.commit_run

    def action_first(*args, **kwargs):
        monkeypatch.setattr(embedding_store, "commit_run", commit_run)
        action()
        return commit_run(*args, **kwargs)

    monkeypatch.setattr(embedding_store, "commit_run", action_first)


@pytest.fixture
def merged_counts(monkeypatch) -> list[int]:
    """How many runs each count by merging took together."""
    calls: list[int] = []
    distinct_count = counts.distinct_count

    def recording(backend, view, snap, positions):
        calls.append(len(positions))
        return distinct_count(backend, view, snap, positions)

    monkeypatch.setattr(counts, "distinct_count", recording)
    return calls


def test_a_key_its_writers_filled_in_turn_is_counted_from_its_records(
    merged_counts,
):
    memory = MemoryStore()
    first = EmbeddingStore(memory, auto_merge=3)
    for lo in range(0, 140, 20):  # each batch repeats 10 of the one before
        first.put(KEY, hashes(max(0, lo - 10), lo + 20), vectors(20 + min(lo, 10)))
    later = EmbeddingStore(memory, auto_merge=2)  # another session, afterwards
    for lo in (130, 160, 190):  # 130-139 are stored already
        later.put(KEY, hashes(lo, lo + 30), vectors(30))
    info = EmbeddingStore(memory).keys()[0]
    assert info.n_runs >= 2  # merged runs (of both writers), and a put's run
    assert info.n_vectors == 220  # hashes 0-219, each once
    assert merged_counts == []  # no run read


def test_runs_two_writers_stored_at_once_are_counted_by_merging_them(
    merged_counts, monkeypatch
):
    memory, store, rival = two_writers()
    store.put(KEY, hashes(0, 10), vectors(10))
    # between this put's look-up and its commit, another writer stores 15-17
    before_the_next_commit(
        monkeypatch, lambda: rival.put(KEY, hashes(15, 18), vectors(3))
    )
    store.put(KEY, hashes(10, 20), vectors(10))  # holds 15-17 too, unknowing
    rival.put(KEY, hashes(18, 25), vectors(7))  # saw both: only 20-24 are new
    info = EmbeddingStore(memory).keys()[0]
    assert [s.record.n_rows for s in rival._view(KEY).runs] == [10, 3, 10, 5]
    assert info.n_vectors == 25
    assert merged_counts == [2]  # only the two runs that may share hashes


def test_records_that_do_not_say_what_they_lack_are_counted_by_merging(
    tmp_path, merged_counts
):
    store = EmbeddingStore(tmp_path, auto_merge=0)
    for lo in (0, 30, 60):
        store.put(KEY, hashes(lo, lo + 40), vectors(40))  # 30-39, 60-69 skipped
    for record in tmp_path.glob("*/log/*/zarr.json"):  # as earlier versions
        doc = json.loads(record.read_text())
        del doc["attributes"]["embedcache"]["lacks"]
        record.write_text(json.dumps(doc))
    assert EmbeddingStore(tmp_path).keys()[0].n_vectors == 100
    assert merged_counts == [3]


def test_a_put_whose_runs_were_merged_meanwhile_lacks_the_merged_run(
    merged_counts, monkeypatch
):
    memory, store, compacting = two_writers()
    store.put(KEY, hashes(0, 10), vectors(10))
    store.put(KEY, hashes(10, 20), vectors(10))
    # between this put's look-up and its commit, the runs it looked in merge
    before_the_next_commit(monkeypatch, lambda: compacting.compact(KEY))
    store.put(KEY, hashes(15, 30), vectors(15))  # 20-29 new
    info = EmbeddingStore(memory).keys()[0]
    assert (info.n_runs, info.n_vectors) == (2, 30)
    assert merged_counts == []  # it lacks both runs the merged one was made of


def test_a_record_names_the_largest_runs_it_lacks_up_to_a_bound(
    merged_counts, monkeypatch
):
    monkeypatch.setattr(commits, "MAX_LACKS", 2)
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=0)
    for lo, n in ((0, 5), (5, 30), (35, 10), (45, 20)):
        store.put(KEY, hashes(lo, lo + n), vectors(n))
    runs = [s.record for s in store._view(KEY).runs]
    # the last put looked in three runs: its record names the 30 and the 10
    assert runs[-1].lacks == tuple(sorted((runs[1].run, runs[2].run)))
    assert EmbeddingStore(memory).keys()[0].n_vectors == 65
    assert merged_counts == [2]  # the 5 and the 20, whose records do not link them
