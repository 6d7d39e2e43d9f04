"""Property test of the store round trip with duplicates: any n, dim, repeated
hashes within and across puts, any order: ``get`` returns the first vector put."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore

from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore

KEY = ModelKey(
    model_id="test/props", revision="0" * 40, adapter="t", adapter_version="1"
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dim=st.integers(1, 12),
    rows=st.lists(st.integers(0, 30), min_size=1, max_size=80),  # ids, repeats allowed
    cuts=st.lists(st.integers(0, 80), max_size=5),
    data=st.data(),
)
def test_get_returns_exactly_the_first_vector_put_per_hash(dim, rows, cuts, data):
    rng = np.random.default_rng(len(rows) * 100 + dim)
    hashes = [hashlib.sha256(f"s{r}".encode()).hexdigest() for r in rows]
    vectors = rng.standard_normal((len(rows), dim)).astype(np.float32)
    memory = MemoryStore()
    store = EmbeddingStore(memory, auto_merge=2)
    first: dict[str, np.ndarray] = {}
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    total = 0
    for lo, hi in itertools.pairwise(bounds):
        total += store.put(KEY, hashes[lo:hi], vectors[lo:hi])
        for h, v in zip(hashes[lo:hi], vectors[lo:hi], strict=True):
            first.setdefault(h, v)
    assert total == len(first)  # each distinct hash stored once
    asked = data.draw(st.permutations(sorted(first)))
    got, found = EmbeddingStore(memory).get(KEY, asked)
    assert found.all()
    np.testing.assert_array_equal(got, np.array([first[h] for h in asked]))
    if data.draw(st.booleans()):
        store.compact()
        got, _ = EmbeddingStore(memory).get(KEY, asked)
        np.testing.assert_array_equal(got, np.array([first[h] for h in asked]))
    assert EmbeddingStore(memory).keys()[0].n_vectors == len(first)
