"""The hashing and store look-up phases report progress (a million short sequences
spend seconds there before the first batch runs)."""

from __future__ import annotations

import numpy as np
from obstore.store import MemoryStore

from embedcache.engine import plan
from embedcache.engine.api import embed_into_store
from embedcache.store import EmbeddingStore


def test_hashing_and_lookup_report_progress(capsys, monkeypatch):
    rng = np.random.default_rng(0)
    seqs = ["".join(rng.choice(list("ACGT"), size=12)) for _ in range(300)]
    store = EmbeddingStore(MemoryStore())
    calls = []
    contains = store.contains

    def counting(key, hashes):
        calls.append(len(hashes))
        return contains(key, hashes)

    monkeypatch.setattr(store, "contains", counting)
    monkeypatch.setattr(plan, "LOOKUP_CHUNK", 128)
    embed_into_store("kmer-2", seqs, store, progress=True)
    err = capsys.readouterr().err
    n = len(set(seqs))
    assert "hash: 100%" in err
    assert "300/300" in err
    assert "look up: 100%" in err
    assert f"{n}/{n}" in err
    assert "read back: 100%" in err  # the vectors, in input order, chunk by chunk
    assert calls == [128, 128, n - 256]  # looked up in steps, each reported
    embed_into_store("kmer-2", seqs, store, progress=False)
    assert "hash" not in capsys.readouterr().err
