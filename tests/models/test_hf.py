from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModel, AutoTokenizer

from embedcache import errors
from embedcache.hashing import reverse_complement
from embedcache.models import (
    load_adapter,
    local_revision,
    read_config,
    recognise_family,
    resolve_device,
)
from embedcache.models.families.hf.adapter import kmer_split, token_budget
from tests.conftest import make_kmer3_tokenizer, save_tiny_model
from tests.models.adapter_contract import AdapterContract, min_cosine

SEQS = ["ACGTACGTAC", "GGGCCCAANT", "A", "TTTTGCAACGTAGCATCGA"]


def direct_mean(path, seqs, *, include_special=False, layer=-1):
    """Reference: a plain transformers forward pass and a masked mean written out here."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for seq in seqs:  # one at a time: no padding involved at all
        enc = tokenizer(seq, return_tensors="pt", return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask")[0].bool()
        with torch.no_grad():
            result = model(**enc, output_hidden_states=True)
        hidden = (
            result.last_hidden_state if layer == -1 else result.hidden_states[layer]
        )
        keep = torch.ones_like(special) if include_special else ~special
        out.append(hidden[0][keep].mean(dim=0).numpy())
    return np.stack(out)


@pytest.fixture(params=["bert", "esm"])
def model_dir(request, tiny_bert_dir, tiny_esm_dir):
    return tiny_bert_dir if request.param == "bert" else tiny_esm_dir


class TestHFContract(AdapterContract):
    @pytest.fixture
    def adapter(self, model_dir):
        return load_adapter(str(model_dir), device="cpu")


class TestHFIncludeSpecialContract(AdapterContract):
    @pytest.fixture
    def adapter(self, tiny_esm_dir):
        return load_adapter(str(tiny_esm_dir), device="cpu", special_tokens="include")


@pytest.mark.parametrize("include_special", [False, True])
def test_vectors_equal_direct_forward_and_masked_mean(model_dir, include_special):
    policy = "include" if include_special else "exclude"
    adapter = load_adapter(str(model_dir), device="cpu", special_tokens=policy)
    got = adapter.embed_batch(SEQS)  # padded batch
    want = direct_mean(model_dir, SEQS, include_special=include_special)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_special_token_policies_differ_and_are_keyed(model_dir):
    exclude = load_adapter(str(model_dir), device="cpu")
    include = load_adapter(str(model_dir), device="cpu", special_tokens="include")
    assert not np.allclose(
        exclude.embed_batch(SEQS), include.embed_batch(SEQS), atol=1e-4
    )
    assert exclude.key.special_tokens == "exclude"
    assert include.key.special_tokens == "include"
    assert exclude.key.digest != include.key.digest


def test_layer_option_pools_that_hidden_state(model_dir):
    adapter = load_adapter(str(model_dir), device="cpu", layers=(1,))
    np.testing.assert_allclose(
        adapter.embed_batch(SEQS),
        direct_mean(model_dir, SEQS, layer=1),
        atol=1e-5,
        rtol=0,
    )
    assert adapter.key.layer == 1
    with pytest.raises(errors.AdapterOptionError, match="layer 9"):
        load_adapter(str(model_dir), device="cpu", layers=(9,))


def test_key_pins_content_and_options(tiny_bert_dir):
    key = load_adapter(str(tiny_bert_dir), device="cpu").key
    assert key.adapter == "hf-encoder"
    assert key.revision == local_revision(tiny_bert_dir)
    assert key.revision.startswith("sha256:")
    assert key.max_length == 64  # BERT: max_position_embeddings
    assert key.dtype == "float32"
    assert key.truncation == "error"
    assert dict(key.options)["model_type"] == "bert"


def test_max_tokens_from_tokenizer_for_rotary_esm(tiny_esm_dir):
    # rotary positions have no table; the tokenizer's model_max_length is the limit
    assert load_adapter(str(tiny_esm_dir), device="cpu").max_tokens == 48


def test_local_revision_follows_content(tiny_bert_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_bert_dir, copy)
    assert local_revision(copy) == local_revision(tiny_bert_dir)
    (copy / "README.md").write_text("notes do not change vectors")
    assert local_revision(copy) == local_revision(tiny_bert_dir)
    config = json.loads((copy / "config.json").read_text())
    config["layer_norm_eps"] = 1e-6
    (copy / "config.json").write_text(json.dumps(config))
    assert local_revision(copy) != local_revision(tiny_bert_dir)


def test_revision_for_local_dir_must_match(tiny_bert_dir):
    with pytest.raises(errors.AdapterOptionError, match="drop --revision"):
        load_adapter(str(tiny_bert_dir), device="cpu", revision="v1.0")
    good = local_revision(tiny_bert_dir)
    assert (
        load_adapter(str(tiny_bert_dir), device="cpu", revision=good).key.revision
        == good
    )


def test_too_long_raises_unless_truncation(tiny_bert_dir):
    adapter = load_adapter(str(tiny_bert_dir), device="cpu")
    long = "ACGT" * 16  # 64 bases + [CLS] + [SEP] = 66 tokens > 64
    assert adapter.n_tokens(long) == 66
    with pytest.raises(errors.SequenceTooLongError, match="more than the 64"):
        adapter.embed_batch(["ACGT", long])
    cut = load_adapter(str(tiny_bert_dir), device="cpu", truncation="right")
    assert cut.key.truncation == "right"
    assert cut.key.digest != adapter.key.digest
    vectors = cut.embed_batch(["ACGT", long])
    # right truncation keeps the first 62 bases and the specials
    np.testing.assert_allclose(vectors[1], cut.embed_batch([long[:62]])[0], atol=1e-5)


def test_bfloat16_returns_float32_close_to_float32(model_dir):
    fp32 = load_adapter(str(model_dir), device="cpu").embed_batch(SEQS)
    bf16_adapter = load_adapter(str(model_dir), device="cpu", dtype="bfloat16")
    bf16 = bf16_adapter.embed_batch(SEQS)
    assert bf16.dtype == np.float32
    assert bf16_adapter.key.dtype == "bfloat16"
    assert min_cosine(fp32, bf16) > 0.999
    assert not np.array_equal(fp32, bf16)


@pytest.fixture(scope="module")
def tiny_dnabert_dir(tmp_path_factory):
    """DNABERT-like: a vocabulary of 3-mers, whitespace pre-tokenizer, tiny BERT trunk."""
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-dnabert")
    tokenizer, vocab = make_kmer3_tokenizer()
    return save_tiny_model(
        path,
        tokenizer,
        BertConfig,
        BertModel,
        vocab_size=len(vocab),
        max_position_embeddings=64,
    )


def test_kmer_split_text():
    assert kmer_split("ACGTA", 3) == "ACG CGT GTA"
    assert kmer_split("AC", 3) == "AC"
    assert kmer_split("ACGT", 1) == "A C G T"


def test_kmer_split_adapter_matches_direct_forward(tiny_dnabert_dir):
    seqs = ["ACGTACGTAC", "GGGCCCAATT", "TTTTGCAACGTAGCATCGA"]
    adapter = load_adapter(str(tiny_dnabert_dir), device="cpu", kmer_split=3)
    assert dict(adapter.key.options)["kmer_split"] == "3"
    assert adapter.n_tokens("ACGTA") == 3 + 2
    split = [kmer_split(seq, 3) for seq in seqs]
    np.testing.assert_allclose(
        adapter.embed_batch(seqs),
        direct_mean(tiny_dnabert_dir, split),
        atol=1e-5,
        rtol=0,
    )
    # without the split each sequence is one unknown word: a different vector
    plain = load_adapter(str(tiny_dnabert_dir), device="cpu")
    assert plain.key.digest != adapter.key.digest
    assert not np.allclose(
        plain.embed_batch(seqs), adapter.embed_batch(seqs), atol=1e-4
    )


@settings(max_examples=15, deadline=None)
@given(seq=st.text(alphabet="ACGTN", min_size=1, max_size=40))
def test_rc_average_is_strand_invariant(tiny_esm_dir, seq):
    adapter = _rc_adapter(tiny_esm_dir)
    np.testing.assert_allclose(
        adapter.embed_batch([seq]),
        adapter.embed_batch([reverse_complement(seq)]),
        atol=1e-5,
    )


_RC_CACHE: dict = {}


def _rc_adapter(path):
    # hypothesis reruns the body; load once per directory
    if path not in _RC_CACHE:
        _RC_CACHE[path] = load_adapter(str(path), device="cpu", rc_mode="average")
    return _RC_CACHE[path]


def test_rc_average_is_recorded(tiny_esm_dir):
    assert _rc_adapter(tiny_esm_dir).key.rc_mode == "average"
    assert load_adapter(str(tiny_esm_dir), device="cpu").key.rc_mode == "none"


def test_batching_follows_the_width_and_the_heads(tiny_esm_dir):
    heads = read_config(tiny_esm_dir)["num_attention_heads"]
    one = load_adapter(str(tiny_esm_dir), device="cpu")
    assert one.attention_maps == heads
    # both strands share the forward pass: twice the score maps a sequence
    assert _rc_adapter(tiny_esm_dir).attention_maps == 2 * heads
    assert one.preferred_token_budget == token_budget(one.dim)
    assert [token_budget(w) for w in (64, 512, 768, 1024, 2560, 8192)] == [
        16_384,
        8192,
        5120,
        4096,
        1536,
        1536,
    ]


def test_unknown_model_names_say_what_a_name_looks_like(tmp_path):
    for name in ("not-a-model", "./no/such/dir", str(tmp_path / "missing")):
        with pytest.raises(errors.UnknownModelError, match="kmer-1") as info:
            load_adapter(name)
        assert "local directory" in str(info.value)
        assert "owner/name" in str(info.value)


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(errors.UnknownModelError, match=r"no config\.json"):
        load_adapter(str(tmp_path))


def test_offline_hub_id_is_a_clear_error():
    with pytest.raises(errors.UnknownModelError, match="offline") as info:
        load_adapter("someone/not-cached-model")
    assert "HF_HOME" in str(info.value)


def test_resolve_device():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(
            errors.DeviceUnavailableError, match="CUDA is not available"
        ):
            resolve_device("cuda")
    with pytest.raises(errors.DeviceUnavailableError, match="unknown device"):
        resolve_device("tpu-please")


def test_bad_options_are_named(tiny_bert_dir):
    for kwargs, match in [
        ({"dtype": "float16"}, "dtype 'float16'"),
        ({"special_tokens": "some"}, "special-token policy"),
        ({"truncation": "left"}, "truncation policy"),
        ({"rc_mode": "flip"}, "rc mode"),
    ]:
        with pytest.raises(errors.AdapterOptionError, match=match):
            load_adapter(str(tiny_bert_dir), device="cpu", **kwargs)


def test_a_caduceus_config_is_recognised_as_caduceus(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "caduceus"}))
    family = recognise_family(read_config(tmp_path), tmp_path)
    assert family.FAMILY == "caduceus"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert recognise_family(read_config(tmp_path), tmp_path).FAMILY == "hf-encoder"


def test_remote_code_of_no_known_family_is_refused_by_name(tiny_bert_dir, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_dna.DnaModel"}
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(errors.UnknownModelError, match="--trust-remote-code") as err:
        load_adapter(str(copy), device="cpu")
    assert "modeling_dna.DnaModel" in str(err.value)


def test_native_looking_checkpoint_with_foreign_weights_is_refused(
    tiny_bert_dir, tmp_path
):
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, copy)
    state = load_file(copy / "model.safetensors")
    # a pre-LN BERT (GENA-LM) says model_type bert but carries extra norms
    state["encoder.layer.0.pre_attention_ln.weight"] = torch.ones(16)
    save_file(state, copy / "model.safetensors")
    with pytest.raises(
        errors.CheckpointError, match=r"1 unexpected tensors \(encoder\.layer\.0\.pre"
    ):
        load_adapter(str(copy), device="cpu")
    del state["encoder.layer.0.pre_attention_ln.weight"]
    del state["encoder.layer.1.output.dense.weight"]
    save_file(state, copy / "model.safetensors")
    with pytest.raises(errors.CheckpointError, match="missing 1"):
        load_adapter(str(copy), device="cpu")


def test_renamed_copy_keeps_its_key_and_shows_its_folder(tiny_bert_dir, tmp_path):
    copy = tmp_path / "elsewhere" / "another-name"
    shutil.copytree(tiny_bert_dir, copy)
    original = load_adapter(str(tiny_bert_dir), device="cpu")
    renamed = load_adapter(str(copy), device="cpu")
    assert renamed.key == original.key
    assert original.key.model_id == "local"
    assert (original.alias, renamed.alias) == (tiny_bert_dir.name, "another-name")


def test_cached_hub_id_resolves_to_its_commit_offline(tiny_bert_dir):
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(constants.HF_HUB_CACHE) / "models--someone--tiny-dna-bert"
    shutil.copytree(tiny_bert_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    adapter = load_adapter("someone/tiny-dna-bert", device="cpu")
    assert adapter.key.model_id == "someone/tiny-dna-bert"
    assert adapter.key.revision == commit  # never "main"
    assert (
        load_adapter("someone/tiny-dna-bert", revision=commit, device="cpu").key
        == adapter.key
    )
    np.testing.assert_allclose(
        adapter.embed_batch(SEQS), direct_mean(tiny_bert_dir, SEQS), atol=1e-5, rtol=0
    )
    with pytest.raises(errors.UnknownModelError, match="offline"):
        load_adapter("someone/tiny-dna-bert", revision="v2", device="cpu")


def test_cls_pooling_is_the_first_tokens_state(tiny_bert_dir):
    adapter = load_adapter(str(tiny_bert_dir), device="cpu", pooling="cls")
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    model = AutoModel.from_pretrained(tiny_bert_dir, dtype=torch.float32).eval()
    want = []
    for seq in SEQS:
        with torch.no_grad():
            out = model(**tokenizer(seq, return_tensors="pt"))
        want.append(out.last_hidden_state[0, 0].numpy())
    np.testing.assert_allclose(adapter.embed_batch(SEQS), want, atol=1e-5, rtol=0)
    assert adapter.key.pooling == "cls"
    with pytest.raises(errors.AdapterOptionError, match="causal"):
        load_adapter(str(tiny_bert_dir), device="cpu", pooling="last")


def test_random_init_twin_is_seeded_and_keyed(tiny_bert_dir):
    trained = load_adapter(str(tiny_bert_dir), device="cpu")
    first = load_adapter(str(tiny_bert_dir), device="cpu", random_init=1)
    again = load_adapter(str(tiny_bert_dir), device="cpu", random_init=1)
    other = load_adapter(str(tiny_bert_dir), device="cpu", random_init=2)
    assert first.key.revision == "random-init:1"
    assert dict(first.key.options)["config"].startswith("sha256:")
    assert len({trained.key.digest, first.key.digest, other.key.digest}) == 3
    assert first.key == again.key
    np.testing.assert_array_equal(first.embed_batch(SEQS), again.embed_batch(SEQS))
    assert not np.allclose(first.embed_batch(SEQS), other.embed_batch(SEQS))
    assert not np.allclose(first.embed_batch(SEQS), trained.embed_batch(SEQS))
