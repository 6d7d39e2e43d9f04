"""A flaky object store: moto's S3 server behind a proxy that injects faults.

Every test checks that the proxy really injected what it was asked to (its counts),
then that nothing was lost, duplicated or half-visible, by reading the bucket
directly (not through the proxy).
"""

from __future__ import annotations

import numpy as np
import pytest

from embedcache.engine.api import embed_into_store
from embedcache.errors import StoreUnavailableError
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from tests.store.worker import KEY, dataset, watching_collector

N = 240
MODEL = "kmer-3"
# a commit record (not the key's commits/zarr.json group document)
RECORD = r"/commits/[^/]+/zarr\.json"


def seqs_of(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        "".join(rng.choice(list("ACGT"), size=rng.integers(20, 90))) for _ in range(n)
    ]


def assert_whole(store, hashes, vectors) -> None:
    """Every row once, equal to what was put; verify clean; no run twice."""
    got, found = store.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    info = store.keys()[0]
    assert info.n_vectors == len(hashes)
    assert store.verify() == []


def fill(handle, n: int, per_run: int):
    """Put rows 0..n-1 directly (not through the proxy), ``per_run`` a commit."""
    hashes, vectors = dataset(n)
    store = handle.open(auto_merge=0)
    for i in range(0, n, per_run):
        store.put(KEY, hashes[i : i + per_run], vectors[i : i + per_run])
    return hashes, vectors


def n_commit_records(handle) -> int:
    return len(handle.paths("*/commits/*/zarr.json"))


@pytest.mark.parametrize("fault", ["refuse", "500", "503", "reset", "stall"])
def test_each_fault_at_a_commit_is_survived_exactly_once(faulty, proxy, fault):
    through, direct = faulty
    hashes, vectors = dataset(60)
    store = through.open(auto_merge=0)
    # the fault hits the next conditional create of a commit record
    proxy.inject(fault, method="PUT", path=RECORD)
    assert store.put(KEY, hashes, vectors) == 60
    assert proxy.counts[fault] == 1
    assert store.put(KEY, hashes, vectors) == 0  # idempotent, through the proxy
    # read directly: one commit, every row, nothing half-visible
    fresh = direct.open()
    assert n_commit_records(direct) == 1
    assert_whole(fresh, hashes, vectors)
    assert fresh.garbage() == []


def test_a_lost_answer_to_a_commit_is_recognised_as_our_own(faulty, proxy):
    # the server creates the record, the client sees a reset: the retry then finds
    # the record; it must be taken as ours, not as another writer's
    through, direct = faulty
    hashes, vectors = dataset(30)
    store = through.open(auto_merge=0)
    proxy.inject("reset", "reset", method="PUT", path=RECORD)
    assert store.put(KEY, hashes, vectors) == 30
    assert proxy.counts["reset"] == 2
    assert n_commit_records(direct) == 1
    assert_whole(direct.open(), hashes, vectors)


def test_embedding_through_random_faults_loses_and_duplicates_nothing(faulty, proxy):
    through, direct = faulty
    seqs = seqs_of(N)
    reference = load_adapter(MODEL).embed_batch(seqs)
    proxy.inject(rate=0.15, kinds=("refuse", "500", "503", "reset"))
    result = embed_into_store(
        MODEL, seqs, through.root, store_options=through.options, token_budget=1500
    )
    store = through.open()
    store.compact()
    assert store.verify() == []
    got, found = store.get(result.keys[0], [sequence_key(s) for s in seqs])
    faults = dict(proxy.counts)
    proxy.calm()
    assert {"refuse", "500", "503", "reset"} <= faults.keys(), faults
    assert result.n_computed == N
    assert found.all()
    np.testing.assert_allclose(got, reference, rtol=1e-6)
    np.testing.assert_allclose(result.vectors, reference, rtol=1e-6)
    # directly: one run after compaction, no garbage left, every vector once
    fresh = direct.open()
    info = fresh.keys()[0]
    assert (info.n_vectors, info.n_runs) == (N, 1)
    assert fresh.garbage() == []
    again = embed_into_store(MODEL, seqs, direct.root, store_options=direct.options)
    assert again.n_computed == 0


def test_a_dead_store_fails_with_one_clear_error_and_a_rerun_completes(faulty, proxy):
    through, direct = faulty
    hashes, vectors = dataset(90)
    store = through.open(auto_merge=0)
    store.put(KEY, hashes[:30], vectors[:30])
    proxy.inject(rate=1.0, kinds=("503",), method="PUT")
    with pytest.raises(StoreUnavailableError) as err:
        store.put(KEY, hashes, vectors)
    assert proxy.counts["503"] > 1  # obstore retried before giving up
    message = str(err.value)
    assert through.root in message  # names the store
    assert "while writing" in message or "while committing" in message
    proxy.calm()
    # the earlier commit stands, nothing half-visible; a rerun computes the rest
    fresh = direct.open()
    got, found = fresh.get(KEY, hashes)
    assert found.sum() == 30
    np.testing.assert_array_equal(got[:30], vectors[:30])
    assert fresh.verify() == []
    assert store.put(KEY, hashes, vectors) == 60
    assert_whole(direct.open(), hashes, vectors)


def test_verify_compact_and_reads_survive_faults(faulty, proxy):
    through, direct = faulty
    hashes, vectors = fill(direct, 120, 20)
    flaky = through.open(auto_merge=0)
    proxy.inject(rate=0.2, kinds=("refuse", "500", "503", "reset"))
    assert flaky.verify() == []
    flaky.compact()
    got, found = flaky.get(KEY, hashes[::-1])
    n_faults = proxy.n_faults
    proxy.calm()
    assert n_faults >= 5, dict(proxy.counts)
    assert found.all()
    np.testing.assert_array_equal(got, vectors[::-1])
    fresh = direct.open()
    assert fresh.keys()[0].n_runs == 1
    assert fresh.garbage() == []
    assert_whole(fresh, hashes, vectors)


def test_a_failing_compact_names_the_store_and_leaves_every_row(faulty, proxy):
    through, direct = faulty
    hashes, vectors = fill(direct, 60, 20)
    flaky = through.open(auto_merge=0)
    proxy.inject(rate=1.0, kinds=("500",), method="PUT", path=RECORD)
    with pytest.raises(StoreUnavailableError, match="committing") as err:
        flaky.compact()
    assert through.root in str(err.value)
    assert proxy.counts["500"] > 1
    proxy.calm()
    fresh = direct.open()
    assert fresh.keys()[0].n_runs == 3  # the merged run never became visible
    assert_whole(fresh, hashes, vectors)
    # its run could not be claimed either (the record's create might still land):
    # it stays until a collector has seen it sit still, claims and removes it
    assert len(fresh.garbage()) == 1
    fresh.compact()
    assert fresh.keys()[0].n_runs == 1
    later = watching_collector(direct)
    later.compact()
    assert later.garbage() == []
    assert_whole(later, hashes, vectors)
