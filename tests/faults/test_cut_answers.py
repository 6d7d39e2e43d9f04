"""A commit whose answer is cut short: the record was created, the client never heard.

The proxy forwards each commit record's first PUT to moto and cuts the answer at one
of three points. Whatever obstore then does (retry by itself and hear "already
exists", or report the broken answer), the writer must recognise the record as its
own: the run finishes in one go and commits each run exactly once.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedcache.engine.api import embed_into_store
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from tests.faults.proxy import CUTS
from tests.faults.test_object_store import MODEL, RECORD, assert_whole, seqs_of
from tests.store.worker import KEY, dataset

N_PUTS = 4
PER_PUT = 15


def commit_records(handle) -> list[dict]:
    """The attrs of every commit record in the store (read directly)."""
    paths = handle.paths("*/commits/*/zarr.json")
    docs = [json.loads(handle.read(p))["attributes"]["embedcache"] for p in paths]
    return [d for d in docs if d["kind"] == "embedcache-commit"]


@pytest.mark.parametrize("cut", CUTS)
def test_a_put_stream_through_cut_answers_commits_each_run_once(faulty, proxy, cut):
    through, direct = faulty
    hashes, vectors = dataset(N_PUTS * PER_PUT)
    store = through.open(auto_merge=0)
    proxy.inject(rate=1.0, kinds=(cut,), method="PUT", path=RECORD, first_only=True)
    for i in range(0, len(hashes), PER_PUT):
        part = slice(i, i + PER_PUT)
        assert store.put(KEY, hashes[part], vectors[part]) == PER_PUT
    assert proxy.counts[cut] == N_PUTS  # every commit's first answer was cut
    proxy.calm()
    records = commit_records(direct)
    assert len(records) == N_PUTS
    assert sorted(r["n_rows"] for r in records) == [PER_PUT] * N_PUTS
    assert_whole(direct.open(), hashes, vectors)
    assert direct.open().garbage() == []


@pytest.mark.parametrize("cut", CUTS)
def test_embedding_through_cut_answers_completes_in_one_run(faulty, proxy, cut):
    through, direct = faulty
    seqs = seqs_of(120, seed=5)
    reference = load_adapter(MODEL).embed_batch(seqs)
    proxy.inject(rate=1.0, kinds=(cut,), method="PUT", path=RECORD, first_only=True)
    result = embed_into_store(
        MODEL, seqs, through.root, store_options=through.options, token_budget=1500
    )
    n_cut = proxy.counts[cut]
    proxy.calm()
    assert result.n_computed == len(seqs)
    records = commit_records(direct)
    # each record's first answer was cut
    assert n_cut >= len(records) > 0
    # the runs merged away stay for their grace: the others hold each row once
    merged_away = {old for r in records for old in r["supersedes"]}
    visible = [r for r in records if r["shard"] not in merged_away]
    assert sum(r["n_rows"] for r in visible) == len(seqs)  # no row committed twice
    fresh = direct.open()
    assert fresh.verify() == []
    got, found = fresh.get(result.keys[0], [sequence_key(s) for s in seqs])
    assert found.all()
    np.testing.assert_allclose(got, reference, rtol=1e-6)
    assert fresh.garbage() == []
