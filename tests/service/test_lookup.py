"""A request's store work: a hit lists no commit records (on S3, a LIST request)."""

from __future__ import annotations

import numpy as np

from embedcache.engine.forward import gather_vectors
from embedcache.engine.local import embed_sequences
from embedcache.service.lookup import plan_request, read_vectors
from embedcache.service.registry import load_models
from embedcache.service.settings import ModelSpec
from embedcache.store import EmbeddingStore, snapshots
from tests.service.conftest import random_seqs


def test_a_served_read_lists_no_commit_records(tmp_path, monkeypatch):
    # the server's own commits join its view as they are made, and other writers'
    # within refresh_seconds: a hit's read-back needs no listing of its own
    store = EmbeddingStore(tmp_path / "store", refresh_seconds=3600)
    [served] = load_models([ModelSpec(name="kmer-2", model="kmer-2")])
    seqs = random_seqs(50, seed=1)
    embed_sequences(served.adapter, seqs, store)
    listed = []
    real = snapshots.list_records

    def counted(backend, digest):
        listed.append(digest)
        return real(backend, digest)

    monkeypatch.setattr(snapshots, "list_records", counted)
    planned = plan_request(served, seqs, store, field="input")
    assert all(planned.cached)
    # hits only: the vectors come with the plan, one worker call for both
    want = served.adapter.embed_batch(seqs)
    np.testing.assert_array_equal(planned.vectors, want)
    np.testing.assert_array_equal(read_vectors(served, store, planned.plan), want)
    assert listed == []
    # `embed`'s read-back lists first (a cluster's workers committed): counted here
    gather_vectors(store, planned.plan, served.key, served.dim)
    assert listed == [served.key.digest]


def test_a_plan_with_misses_reads_no_vectors(tmp_path):
    store = EmbeddingStore(tmp_path / "store")
    [served] = load_models([ModelSpec(name="kmer-2", model="kmer-2")])
    seqs = random_seqs(20, seed=2)
    embed_sequences(served.adapter, seqs[:10], store)
    planned = plan_request(served, seqs, store, field="input")
    assert planned.cached == [True] * 10 + [False] * 10
    assert planned.vectors is None
