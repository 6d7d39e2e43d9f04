"""DNABERT-2 / DNABERT-S: equality with the official code, recognition, strict loading.

The fixtures in tests/fixtures/dnabert2/ were computed by the official hub code (see
scripts/make_dnabert2_fixtures.py): a tiny DNABERT-2 over the real 4,096-token BPE with
6 heads (the ALiBi rule for a head count that is not a power of 2), a tiny DNABERT-S in
its own layout (BertModel weights with a pooler), every weight moved off its init.
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from embedcache.errors import AdapterOptionError, CheckpointError, UnknownModelError
from embedcache.hashing import reverse_complement
from embedcache.models import load_adapter, read_config, recognise_family
from embedcache.models.families.dnabert2 import adapter as family
from embedcache.models.families.dnabert2.network import (
    MosaicBertNetwork,
    alibi_slopes,
    arch_from_config,
)
from embedcache.models.families.hf import adapter as hf
from embedcache.models.shared.checkpoint import Source
from tests.models import adapter_contract as contract

FIXTURES = Path(__file__).parents[1] / "fixtures" / "dnabert2"
MODELS = ("dnabert2", "dnabert_s")
PUBLISHED = {
    "dnabert2_117m_config.json": "2024-02 on: no model_type, no architectures",
    "dnabert2_117m_config_2024-01.json": "model_type bert, BertForMaskedLM",
    "dnabert_s_config.json": "model_type bert, BertModel, pad_token_id 0",
}


fixture_sequences = partial(contract.raw_sequences, FIXTURES)


def upper_sequences() -> list[str]:
    return [s.upper() for s in fixture_sequences()]


expected = contract.expected_fixture(FIXTURES)


@pytest.fixture(scope="module")
def official() -> dict:
    return json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture(scope="module")
def adapters() -> dict:
    """(model, rc mode) -> adapter pooling layers 0, 1, 2 and -1 in one pass."""
    return {
        (name, rc): load_adapter(
            str(FIXTURES / name), device="cpu", rc_mode=rc, layers=(-1, 0, 1, 2)
        )
        for name in MODELS
        for rc in ("none", "average")
    }


# -- equality with the official code ---------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_every_layer_matches_official_code(adapters, expected, name):
    seqs = upper_sequences()
    got = adapters[(name, "none")].embed_layers(seqs)
    np.testing.assert_allclose(got[0], expected[f"{name}_last"], atol=1e-4, rtol=0)
    for layer in (0, 1, 2):
        want = expected[f"{name}_layer{layer}"]
        np.testing.assert_allclose(got[layer + 1], want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", MODELS)
def test_rc_average_matches_official_code(adapters, expected, name):
    got = adapters[(name, "average")].embed_batch(upper_sequences())
    want = expected[f"{name}_rc_average"]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_fixture_vectors_are_not_degenerate(expected):
    # rows 6 and 7 are the same sequence, rows 8 and 9 an exact reverse-complement pair
    seqs = upper_sequences()
    assert seqs[6] == seqs[7]
    assert seqs[9] == reverse_complement(seqs[8])
    for name in MODELS:
        last = expected[f"{name}_last"]
        assert np.isfinite(last).all()
        assert np.abs(last[0] - last[-1]).max() > 0.05
        assert np.abs(last[8] - last[9]).max() > 0.01
        assert np.abs(last - expected[f"{name}_rc_average"]).max() > 0.01
        assert np.abs(last - expected[f"{name}_layer1"]).max() > 0.05


@pytest.mark.parametrize("name", MODELS)
def test_tokens_follow_the_official_tokenizer(adapters, official, name):
    tokenizer = adapters[(name, "none")].tokenizer
    encoded = tokenizer.encode_many(upper_sequences())
    assert [list(e.ids) for e in encoded] == official["tokens"][name]
    for e in encoded:  # [CLS] ... [SEP]; [UNK] (an N) counts as the sequence's own
        assert e.special == (True, *([False] * (len(e) - 2)), True)


def test_real_vocabulary_splits_as_published(adapters):
    tokenizer = adapters[("dnabert2", "none")].tokenizer
    assert tokenizer.tokenizer.get_vocab_size() == 4096
    assert tokenizer.pad_id == 3
    # N is outside the vocabulary: one [UNK] (id 0) per N
    assert tokenizer.encode("ANNA").ids == (1, 5, 0, 0, 5, 2)


def test_alibi_slopes_match_official_code(official):
    for n_heads, slopes in official["alibi_slopes"].items():
        np.testing.assert_allclose(alibi_slopes(int(n_heads)), slopes, rtol=1e-6)
    # 12 heads (the published model): the 8-head series, then 4 of the 16-head one
    twelve = alibi_slopes(12)
    assert twelve[:8] == alibi_slopes(8)
    assert twelve[8:] == alibi_slopes(16)[0::2][:4]


@pytest.mark.parametrize("name", MODELS)
def test_batched_equals_one_by_one(adapters, name):
    seqs = upper_sequences()
    for rc in ("none", "average"):
        adapter = adapters[(name, rc)]
        batch = adapter.embed_layers(seqs)
        alone = np.concatenate([adapter.embed_layers([s]) for s in seqs], axis=1)
        np.testing.assert_allclose(batch, alone, atol=1e-5, rtol=0)


@pytest.mark.cpu_kind
def test_embed_command_matches_official_code(expected, tmp_path):
    # lower case on purpose: the engine upper-cases before the tokenizer
    model = FIXTURES / "dnabert2"
    _, got = contract.embed_cli(tmp_path, model, fixture_sequences(), "--no-progress")
    np.testing.assert_allclose(got, expected["dnabert2_last"], atol=1e-4, rtol=0)


class TestContract(contract.AdapterContract):
    @pytest.fixture(params=MODELS)
    def adapter(self, request):
        return load_adapter(str(FIXTURES / request.param), device="cpu")


# -- recognition -----------------------------------------------------------------------


@pytest.mark.parametrize("published", sorted(PUBLISHED))
def test_published_configs_are_recognised_and_build_published_shapes(
    published, tmp_path
):
    config = json.loads((FIXTURES / "published" / published).read_text())
    module = recognise_family(config, tmp_path)
    assert module is family
    arch = arch_from_config(config, where=published)
    with torch.device("meta"):
        network = MosaicBertNetwork(arch)
    shapes = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    assert shapes["embeddings.word_embeddings.weight"] == (4096, 768)
    assert shapes["embeddings.token_type_embeddings.weight"] == (2, 768)
    assert shapes["encoder.layer.11.attention.self.Wqkv.weight"] == (2304, 768)
    assert shapes["encoder.layer.11.mlp.gated_layers.weight"] == (6144, 768)
    assert shapes["encoder.layer.11.mlp.wo.weight"] == (768, 3072)
    assert "encoder.layer.12.mlp.wo.weight" not in shapes
    # the encoder's 116.5M; the masked-LM head (or DNABERT-S's pooler) makes the 117M
    assert sum(p.numel() for p in network.parameters()) == 116_477_952
    assert network.slopes == tuple(alibi_slopes(12))


def test_pad_token_follows_the_config_class():
    published = FIXTURES / "published"
    pads = {
        name: arch_from_config(
            json.loads((published / name).read_text()), where=name
        ).pad_token_id
        for name in PUBLISHED
    }
    assert pads == {
        "dnabert2_117m_config.json": None,
        "dnabert2_117m_config_2024-01.json": 0,
        "dnabert_s_config.json": 0,
    }


def test_auto_map_with_repo_prefix_is_recognised():
    # configs saved by fine-tuning runs point at the hub repository's code
    config = json.loads(
        (FIXTURES / "published" / "dnabert2_117m_config.json").read_text()
    )
    config["auto_map"] = {
        "AutoModel": "zhihan1996/DNABERT-2-117M--bert_layers.BertModel"
    }
    assert family.is_mosaic_bert_config(config)
    del config["alibi_starting_size"]
    assert not family.is_mosaic_bert_config(config)


def copy_model(name: str, dest: Path) -> Path:
    shutil.copytree(FIXTURES / name, dest)
    return dest


def test_without_auto_map_the_weight_names_decide(tmp_path, tiny_bert_dir):
    path = copy_model("dnabert_s", tmp_path / "m")
    config = read_config(path)
    del config["auto_map"]
    (path / "config.json").write_text(json.dumps(config))
    assert recognise_family(config, path) is family
    # the same config fields over native BERT weights stay native
    native = tmp_path / "native"
    shutil.copytree(tiny_bert_dir, native)
    native_config = read_config(native)
    native_config["alibi_starting_size"] = 512
    assert not family.recognise(native_config, native)
    assert recognise_family(native_config, native) is hf


def test_native_bert_path_refuses_dnabert_s_weights():
    # DNABERT-S says model_type bert: native BertModel would get random attention
    path = FIXTURES / "dnabert_s"
    config = read_config(path)
    with pytest.raises(CheckpointError, match="wrong class"):
        hf.load(
            Source(
                folder=path,
                config=config,
                model_id="local",
                revision="x",
                options=family_options(),
                device="cpu",
            )
        )


def family_options(**kwargs):
    from embedcache.models.options import EmbedOptions

    return EmbedOptions(device="cpu", **kwargs)


# -- strict loading --------------------------------------------------------------------


def rewrite_weights(path: Path, edit) -> None:
    state = torch.load(path / "pytorch_model.bin", weights_only=True)
    edit(state)
    torch.save(state, path / "pytorch_model.bin")


def test_renamed_tensor_is_refused(tmp_path):
    path = copy_model("dnabert2", tmp_path / "m")
    name = "bert.encoder.layer.1.mlp.wo.weight"

    def rename(state):
        state["bert.encoder.layer.1.mlp.w0.weight"] = state.pop(name)

    rewrite_weights(path, rename)
    with pytest.raises(CheckpointError, match=r"missing 1 tensors.*1 unexpected"):
        load_adapter(str(path), device="cpu")


def test_missing_or_misshaped_tensor_is_refused(tmp_path):
    path = copy_model("dnabert_s", tmp_path / "m")
    rewrite_weights(path, lambda s: s.pop("encoder.layer.0.mlp.gated_layers.weight"))
    with pytest.raises(CheckpointError, match="gated_layers"):
        load_adapter(str(path), device="cpu")
    path = copy_model("dnabert_s", tmp_path / "m2")

    def shrink(state):
        state["encoder.layer.0.mlp.wo.bias"] = state["encoder.layer.0.mlp.wo.bias"][:-1]

    rewrite_weights(path, shrink)
    with pytest.raises(CheckpointError, match="shapes"):
        load_adapter(str(path), device="cpu")


def test_heads_are_left_out_but_nothing_else(tmp_path):
    # DNABERT-2's cls.* and DNABERT-S's pooler.* load; a stray encoder tensor does not
    names = set(
        torch.load(FIXTURES / "dnabert2" / "pytorch_model.bin", weights_only=True)
    )
    assert any(n.startswith("cls.") for n in names)
    names = set(
        torch.load(FIXTURES / "dnabert_s" / "pytorch_model.bin", weights_only=True)
    )
    assert "pooler.dense.weight" in names
    path = copy_model("dnabert2", tmp_path / "m")
    rewrite_weights(
        path,
        lambda s: s.update(
            {"bert.embeddings.position_embeddings.weight": torch.zeros(4, 12)}
        ),
    )
    with pytest.raises(CheckpointError, match="position_embeddings"):
        load_adapter(str(path), device="cpu")


def test_unofficial_code_beside_the_weights_is_refused(tmp_path, monkeypatch):
    path = copy_model("dnabert2", tmp_path / "m")
    (path / "bert_layers.py").write_text("# a modified MosaicBERT\n")
    with pytest.raises(CheckpointError, match="trust-remote-code"):
        load_adapter(str(path), device="cpu")
    calls = []
    monkeypatch.setattr(hf, "load", lambda s: calls.append(s.folder) or "remote")
    assert load_adapter(str(path), device="cpu", trust_remote_code=True) == "remote"
    assert calls == [path]


def test_missing_tokenizer_is_refused(tmp_path):
    path = copy_model("dnabert2", tmp_path / "m")
    (path / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer\.json"):
        load_adapter(str(path), device="cpu")


def test_stored_truncation_is_ignored_like_the_official_call(tmp_path):
    path = copy_model("dnabert2", tmp_path / "m")
    data = json.loads((path / "tokenizer.json").read_text())
    data["truncation"] = {
        "direction": "Right",
        "max_length": 4,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    (path / "tokenizer.json").write_text(json.dumps(data))
    adapter = load_adapter(str(path), device="cpu")
    assert adapter.n_tokens(upper_sequences()[-1]) > 4


def test_bad_config_names_the_field(tmp_path):
    path = copy_model("dnabert2", tmp_path / "m")
    config = read_config(path)
    config["num_attention_heads"] = 5
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not a multiple of num_attention_heads"):
        load_adapter(str(path), device="cpu")


# -- options ---------------------------------------------------------------------------


def test_options_that_do_not_apply_are_refused():
    path = str(FIXTURES / "dnabert2")
    with pytest.raises(AdapterOptionError, match="--family-option"):
        load_adapter(path, device="cpu", family_options=(("trim", "6"),))
    with pytest.raises(AdapterOptionError, match="kmer-split"):
        load_adapter(path, device="cpu", kmer_split=6)
    with pytest.raises(AdapterOptionError, match="causal"):
        load_adapter(path, device="cpu", pooling="last")


def test_key_and_cls_pooling(adapters, expected):
    adapter = adapters[("dnabert2", "none")]
    assert adapter.key.adapter == "dnabert2"
    assert adapter.key.max_length is None  # ALiBi: no position table, no limit
    assert adapter.dim == 12
    cls = load_adapter(str(FIXTURES / "dnabert2"), device="cpu", pooling="cls")
    assert cls.key.digest != adapter.key.digest
    got = cls.embed_batch(upper_sequences()[:3])
    assert np.abs(got - expected["dnabert2_last"][:3]).max() > 1e-3


def test_random_init_is_seeded_and_follows_the_official_init():
    path = str(FIXTURES / "dnabert_s")
    seqs = upper_sequences()[:5]
    first = contract.seeded_twins(path, seqs, seeds=(1, 2), min_diff=1e-3)
    net = first.network
    block = net.encoder.layer[0]
    assert torch.all(block.attention["output"]["LayerNorm"].weight == 1)
    assert torch.all(block.attention["self"]["Wqkv"].bias == 0)
    assert block.mlp["gated_layers"].bias is None
    assert 0.015 < float(block.mlp["gated_layers"].weight.std()) < 0.025
    # DNABERT-S's config has pad_token_id 0: that embedding row starts at zero
    assert torch.all(net.embeddings.word_embeddings.weight[0] == 0)
    assert torch.any(net.embeddings.word_embeddings.weight[1] != 0)


def test_bfloat16_stays_close_to_float32(adapters):
    seqs = upper_sequences()
    fp32 = adapters[("dnabert2", "none")].embed_batch(seqs)
    bf16 = load_adapter(str(FIXTURES / "dnabert2"), device="cpu", dtype="bfloat16")
    assert bf16.key.dtype == "bfloat16"
    assert contract.min_cosine(bf16.embed_batch(seqs), fp32) > 0.999


def test_unknown_remote_code_family_is_still_refused(tmp_path):
    # an auto_map into some other code is not DNABERT-2
    config = {"model_type": "bert", "auto_map": {"AutoModel": "modeling_x.XModel"}}
    with pytest.raises(UnknownModelError, match="trust-remote-code"):
        recognise_family(config, tmp_path)
