"""A reader's probes for log entries a lagging LIST hides.

A LIST may hide an entry while it shows a later one: a reader reads the missing
seqs below the newest directly, or it could serve the later run's vector for a hash
the hidden, earlier run holds. The seqs of runs a merge replaced are gaps for good:
the merge's record names them, and a reader that read it does not probe them once
collection has deleted their entries.
"""

from __future__ import annotations

import numpy as np

from embedcache.store import EmbeddingStore, LeasePolicy
from embedcache.store import snapshots as store_views
from embedcache.store.backend import Backend
from tests.store.worker import KEY, dataset


def _count_log_reads(monkeypatch) -> list[str]:
    """The log entries the store reads from now on (a list it appends to)."""
    asked: list[str] = []
    read_many = Backend.read_many

    def counting(self: Backend, paths):
        paths = list(paths)
        asked.extend(p for p in paths if "/log/" in p)
        return read_many(self, paths)

    monkeypatch.setattr(Backend, "read_many", counting)
    return asked


def test_an_entry_the_list_hides_below_a_later_one_is_read(tmp_path, monkeypatch):
    root = tmp_path / "store"
    hashes, vectors = dataset(20)
    EmbeddingStore(root, auto_merge=0).put(KEY, hashes[:10], vectors[:10])
    EmbeddingStore(root, auto_merge=0).put(KEY, hashes[10:], vectors[10:])

    listed = store_views.list_records

    def lagging(backend: Backend, digest: str) -> frozenset[str]:
        names = listed(backend, digest)
        return names - {min(names)}  # the first run's entry, not yet listed

    monkeypatch.setattr(store_views, "list_records", lagging)
    got, found = EmbeddingStore(root, refresh_seconds=0).get(KEY, hashes)
    assert found.all(), f"{(~found).sum()} rows of the hidden entry not found"
    np.testing.assert_array_equal(got, vectors)


def test_a_cold_reader_does_not_probe_the_entries_merges_replaced(
    tmp_path, monkeypatch
):
    root = tmp_path / "store"
    hashes, vectors = dataset(200)
    with EmbeddingStore(root, auto_merge=4) as writer:
        for lo in range(0, 200, 10):  # 20 commits, merged level by level
            writer.put(KEY, hashes[lo : lo + 10], vectors[lo : lo + 10])
    now = [1000.0]
    policy = LeasePolicy(clock=lambda: now[0])
    with EmbeddingStore(root, lease=policy) as collector:  # past the grace
        collector.collect()
        now[0] += collector.refresh_seconds + policy.margin_seconds + 1
        collector.collect()

    asked = _count_log_reads(monkeypatch)
    reader = EmbeddingStore(root, refresh_seconds=0)
    got, found = reader.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    entries = [p for p in asked if (root / p).exists()]
    assert len(asked) == len(entries), (
        f"{len(asked) - len(entries)} absent entries read"
    )
    assert len(entries) <= 4  # the visible runs' entries, not the 20-odd published


def test_a_cold_reader_skips_the_entries_of_runs_merged_away(tmp_path, monkeypatch):
    """Within their grace, runs merged away keep their log entries: a cold reader
    reads the newest first and not those a merge it read replaced."""
    root = tmp_path / "store"
    hashes, vectors = dataset(400)
    with EmbeddingStore(root, auto_merge=4) as writer:
        for lo in range(0, 400, 5):  # 80 commits, merged level by level
            writer.put(KEY, hashes[lo : lo + 5], vectors[lo : lo + 5])
    published = len(list(root.glob("*/log/*/zarr.json")))
    asked = _count_log_reads(monkeypatch)
    monkeypatch.setattr(store_views, "READ_BATCH", 8)
    got, found = EmbeddingStore(root, refresh_seconds=0).get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert published > 80
    assert len(asked) <= 24, f"{len(asked)} of {published} log entries read"
