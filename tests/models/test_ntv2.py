"""NT-v2 adapter: equality with the official hub code, tokenizer, recognition, loading.

The fixtures in tests/fixtures/ntv2/ were computed by the hub's modeling_esm.py (sha256
checked against the hub's) run with trust_remote_code in transformers 4.38.2 (see
scripts/make_ntv2_fixtures.py): tiny models with every weight moved off its init, in
the hub layout without the code files, and the pooled vectors of 25 sequences.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from embedcache import errors
from embedcache.models import load_adapter, recognise_family
from embedcache.models.families.ntv2 import adapter as ntv2_family
from embedcache.models.families.ntv2.network import NTv2Network, arch_from_config
from embedcache.models.shared.esm_tokens import EsmVocabTokenizer
from tests.models import adapter_contract as contract

DATA = Path(__file__).parents[1] / "fixtures" / "ntv2"
VARIANTS = ("ntv2", "ntv2_3mer_bias")
PUBLISHED = sorted((DATA / "published").glob("*.config.json"))
pytestmark = pytest.mark.usefixtures("one_thread")


expected, adapters, variant = contract.variant_fixtures(DATA, VARIANTS)


class TestNTv2OfficialCode(contract.OfficialCodeContract):
    data = DATA
    cli_variant = "ntv2"

    def special(self, n_tokens):
        # <cls> first and special, nothing else special
        return (True, *([False] * (n_tokens - 1)))


def test_fixture_holds_lower_case():
    # lower case reaches us upper-cased
    assert any(r != r.upper() for r in contract.raw_sequences(DATA))


def test_rc_average_changes_the_fixture_vectors(expected):
    assert np.abs(expected["ntv2_none"] - expected["ntv2_average"]).max() > 0.01


def documented_6mers(seq: str, vocab: dict[str, int]) -> list[int]:
    """NT's documented rule, written out: split at N; 6-mers from the left; leftover
    bases and N one token each; <cls> first."""
    ids = [vocab["<cls>"]]
    for part in re.split(r"(N)", seq):
        if part == "N":
            ids.append(vocab["N"])
            continue
        full = len(part) - len(part) % 6
        ids += [vocab[part[i : i + 6]] for i in range(0, full, 6)]
        ids += [vocab[base] for base in part[full:]]
    return ids


@functools.cache
def published_vocab_tokenizer() -> tuple[EsmVocabTokenizer, dict[str, int]]:
    tokens = (DATA / "ntv2" / "vocab.txt").read_text().split("\n")
    tokenizer = ntv2_family.load_tokenizer(DATA / "ntv2", where="test")
    return tokenizer, {t: i for i, t in enumerate(tokens)}


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet="ACGTN", min_size=1, max_size=80))
def test_tokenizer_follows_the_documented_6mer_rule(seq):
    tokenizer, vocab = published_vocab_tokenizer()
    assert list(tokenizer.encode(seq).ids) == documented_6mers(seq, vocab)


def test_token_counts_of_benchmark_lengths(adapters):
    adapter = adapters["ntv2"]
    # 251 bp: 41 six-mers, 5 single bases, <cls>; 500 bp: 83 six-mers, 2 singles, <cls>
    assert adapter.n_tokens("ACGT" * 62 + "ACG") == 47
    assert adapter.n_tokens("ACGTA" * 100) == 86


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name.split(".")[0])
def test_published_config_is_recognised_and_builds_the_published_shapes(path):
    config = json.loads(path.read_text())
    assert "model_type" not in config  # the hub file names none
    assert recognise_family(config, path.parent).FAMILY == "ntv2"
    # the official EsmForMaskedLM built from this config, minus what we leave out
    arch, network, _ = contract.published_network(
        path, DATA, arch_from_config, NTv2Network
    )
    layer = network.encoder.layer[0]
    assert layer.intermediate.dense.weight.shape == (2 * 2048, 512)
    assert layer.output.dense.weight.shape == (512, 2048)
    assert layer.intermediate.dense.bias is None  # add_bias_fnn: false
    assert (arch.hidden_size, arch.n_heads, arch.vocab_size) == (512, 16, 4107)


def test_50m_published_total_is_the_hub_figure():
    counts = json.loads((DATA / "meta.json").read_text())["published_param_counts"]
    # the hub lists nucleotide-transformer-v2-50m-multi-species as 55.9M parameters
    total = counts["nucleotide-transformer-v2-50m-multi-species.config.json"]["total"]
    assert round(total / 1e6, 1) == 55.9


def test_native_esm_and_other_configs_are_not_ntv2(tmp_path):
    config = json.loads(PUBLISHED[0].read_text())
    assert ntv2_family.recognise(config, tmp_path)
    assert not ntv2_family.recognise({**config, "model_type": "bert"}, tmp_path)
    no_field = {k: v for k, v in config.items() if k != "add_bias_fnn"}
    assert not ntv2_family.recognise(no_field, tmp_path)
    other_code = {**config, "auto_map": {"AutoModel": "segment_nt.SegmentNT"}}
    assert not ntv2_family.recognise(other_code, tmp_path)
    with pytest.raises(errors.UnknownModelError, match="trust-remote-code"):
        recognise_family(other_code, tmp_path)


def test_renamed_or_missing_tensor_is_refused(tmp_path):
    folder = contract.copy_folder(DATA / "ntv2_3mer_bias", tmp_path)
    state = load_file(folder / "model.safetensors")
    name = "esm.encoder.layer.0.intermediate.dense.weight"
    state["esm.encoder.layer.0.intermediate.gate.weight"] = state.pop(name)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(
        errors.CheckpointError, match=r"missing 1 tensors .*intermediate\.dense"
    ):
        load_adapter(str(folder), device="cpu")
    del state["esm.encoder.layer.0.intermediate.gate.weight"]
    save_file(state, folder / "model.safetensors")
    contract.assert_refused(folder, errors.CheckpointError, "missing")


def test_bias_the_config_does_not_have_is_refused(tmp_path):
    folder = contract.copy_folder(
        DATA / "ntv2_3mer_bias", tmp_path
    )  # saved with add_bias_fnn: true
    contract.edit_config(folder, add_bias_fnn=False)
    with pytest.raises(
        errors.CheckpointError, match=r"unexpected tensors .*dense\.bias"
    ):
        load_adapter(str(folder), device="cpu")


def test_other_rotary_frequencies_are_refused(tmp_path):
    folder = contract.copy_folder(DATA / "ntv2_3mer_bias", tmp_path)
    state = load_file(folder / "model.safetensors")
    name = "esm.encoder.layer.1.attention.self.rotary_embeddings.inv_freq"
    state[name] = state[name] * 2
    save_file(state, folder / "model.safetensors")
    contract.assert_refused(folder, errors.CheckpointError, "rotary frequencies")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("position_embedding_type", "absolute"),
        ("token_dropout", True),
        ("emb_layer_norm_before", True),
        ("num_attention_heads", 3),
    ],
)
def test_config_variants_it_does_not_implement_are_refused(tmp_path, field, value):
    folder = contract.copy_folder(DATA / "ntv2_3mer_bias", tmp_path)
    contract.edit_config(folder, **{field: value})
    with pytest.raises(
        errors.CheckpointError,
        match=field if field != "num_attention_heads" else "head",
    ):
        load_adapter(str(folder), device="cpu")


def test_missing_vocab_is_a_clear_error(tmp_path):
    folder = contract.copy_folder(DATA / "ntv2_3mer_bias", tmp_path)
    contract.assert_needs_file(folder, "vocab.txt")


def test_options_that_do_not_apply_are_refused():
    refusals = {
        **contract.ENCODER_REFUSALS,
        "family-option": {"family_options": (("x", "1"),)},
        "layer 9": {"layers": (9,)},
    }
    contract.assert_options_refused(DATA / "ntv2", refusals)


def test_context_is_the_tokenizers_2048_tokens():
    adapter = load_adapter(str(DATA / "ntv2"), device="cpu")
    assert adapter.key.max_length == 2048
    long = "ACGTAC" * 2047 + "A"  # 2047 six-mers + 1 base + <cls> = 2049 tokens
    with pytest.raises(errors.SequenceTooLongError, match="2048"):
        adapter.embed_batch([long])
    cut = load_adapter(str(DATA / "ntv2"), device="cpu", truncation="right")
    np.testing.assert_allclose(
        cut.embed_batch([long])[0], cut.embed_batch([long[:-1]])[0], atol=1e-5
    )


def test_key_records_family_and_revision(adapters):
    key = adapters["ntv2"].key
    assert (key.adapter, key.adapter_version) == ("ntv2", "2")
    assert key.revision.startswith("sha256:")
    assert key.rc_mode == "none"


def test_random_init_is_seeded_and_uses_the_official_init():
    path = str(DATA / "ntv2")
    seqs = contract.fixture_sequences(DATA)[:6]
    first = contract.seeded_twins(path, seqs, seeds=(3, 4), min_diff=1e-3)
    network = first.network
    emb = network.embeddings.word_embeddings.weight
    assert torch.count_nonzero(emb[network.arch.pad_token_id]) == 0
    assert abs(float(emb.detach().std()) - 0.02) < 0.002  # initializer_range
    ln = network.encoder.layer[0].LayerNorm
    assert torch.all(ln.weight == 1)
    assert torch.all(ln.bias == 0)
    assert torch.all(network.encoder.layer[0].attention.self.query.bias == 0)
    trained = load_adapter(path, device="cpu")
    assert np.abs(trained.embed_batch(seqs) - first.embed_batch(seqs)).max() > 1e-3


def test_bfloat16_is_close_to_float32(adapters):
    seqs = contract.fixture_sequences(DATA)
    fp32 = adapters["ntv2_3mer_bias"].embed_batch(seqs)
    bf16 = contract.assert_bfloat16_close(DATA / "ntv2_3mer_bias", seqs, fp32)
    assert not np.array_equal(fp32, bf16)


class TestNTv2Contract(contract.AdapterContract):
    folder = DATA / "ntv2"


class TestNTv2RCAverageContract(contract.RCAverageContract):
    folder = DATA / "ntv2_3mer_bias"
