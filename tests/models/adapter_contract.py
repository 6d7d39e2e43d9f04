"""The contract every adapter meets; each family's test module subclasses it.

Subclasses provide an ``adapter`` fixture and may override ``seqs``.
"""

from __future__ import annotations

import numpy as np

from embedcache.models.base import Adapter
from embedcache.specs import ModelKey


class AdapterContract:
    seqs = ("ACGTACGTAC", "GGGCCCAANT", "A", "TTTTGCA")

    def test_is_an_adapter(self, adapter):
        assert isinstance(adapter, Adapter)
        assert isinstance(adapter.key, ModelKey)
        assert adapter.key.revision not in {"", "main", "master"}

    def test_shape_and_dtype(self, adapter):
        out = adapter.embed_batch(list(self.seqs))
        assert out.shape == (len(self.seqs), adapter.dim)
        assert out.dtype == np.float32
        assert np.isfinite(out).all()

    def test_deterministic(self, adapter):
        first = adapter.embed_batch(list(self.seqs))
        second = adapter.embed_batch(list(self.seqs))
        np.testing.assert_array_equal(first, second)

    def test_alone_equals_padded_in_batch(self, adapter):
        batch = adapter.embed_batch(list(self.seqs))
        for row, seq in enumerate(self.seqs):
            alone = adapter.embed_batch([seq])
            np.testing.assert_allclose(alone[0], batch[row], atol=1e-5, rtol=0)

    def test_n_tokens_positive_and_monotone_in_length(self, adapter):
        short, long = adapter.n_tokens("ACG"), adapter.n_tokens("ACGACGACG")
        assert 0 < short < long
