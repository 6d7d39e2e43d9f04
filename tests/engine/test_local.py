from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from embedcache.engine.local import embed_sequences
from embedcache.engine.plan import EmbedResult
from embedcache.errors import InvalidSequenceError, SequenceTooLongError
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from embedcache.models.shared.padding import padded_length
from tests.engine.helpers import MemoryStore, random_seqs


@pytest.fixture
def bert(tiny_bert_dir):
    return load_adapter(str(tiny_bert_dir), device="cpu")


def test_engine_matches_adapter_in_input_order(bert):
    seqs = random_seqs(20)
    store = MemoryStore()
    result = embed_sequences(bert, seqs, store, token_budget=200)
    assert isinstance(result, EmbedResult)
    assert result.vectors.dtype == np.float32
    assert result.vectors.shape == (20, bert.dim)
    alone = np.concatenate([bert.embed_batch([seq]) for seq in seqs])
    np.testing.assert_allclose(result.vectors, alone, atol=1e-5, rtol=0)
    assert (result.n_computed, result.n_cached) == (20, 0)


def test_batched_equals_unbatched(bert):
    seqs = random_seqs(30, seed=1)
    one_by_one, batched = MemoryStore(), MemoryStore()
    a = embed_sequences(bert, seqs, one_by_one, token_budget=1)
    b = embed_sequences(bert, seqs, batched, token_budget=10_000)
    assert len(one_by_one.puts) == 30  # one commit per batch
    # one batch per length bucket (7-42 tokens: buckets 16, 32 and 48) ...
    buckets = Counter(padded_length(n) for n in bert.n_tokens_many(seqs))
    assert sorted(batched.puts) == sorted(buckets.values())
    assert len(buckets) == 3
    # ... and the same bytes as one at a time
    np.testing.assert_array_equal(a.vectors, b.vectors)


def test_only_missing_are_computed_and_duplicates_once(bert):
    store = MemoryStore()
    first = random_seqs(10, seed=2)
    embed_sequences(bert, first, store)
    more = [*first[:4], "ACGTACGT", "acgtacgt", first[0]]
    result = embed_sequences(bert, more, store)
    # ACGTACGT and acgtacgt are one sequence (case is normalised): computed once
    assert (result.n_computed, result.n_cached) == (1, 6)
    assert store.puts[-1] == 1
    np.testing.assert_array_equal(result.vectors[4], result.vectors[5])
    again = embed_sequences(bert, more, store)
    assert (again.n_computed, again.n_cached) == (0, 7)
    np.testing.assert_array_equal(again.vectors, result.vectors)


def test_too_long_item_is_named_and_store_unchanged(bert):
    store = MemoryStore()
    seqs = ["ACGT", "A" * 100, "GGCC"]
    with pytest.raises(
        SequenceTooLongError, match=r"item-b: a 100 bp sequence is 102 tokens"
    ):
        embed_sequences(bert, seqs, store, names=["item-a", "item-b", "item-c"])
    assert store.data == {}
    assert store.puts == []


def test_bad_character_is_named_and_store_unchanged(bert):
    store = MemoryStore()
    with pytest.raises(
        InvalidSequenceError, match=r"sequence #1 \(0-based\): invalid character 'Z'"
    ):
        embed_sequences(bert, ["ACGT", "ACZT"], store)
    assert store.puts == []


def test_truncation_policy_lets_long_items_through(tiny_bert_dir):
    adapter = load_adapter(str(tiny_bert_dir), device="cpu", truncation="right")
    result = embed_sequences(adapter, ["A" * 100, "ACGT"], MemoryStore())
    assert result.n_computed == 2


def test_kmer_engine_and_empty_input():
    adapter = load_adapter("kmer-2")
    store = MemoryStore()
    result = embed_sequences(adapter, ["ACGT", "NNNN", "ACGT"], store)
    assert (result.n_computed, result.n_cached) == (2, 1)
    assert result.vectors[1].sum() == 0
    empty = embed_sequences(adapter, [], store)
    assert empty.vectors.shape == (0, 16)


def test_each_commit_records_the_kernels_that_computed_it(bert, monkeypatch):
    from embedcache.models.shared import tuning

    monkeypatch.setenv(tuning.ENV_VAR, "attention=math,linear=aten")
    store = MemoryStore()
    embed_sequences(bert, random_seqs(12, seed=3), store, token_budget=200)
    assert store.kernels
    for kernels in store.kernels:
        assert kernels["cpu_kind"] == tuning.process_tuner().fingerprint["cpu_kind"]
        assert kernels["torch"] == tuning.process_tuner().fingerprint["torch"]
        chosen = {name.split()[0]: v for name, v in kernels.items() if " " in name}
        assert chosen == {"attention": "math", "linear": "aten"}
    # the k-mer floors run no tuned kernel and no torch: nothing to record
    kmer = MemoryStore()
    embed_sequences(load_adapter("kmer-2"), ["ACGT", "GGCA"], kmer)
    assert kmer.kernels == [None]


def test_store_is_keyed_by_sequence_hash(bert):
    store = MemoryStore()
    embed_sequences(bert, ["acgt"], store)
    assert (bert.key, sequence_key("ACGT")) in store.data


def test_chunked_run_equals_one_chunk_with_repeats_across_chunks(bert, monkeypatch):
    from embedcache.engine import plan

    base = random_seqs(9, seed=5)
    # repeats within and across chunks of 4 rows, one differing only in case
    seqs = [*base[:5], base[1], base[6], base[0].lower(), *base[5:], base[8], base[2]]
    whole_store = MemoryStore()
    whole = embed_sequences(bert, seqs, whole_store, token_budget=120)
    monkeypatch.setattr(plan, "LOOKUP_CHUNK", 4)
    chunked_store = MemoryStore()
    chunked = embed_sequences(bert, seqs, chunked_store, token_budget=120)
    assert (chunked.n_computed, chunked.n_cached) == (9, len(seqs) - 9)
    assert (chunked.n_computed, chunked.n_cached) == (whole.n_computed, whole.n_cached)
    # the same batches, so the same floats, in input order; nothing embedded twice
    np.testing.assert_array_equal(chunked.vectors, whole.vectors)
    assert chunked_store.puts == whole_store.puts
    assert sum(chunked_store.puts) == 9
    alone = np.concatenate([bert.embed_batch([s.upper()]) for s in seqs])
    np.testing.assert_allclose(chunked.vectors, alone, atol=1e-5, rtol=0)
    again = embed_sequences(bert, seqs, chunked_store)
    assert (again.n_computed, again.n_cached) == (0, len(seqs))
    np.testing.assert_array_equal(again.vectors, whole.vectors)
    # a bad item in the last chunk is still found before anything is computed
    fresh = MemoryStore()
    with pytest.raises(SequenceTooLongError, match="sequence #14 "):
        embed_sequences(bert, [*seqs, "A" * 100], fresh)
    assert fresh.puts == []


def test_chunked_read_back_from_a_real_store(tmp_path, monkeypatch):
    from embedcache.engine import plan
    from embedcache.store import EmbeddingStore

    kmer = load_adapter("kmer-3")
    seqs = random_seqs(40, seed=6)
    seqs = [*seqs, *seqs[::3], seqs[7]]
    whole = embed_sequences(kmer, seqs, EmbeddingStore(tmp_path / "a"))
    monkeypatch.setattr(plan, "LOOKUP_CHUNK", 6)
    chunked = embed_sequences(kmer, seqs, EmbeddingStore(tmp_path / "b"))
    np.testing.assert_array_equal(chunked.vectors, whole.vectors)
    np.testing.assert_array_equal(chunked.vectors, kmer.embed_batch(seqs))
    assert (chunked.n_computed, chunked.n_cached) == (40, len(seqs) - 40)
