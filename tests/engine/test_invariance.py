"""A sequence's vector is a function of (key, sequence) alone, bit for bit, in every
dtype: not of the other sequences in its batch, the batch's padded length or the
token budget that cut the batches (docs/reproducibility.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedcache.engine.batching import BatchRule, plan_batches
from embedcache.engine.local import embed_sequences
from embedcache.models import load_adapter
from embedcache.models.shared.padding import padded_length
from tests.conftest import make_dna_tokenizer
from tests.engine.helpers import MemoryStore, random_seqs

HYENA_TINY = Path(__file__).parents[1] / "fixtures" / "hyena" / "tiny"
CADUCEUS_PH = Path(__file__).parents[1] / "fixtures" / "caduceus" / "ph"


@pytest.fixture(scope="module")
def bert64_dir(tmp_path_factory) -> Path:
    """The issue's case: a 64-wide 2-layer BERT, one token per base."""
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = make_dna_tokenizer(style="bert")
    path = tmp_path_factory.mktemp("bert64")
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(bert64_dir) -> dict[str, tuple[Path, int]]:
    """model folder and the longest sequence (bp) it takes."""
    return {
        "bert": (bert64_dir, 400),
        "hyena": (HYENA_TINY, 300),
        "caduceus": (CADUCEUS_PH, 300),
    }


def compositions(high: int) -> tuple[list[str], list[list[str]]]:
    """Six sequences, and two inputs holding them: among 24 others of any length,
    among 24 of nearly the longest length (each is also embedded alone)."""
    targets = random_seqs(6, seed=21, low=100, high=high)
    mixed = random_seqs(24, seed=22, low=100, high=high)
    long = random_seqs(24, seed=23, low=high - 20, high=high)
    return targets, [mixed[:12] + targets + mixed[12:], [*long, *targets]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["bert", "hyena", "caduceus"])
def test_vectors_are_the_same_bytes_in_any_batch(models, family, dtype):
    folder, high = models[family]
    adapter = load_adapter(str(folder), device="cpu", dtype=dtype)
    targets, inputs = compositions(high)
    alone = np.stack(
        [embed_sequences(adapter, [s], MemoryStore()).vectors[0] for s in targets]
    )
    for seqs, budget in zip(inputs, (1024, 4096), strict=True):
        got = embed_sequences(adapter, seqs, MemoryStore(), token_budget=budget)
        rows = [seqs.index(s) for s in targets]
        assert got.vectors[rows].tobytes() == alone.tobytes(), (family, dtype, budget)
    # and straight through the adapter, unsorted, whatever its batch holds
    direct = adapter.embed_batch([*inputs[1][:5], *targets[::-1]])[5:][::-1]
    assert direct.astype(np.float32).tobytes() == alone.tobytes()


def test_buckets_keep_batches_of_one_length_bucket():
    rule = BatchRule(token_budget=4096, buckets=True)
    lengths = [100, 255, 256, 257, 300, 511, 512, 513, 33, 48, 49]
    for batch in plan_batches(lengths, rule):
        assert len({padded_length(lengths[i]) for i in batch}) == 1
        assert len(batch) * padded_length(max(lengths[i] for i in batch)) <= 4096


@pytest.mark.parametrize("n", [1, 15, 16, 17, 255, 256, 257, 300, 513, 1000, 5000])
def test_a_bucket_holds_its_length_and_wastes_little(n):
    bucket = padded_length(n)
    assert n <= bucket <= max(n + 15, n * 17 // 16 + 1)
    assert padded_length(bucket) == bucket  # a bucket's own length stays put
    assert padded_length(n, limit=n) == n  # never beyond the model's context
