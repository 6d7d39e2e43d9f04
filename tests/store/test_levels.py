"""Compaction by anyone: a run's level is in its record, so many short-lived
writers (each opens, puts once, closes) leave a number of runs logarithmic in the
rows, as one long writer does (issue 41, finding 3)."""

from __future__ import annotations

import math

import numpy as np
from obstore.store import MemoryStore

from embedcache.store import AUTO_MERGE, EmbeddingStore
from tests.store.worker import KEY, dataset


def test_many_short_lived_writers_leave_few_runs():
    memory = MemoryStore()
    n_writers, per = 60, 10
    hashes, vectors = dataset(n_writers * per)
    for w in range(n_writers):
        with EmbeddingStore(memory) as store:
            part = slice(w * per, (w + 1) * per)
            assert store.put(KEY, hashes[part], vectors[part]) == per
    reader = EmbeddingStore(memory)
    (info,) = reader.keys()
    levels = math.ceil(math.log(n_writers, AUTO_MERGE))
    assert info.n_runs <= (AUTO_MERGE - 1) * levels, info.n_runs
    assert info.n_vectors == n_writers * per
    got, found = reader.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    records = [s.record for s in reader._view(KEY).runs]
    assert max(r.level for r in records) >= 2  # merges of merges, by other writers
