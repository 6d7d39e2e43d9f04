"""GENA-LM adapter: equality with the official code, recognition vs the native BERT path.

The fixtures in tests/fixtures/gena/ were computed by AIRI-Institute/GENA_LM's
src/gena_lm/modeling_bert.py run with trust_remote_code in transformers 4.38.2 (see
scripts/make_gena_fixtures.py): tiny pre-LN models with every weight moved off its init,
in the hub layout (``model_type: bert``, ``pytorch_model.bin``) without the code file,
and the pooled vectors of 25 sequences.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedcache import errors
from embedcache.models import load_adapter, read_config, recognise_family
from embedcache.models.families.gena import adapter as gena_family
from embedcache.models.families.gena.network import GenaNetwork, arch_from_config
from embedcache.models.families.hf import adapter as hf_family
from embedcache.models.options import EmbedOptions
from embedcache.models.shared.checkpoint import Source
from tests.models import adapter_contract as contract

DATA = Path(__file__).parents[1] / "fixtures" / "gena"
VARIANTS = ("gena_base", "gena_lastln")
PUBLISHED = sorted((DATA / "published").glob("*.json"))
pytestmark = pytest.mark.usefixtures("one_thread")


expected, adapters, variant = contract.variant_fixtures(DATA, VARIANTS)


def to_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    (folder / "pytorch_model.bin").unlink()
    # the masked-LM decoder shares the word embeddings: safetensors wants copies
    save_file({k: v.clone() for k, v in state.items()}, folder / "model.safetensors")
    return state


class TestGenaOfficialCode(contract.OfficialCodeContract):
    data = DATA
    cli_variant = "gena_lastln"

    def special(self, n_tokens):
        # [CLS] ... [SEP]; a run of 10+ N is a '-' token, not special
        return (True, *([False] * (n_tokens - 2)), True)


def test_final_layernorm_follows_the_config(adapters):
    assert not hasattr(adapters["gena_base"].network.encoder, "last_layer_ln")
    assert hasattr(adapters["gena_lastln"].network.encoder, "last_layer_ln")


def test_a_run_of_n_is_one_dash_token(adapters, variant):
    ours = adapters[variant].tokenizer.encode_many(contract.fixture_sequences(DATA))
    dash = ours[11]  # TTTTTTTTTTTTNNNNNNNNNNNNAAAAAAAAAAAA
    assert 5 in dash.ids
    assert 9 not in dash.ids


# --- recognition: GENA-LM says model_type bert --------------------------------------


def test_native_bert_path_refuses_gena_weights():
    folder = DATA / "gena_base"
    config = read_config(folder)
    assert config["model_type"] == "bert"
    assert recognise_family(config, folder).FAMILY == "gena"
    # what the fallback would do with it: native BertModel, strict weight check
    with pytest.raises(errors.CheckpointError, match=r"pre_attention_ln|missing"):
        hf_family.load(
            Source(
                folder=folder,
                config=config,
                model_id="local",
                revision="sha256:0",
                options=EmbedOptions(device="cpu"),
                device="cpu",
            )
        )


def test_recognised_by_weight_names_when_the_config_lacks_gena_fields(tmp_path):
    folder = contract.copy_folder(DATA / "gena_base", tmp_path)
    contract.edit_config(folder, drop=("pre_layer_norm", "last_layer_norm", "auto_map"))
    config = read_config(folder)
    # a single pickle cannot be listed cheaply: no GENA evidence, so the native path,
    # which refuses the weights rather than loading them into the wrong class
    assert recognise_family(config, folder).FAMILY == "hf-encoder"
    contract.assert_refused(folder, errors.CheckpointError, "wrong class")
    to_safetensors(folder)
    assert recognise_family(read_config(folder), folder).FAMILY == "gena"
    # recognised, but the config does not say pre-LN: refused, not guessed
    contract.assert_refused(folder, errors.CheckpointError, "pre_layer_norm")


def test_safetensors_checkpoint_loads_the_same(tmp_path, expected):
    folder = contract.copy_folder(DATA / "gena_lastln", tmp_path)
    to_safetensors(folder)
    got = load_adapter(str(folder), device="cpu").embed_batch(
        contract.fixture_sequences(DATA)
    )
    np.testing.assert_allclose(got, expected["gena_lastln_none"], atol=1e-4, rtol=0)


def test_auto_map_without_gena_evidence_needs_remote_code(tmp_path):
    folder = contract.copy_folder(DATA / "gena_base", tmp_path)
    contract.edit_config(folder, drop=("pre_layer_norm", "last_layer_norm"))
    contract.assert_refused(folder, errors.UnknownModelError, "trust-remote-code")


def test_plain_bert_is_not_gena(tiny_bert_dir, tmp_path):
    config = read_config(tiny_bert_dir)
    assert not gena_family.recognise(config, tiny_bert_dir)
    assert recognise_family(config, tiny_bert_dir).FAMILY == "hf-encoder"
    # a native (post-LN) BERT with one stray pre-LN tensor is not GENA's layout: it
    # stays with the native path, which refuses it (tests/models/test_hf.py)
    copy = tmp_path / "stray"
    shutil.copytree(tiny_bert_dir, copy)
    state = load_file(copy / "model.safetensors")
    state["encoder.layer.0.pre_attention_ln.weight"] = torch.ones(16)
    save_file(state, copy / "model.safetensors")
    assert not gena_family.recognise(config, copy)


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name.split(".")[0])
def test_published_config_is_recognised_and_builds_the_published_shapes(path):
    config = json.loads(path.read_text())
    assert config["model_type"] == "bert"
    assert recognise_family(config, path.parent).FAMILY == "gena"
    arch, network, counts = contract.published_network(
        path, DATA, arch_from_config, GenaNetwork
    )  # the official bert.* count
    base = "base" in path.name
    assert hasattr(network.encoder, "last_layer_ln") is not base
    assert arch.n_layers == (12 if base else 24)
    # the published sizes: 110M (base) and 336M (large) with the masked-LM head
    assert round(counts["total"] / 1e6) == (111 if base else 337)


# --- loading edge cases -------------------------------------------------------------


def test_renamed_or_missing_tensor_is_refused(tmp_path):
    folder = contract.copy_folder(DATA / "gena_base", tmp_path)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    name = "bert.encoder.layer.1.post_attention_ln.weight"
    state["bert.encoder.layer.1.post_attention_norm.weight"] = state.pop(name)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(
        errors.CheckpointError, match=r"missing 1 tensors .*post_attention_ln"
    ):
        load_adapter(str(folder), device="cpu")


def test_final_layernorm_the_config_does_not_have_is_refused(tmp_path):
    folder = contract.copy_folder(DATA / "gena_lastln", tmp_path)
    contract.edit_config(folder, last_layer_norm=False)
    contract.assert_refused(folder, errors.CheckpointError, "last_layer_ln")


def test_odd_position_ids_buffer_is_refused(tmp_path):
    folder = contract.copy_folder(DATA / "gena_base", tmp_path)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["bert.embeddings.position_ids"] = state["bert.embeddings.position_ids"].flip(
        -1
    )
    torch.save(state, folder / "pytorch_model.bin")
    contract.assert_refused(folder, errors.CheckpointError, "position_ids")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("position_embedding_type", "rotary"),
        ("hidden_act", "relu"),
        ("sparse_config_cls", "deepspeed.ops.sparse_attention:BigBirdSparsityConfig"),
        ("pre_layer_norm", False),
    ],
)
def test_config_variants_it_does_not_implement_are_refused(tmp_path, field, value):
    folder = contract.copy_folder(DATA / "gena_base", tmp_path)
    contract.edit_config(folder, **{field: value})
    match = "sparse attention" if field == "sparse_config_cls" else field
    contract.assert_refused(folder, errors.CheckpointError, match)


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    folder = contract.copy_folder(DATA / "gena_base", tmp_path)
    contract.assert_needs_file(folder, "tokenizer.json")


def test_options_that_do_not_apply_are_refused():
    refusals = {**contract.ENCODER_REFUSALS, "layer 3": {"layers": (3,)}}
    contract.assert_options_refused(DATA / "gena_base", refusals)


def test_context_is_the_position_table(adapters):
    adapter = adapters["gena_base"]
    assert adapter.key.max_length == 160  # max_position_embeddings of the tiny model
    long = "ACGT" * 400
    assert adapter.n_tokens(long) > 160
    with pytest.raises(errors.SequenceTooLongError, match="160"):
        adapter.embed_batch([long])
    cut = load_adapter(str(DATA / "gena_base"), device="cpu", truncation="right")
    assert cut.embed_batch([long]).shape == (1, 16)


def test_random_init_is_seeded_and_uses_the_official_init():
    path = str(DATA / "gena_lastln")
    seqs = contract.fixture_sequences(DATA)[:6]
    first = contract.seeded_twins(path, seqs, seeds=(3, 4), min_diff=1e-3)
    network = first.network
    out = network.encoder.layer[1].output.dense.weight.detach()
    assert abs(float(out.std()) - 0.02) < 0.004  # no 1/sqrt(2 n_layers) in practice
    assert torch.all(network.encoder.last_layer_ln.weight == 1)
    pad = network.embeddings.word_embeddings.weight[network.arch.pad_token_id]
    assert torch.count_nonzero(pad) == 0


def test_bfloat16_is_close_to_float32(adapters):
    seqs = contract.fixture_sequences(DATA)
    fp32 = adapters["gena_lastln"].embed_batch(seqs)
    contract.assert_bfloat16_close(DATA / "gena_lastln", seqs, fp32)


def test_key_records_family(adapters):
    key = adapters["gena_base"].key
    assert (key.adapter, key.adapter_version, key.rc_mode) == ("gena", "2", "none")


class TestGenaContract(contract.AdapterContract):
    folder = DATA / "gena_base"


class TestGenaRCAverageContract(contract.RCAverageContract):
    folder = DATA / "gena_lastln"
