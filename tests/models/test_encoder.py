"""The shared encoder adapter: padding, pooling, layers, strands, truncation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedcache.engine.local import embed_sequences
from embedcache.errors import AdapterOptionError, SequenceTooLongError
from embedcache.hashing import reverse_complement, sequence_key
from embedcache.models.options import EmbedOptions
from embedcache.models.shared.checkpoint import Source
from embedcache.models.shared.encoder import (
    Encoded,
    EncoderAdapter,
    EncoderTraits,
    truncate_right,
)
from embedcache.store import EmbeddingStore
from tests.models.adapter_contract import AdapterContract

BASES = {"A": 3, "C": 4, "G": 5, "T": 6, "N": 7}
CLS, SEP, PAD = 1, 2, 0


class CharTokenizer:
    """[CLS] + one token per base + [SEP]."""

    pad_id = PAD

    def encode(self, seq: str) -> Encoded:
        ids = (CLS, *(BASES[b] for b in seq), SEP)
        return Encoded(ids, (True, *([False] * len(seq)), True))


class CumulativeNet(torch.nn.Module):
    """Layer l's state at position t: the running mean of embeddings up to t, times
    l + 1 (causal, so padding on the right never reaches a real position)."""

    n_layers = 2
    hidden_size = 4

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(8, self.hidden_size)

    def forward(self, ids, attention_mask, layers):
        x = self.embed(ids)
        steps = torch.arange(1, ids.shape[1] + 1).view(1, -1, 1)
        running = x.cumsum(dim=1) / steps
        states = [x, running, 2 * running]
        return [states[-1] if layer == -1 else states[layer] for layer in layers]


def make_adapter(*, causal=True, has_cls=True, max_tokens=None, **options):
    traits = EncoderTraits(
        family="toy",
        adapter_version="1",
        causal=causal,
        has_cls=has_cls,
        max_tokens=max_tokens,
    )
    source = Source(
        folder=Path("toy"),
        config={},
        model_id="toy/model",
        revision="0" * 40,
        options=EmbedOptions(device="cpu", **options),
        device="cpu",
    )
    return EncoderAdapter(CharTokenizer(), CumulativeNet().eval(), traits, source)


def reference(seq: str, *, layer: int = -1, pooling: str = "mean") -> np.ndarray:
    """The pooled state of one unpadded sequence, written out by hand."""
    net = CumulativeNet().eval()
    encoded = CharTokenizer().encode(seq)
    ids = torch.tensor([encoded.ids])
    with torch.no_grad():
        [hidden] = net(ids, torch.ones_like(ids, dtype=torch.bool), [layer])
    hidden = hidden[0].numpy()
    own = hidden[1:-1]  # specials excluded
    return {"mean": own.mean(axis=0), "cls": hidden[0], "last": own[-1]}[pooling]


class TestEncoderContract(AdapterContract):
    @pytest.fixture
    def adapter(self):
        return make_adapter()


SEQS = ["ACGTACGTAC", "A", "GGGCCNT", "TTTTGCAACGTAGCATCGA"]


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_batched_pooling_equals_each_sequence_alone(pooling):
    got = make_adapter(pooling=pooling).embed_batch(SEQS)
    want = np.stack([reference(s, pooling=pooling) for s in SEQS])
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_pooling_needs_the_token_it_names():
    with pytest.raises(AdapterOptionError, match="classification token"):
        make_adapter(has_cls=False, pooling="cls")
    with pytest.raises(AdapterOptionError, match="causal"):
        make_adapter(causal=False, pooling="last")


def test_rc_average_is_the_mean_of_both_strands():
    got = make_adapter(rc_mode="average").embed_batch(SEQS)
    want = [(reference(s) + reference(reverse_complement(s))) / 2 for s in SEQS]
    np.testing.assert_allclose(got, np.stack(want), atol=1e-6, rtol=0)
    assert make_adapter(rc_mode="average").key.rc_mode == "average"


def test_layers_give_one_key_each_and_the_engine_stores_all(tmp_path):
    adapter = make_adapter(layers=(-1, 0, 1))
    assert [k.layer for k in adapter.keys] == [-1, 0, 1]
    assert len({k.digest for k in adapter.keys}) == 3
    store = EmbeddingStore(tmp_path / "store")
    result = embed_sequences(adapter, SEQS, store)
    assert result.n_computed == len(SEQS)
    for key, layer in zip(adapter.keys, (-1, 0, 1), strict=True):
        stored, found = store.get(key, [sequence_key(s) for s in SEQS])
        assert found.all()
        want = np.stack([reference(s, layer=layer) for s in SEQS])
        np.testing.assert_allclose(stored, want, atol=1e-6, rtol=0)
    # the returned vectors are those of the first key (here the last layer)
    want_last = np.stack([reference(s) for s in SEQS])
    np.testing.assert_allclose(result.vectors, want_last, atol=1e-6, rtol=0)
    again = embed_sequences(make_adapter(layers=(0,)), SEQS, store)
    assert again.n_computed == 0  # layer 0 came with the sweep


def test_a_layer_beyond_the_model_is_refused():
    with pytest.raises(AdapterOptionError, match="layer 3 does not exist"):
        make_adapter(layers=(3,))


def test_truncation_keeps_special_tokens_at_both_ends():
    encoded = CharTokenizer().encode("ACGTACGT")
    cut = truncate_right(encoded, 5)
    assert cut.ids == (CLS, 3, 4, 5, SEP)
    assert cut.special == (True, False, False, False, True)
    assert truncate_right(encoded, 20) is encoded


def test_too_long_raises_unless_truncation_is_asked_for():
    strict = make_adapter(max_tokens=6)
    with pytest.raises(SequenceTooLongError, match="--truncate right"):
        strict.embed_batch(["ACGTACGT"])
    cut = make_adapter(max_tokens=6, truncation="right").embed_batch(["ACGTACGT"])
    np.testing.assert_allclose(cut[0], reference("ACGT"), atol=1e-6, rtol=0)
