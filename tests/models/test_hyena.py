"""HyenaDNA adapter: equality with the official code, padding, loading, options.

The fixtures in tests/fixtures/hyena/ were computed by the official hub code
(``modeling_hyena.py`` of LongSafari/hyenadna-*-seqlen-hf, sha256-checked; see
scripts/make_hyena_fixtures.py and meta.json): tiny random models in the published
layout with every parameter and stored buffer (z, t, deltas) moved off its init, and
the pooled vectors of each sequence run alone through the official model.
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedcache import errors
from embedcache.hashing import reverse_complement
from embedcache.models import load_adapter, recognise_family
from embedcache.models.families.hyena.adapter import HyenaTokenizer, is_hyena_config
from embedcache.models.families.hyena.checkpoint import arch_from_config
from embedcache.models.families.hyena.filter import fft_size, positional_features
from embedcache.models.families.hyena.network import HyenaBackbone
from tests.models import adapter_contract as contract
from tests.models.adapter_contract import fixture_sequences as normalised_sequences

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hyena"
VARIANTS = ("tiny", "alt")
# (load_adapter options, expected.npz key suffix)
CASES = {
    "mean": ({}, "mean_none"),
    "average": ({"rc_mode": "average"}, "mean_average"),
    "include": ({"special_tokens": "include"}, "mean_include_none"),
    "last": ({"pooling": "last"}, "last_none"),
    "last_include": (
        {"pooling": "last", "special_tokens": "include"},
        "last_include_none",
    ),
    "layer0": ({"layers": (0,)}, "layer0_mean_none"),
    "layer1": ({"layers": (1,)}, "layer1_mean_none"),
}


fixture_sequences = partial(contract.raw_sequences, FIXTURES)
upper_sequences = partial(normalised_sequences, FIXTURES)


expected = contract.expected_fixture(FIXTURES)


def load(variant: str = "tiny", **options):
    return load_adapter(str(FIXTURES / variant), device="cpu", **options)


@pytest.fixture(scope="module")
def adapters():
    return {(v, case): load(v, **CASES[case][0]) for v in VARIANTS for case in CASES}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_official_code(adapters, expected, variant, case):
    seqs = upper_sequences()
    # the fixtures hold lower case: the engine upper-cases before the adapter
    assert any(s != u for s, u in zip(fixture_sequences(), seqs, strict=True))
    got = adapters[(variant, case)].embed_batch(seqs)
    want = expected[f"{variant}_{CASES[case][1]}"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_path_matches_official_code(expected, variant):
    # the path CUDA takes (no numba kernels), checked here on CPU
    adapter = load(variant)
    adapter.network.set_kernels("torch")
    got = adapter.embed_batch(upper_sequences())
    np.testing.assert_allclose(got, expected[f"{variant}_mean_none"], atol=1e-4, rtol=0)


def test_fixture_vectors_are_not_degenerate(expected):
    # a fixture where vectors looked alike could not catch a bug
    for name, vectors in expected.items():
        assert np.isfinite(vectors).all(), name
        assert np.abs(vectors[0] - vectors[-1]).max() > 0.05, name
    for v in VARIANTS:
        mean, last = expected[f"{v}_mean_none"], expected[f"{v}_last_none"]
        assert np.abs(mean - expected[f"{v}_mean_average"]).max() > 0.01
        assert np.abs(mean - expected[f"{v}_mean_include_none"]).max() > 0.01
        assert np.abs(mean - last).max() > 0.01


@pytest.mark.parametrize(
    ("variant", "case"), [("tiny", "mean"), ("tiny", "last"), ("alt", "average")]
)
def test_batched_equals_one_by_one(adapters, variant, case):
    contract.assert_batched_equals_alone(
        adapters[(variant, case)], upper_sequences(), atol=1e-5
    )


def test_left_padding_would_change_real_positions(adapters):
    # why padding goes on the right: the model takes no mask, and the official
    # tokenizer's left padding shifts every real position's causal context
    net = adapters[("tiny", "mean")].network
    ids = torch.tensor([[7, 8, 9, 10, 1]])
    left = torch.tensor([[4, 4, 4, 7, 8, 9, 10, 1]])
    right = torch.tensor([[7, 8, 9, 10, 1, 4, 4, 4]])
    with torch.inference_mode():
        alone = net(ids, None, [-1])[0][0]
        lpad = net(left, None, [-1])[0][0, 3:]
        rpad = net(right, None, [-1])[0][0, :5]
    torch.testing.assert_close(rpad, alone, atol=1e-5, rtol=0)
    assert (lpad - alone).abs().max() > 0.1


def test_torch_path_runs_with_gradients_after_inference():
    # the filter spectra kept for inference must not leak into autograd
    net = load("alt").network
    net.set_kernels("torch")
    ids = torch.tensor([[7, 8, 9, 10, 11, 1]])
    with torch.inference_mode():
        kept = net(ids, None, [-1])[0]
    with torch.enable_grad():
        fresh = net(ids, None, [-1])[0]
        fresh.sum().backward()
    torch.testing.assert_close(fresh.detach(), kept, atol=1e-6, rtol=0)
    assert net.layers[0].mixer.filter_fn.implicit_filter[0].weight.grad is not None


def test_numba_and_torch_kernels_agree():
    seqs = upper_sequences()
    for variant in VARIANTS:
        adapter = load(variant)
        fast = adapter.embed_batch(seqs)
        adapter.network.set_kernels("torch")
        np.testing.assert_allclose(fast, adapter.embed_batch(seqs), atol=1e-5, rtol=0)


def test_tokens_follow_the_official_tokenizer():
    official = json.loads((FIXTURES / "tokens.json").read_text())
    tokenizer = HyenaTokenizer()
    for seq, ids in official.items():
        encoded = tokenizer.encode(seq)
        assert list(encoded.ids) == ids, seq
        assert encoded.special == (False,) * len(seq) + (True,)
    meta = json.loads((FIXTURES / "meta.json").read_text())
    assert meta["tokenizer_defaults"]["ACGTN input_ids"] == [7, 8, 9, 10, 11, 1]
    assert meta["tokenizer_defaults"]["padding_side"] == "left"
    assert tokenizer.pad_id == 4


def test_key_records_what_changes_vectors(adapters):
    key = adapters[("tiny", "mean")].key
    assert key.adapter == "hyenadna"
    assert key.rc_mode == "none"  # the family default: the model as published
    assert key.special_tokens == "exclude"
    assert key.max_length == 330
    assert key.revision.startswith("sha256:")
    assert adapters[("tiny", "last")].key.pooling == "last"
    assert adapters[("tiny", "average")].key.digest != key.digest
    assert adapters[("tiny", "mean")].n_tokens("ACGT") == 5  # [SEP] included


def test_rc_average_is_invariant(adapters):
    adapter = adapters[("alt", "average")]
    seqs = ["ACGTTGCANNAGT", "GATTACA", "CCCCGGA"]
    forward = adapter.embed_batch(seqs)
    reverse = adapter.embed_batch([reverse_complement(s) for s in seqs])
    np.testing.assert_allclose(forward, reverse, atol=1e-6, rtol=0)


class TestContract(contract.AdapterContract):
    @pytest.fixture(params=VARIANTS)
    def adapter(self, adapters, request):
        return adapters[(request.param, "mean")]


# -- bf16 ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_bfloat16_stays_close(expected, variant):
    adapter = load(variant, dtype="bfloat16")
    assert adapter.key.dtype == "bfloat16"
    seqs = upper_sequences()
    fast = adapter.embed_batch(seqs)
    exact = expected[f"{variant}_mean_none"]
    assert contract.min_cosine(fast, exact) > 0.999
    assert 0 < np.abs(fast - exact).max() < 0.1
    if variant == "tiny":
        alone = np.stack([adapter.embed_batch([s])[0] for s in seqs])
        np.testing.assert_allclose(fast, alone, atol=2e-2, rtol=0)


# -- the published configs ---------------------------------------------------------


def published_config() -> dict:
    """config.json of a fine-tune of hyenadna-small-32k-seqlen-hf as saved in the hub
    layout (shubhamtkr/checkpoint-62500; published configs are unreachable here)."""
    return json.loads(
        (FIXTURES / "published_small32k_finetune_config.json").read_text()
    )


def test_published_config_is_recognised(tmp_path):
    config = published_config()
    assert is_hyena_config(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert recognise_family(config, tmp_path).FAMILY == "hyenadna"
    # without our module it would need remote code: the config names it in auto_map
    assert config["auto_map"]["AutoModel"] == "modeling_hyena.HyenaDNAModel"


def test_published_config_builds_the_published_shapes():
    arch = arch_from_config(published_config(), where="published config")
    assert (arch.d_model, arch.n_layer, arch.d_inner) == (256, 4, 1024)
    assert (arch.vocab_size, arch.embedding_rows) == (12, 16)
    assert (arch.emb_dim, arch.filter_order, arch.num_inner_mlps) == (5, 64, 2)
    assert arch.max_seq_len == 32770
    with torch.device("meta"):
        net = HyenaBackbone(arch)
    shapes = {n: tuple(t.shape) for n, t in net.state_dict().items()}
    # the tensor manifest of the published checkpoints (per layer and shared)
    p = "layers.3.mixer."
    assert shapes["embeddings.word_embeddings.weight"] == (16, 256)
    assert shapes[p + "in_proj.weight"] == (768, 256)
    assert shapes[p + "short_filter.weight"] == (768, 1, 3)
    assert shapes[p + "filter_fn.pos_emb.z"] == (1, 32770, 5)
    assert shapes[p + "filter_fn.pos_emb.t"] == (1, 32770, 1)
    assert shapes[p + "filter_fn.implicit_filter.1.freq"] == (1, 64)
    assert shapes[p + "filter_fn.implicit_filter.6.weight"] == (256, 64)
    assert shapes[p + "filter_fn.modulation.deltas"] == (1, 1, 256)
    assert shapes["layers.3.mlp.fc1.weight"] == (1024, 256)
    assert "layers.4.norm1.weight" not in shapes
    trainable = sum(t.numel() for t in net.parameters())
    assert round(trainable / 1e6, 2) == 3.28  # backbone; plus lm_head 4,096


def test_unsupported_architectures_are_refused():
    base = published_config()
    for change, match in [
        ({"hyena_order": 3}, "hyena_order"),
        ({"short_filter_order": 4}, "short_filter_order"),
        ({"emb_dim": 4}, "emb_dim"),
        ({"d_model": "256"}, "d_model"),
    ]:
        with pytest.raises(errors.CheckpointError, match=match):
            arch_from_config({**base, **change}, where="x")


def test_positional_features_start_as_the_official_ones():
    z, t = positional_features(7, 5)
    assert z.shape == (1, 7, 5)
    torch.testing.assert_close(z[0, :, 0], torch.linspace(0, 1, 7))
    torch.testing.assert_close(t[0, :, 0], torch.linspace(0, 1, 7))
    torch.testing.assert_close(z[0, 0, 1:3], torch.ones(2))  # cos(0)
    torch.testing.assert_close(z[0, 0, 3:], torch.zeros(2))  # sin(0)


def test_fft_size_gives_a_linear_convolution():
    for length in [1, 2, 3, 7, 201, 252, 501, 1000, 160002]:
        n = fft_size(length)
        assert n >= 2 * length - 1
        m = n
        while m % 2 == 0:
            m //= 2
        while m % 3 == 0:
            m //= 3
        assert m == 1, n
    assert fft_size(501) == 1024


# -- loading -----------------------------------------------------------------------


def copy_model(variant: str, dest: Path) -> Path:
    shutil.copytree(FIXTURES / variant, dest)
    return dest


def edit_weights(path: Path, edit) -> None:
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors")


Z = "hyena.backbone.layers.0.mixer.filter_fn.pos_emb.z"
FREQ = "hyena.backbone.layers.1.mixer.filter_fn.implicit_filter.{}.freq"


def test_z_is_read_from_the_checkpoint(tmp_path, expected):
    path = copy_model("tiny", tmp_path / "m")
    edit_weights(path, lambda s: s[Z].mul_(0.5))
    got = load_adapter(str(path), device="cpu").embed_batch(upper_sequences())
    assert np.abs(got - expected["tiny_mean_none"]).max() > 1e-3


def test_bare_model_names_and_a_bin_file_load(tmp_path, expected):
    # HyenaDNAModel (AutoModel) saves without the "hyena." prefix and has no head
    path = tmp_path / "m"
    path.mkdir()
    shutil.copy(FIXTURES / "tiny" / "config.json", path)
    state = load_file(FIXTURES / "tiny" / "model.safetensors")
    state = {
        n.removeprefix("hyena."): t for n, t in state.items() if n.startswith("hyena.")
    }
    # every shared frequency present, as a torch.save'd state dict holds them
    for i in range(2):
        one = state[f"backbone.layers.{i}.mixer.filter_fn.implicit_filter.1.freq"]
        for j in (3, 5):
            state[f"backbone.layers.{i}.mixer.filter_fn.implicit_filter.{j}.freq"] = one
    torch.save(state, path / "pytorch_model.bin")
    got = load_adapter(str(path), device="cpu").embed_batch(upper_sequences())
    np.testing.assert_allclose(got, expected["tiny_mean_none"], atol=1e-4, rtol=0)


def test_shared_frequency_stored_under_another_index(tmp_path, expected):
    path = copy_model("tiny", tmp_path / "m")
    edit_weights(path, lambda s: s.__setitem__(FREQ.format(5), s.pop(FREQ.format(1))))
    got = load_adapter(str(path), device="cpu").embed_batch(upper_sequences())
    np.testing.assert_allclose(got, expected["tiny_mean_none"], atol=1e-4, rtol=0)


def test_disagreeing_frequency_copies_are_refused(tmp_path):
    path = copy_model("tiny", tmp_path / "m")
    edit_weights(path, lambda s: s.__setitem__(FREQ.format(3), s[FREQ.format(1)] + 1))
    with pytest.raises(errors.CheckpointError, match="shared sine frequency"):
        load_adapter(str(path), device="cpu")


@pytest.mark.parametrize(
    "missing",
    [
        Z,
        FREQ.format(1),
        "hyena.backbone.ln_f.weight",
        "hyena.backbone.layers.1.mlp.fc2.bias",
    ],
)
def test_missing_tensor_is_a_clear_error(tmp_path, missing):
    path = copy_model("tiny", tmp_path / "m")
    edit_weights(path, lambda s: s.pop(missing))
    name = missing.removeprefix("hyena.backbone.")
    with pytest.raises(errors.CheckpointError, match=name.replace(".", r"\.")):
        load_adapter(str(path), device="cpu")


def test_renamed_tensor_is_refused(tmp_path):
    path = copy_model("tiny", tmp_path / "m")
    old = "hyena.backbone.layers.0.mixer.in_proj.weight"
    edit_weights(
        path, lambda s: s.__setitem__(old.replace("in_proj", "inproj"), s.pop(old))
    )
    with pytest.raises(errors.CheckpointError, match="inproj"):
        load_adapter(str(path), device="cpu")


def test_wrong_shape_is_a_clear_error(tmp_path):
    path = copy_model("tiny", tmp_path / "m")
    contract.edit_config(path, max_seq_len=400)
    with pytest.raises(errors.CheckpointError, match="shape"):
        load_adapter(str(path), device="cpu")


def test_local_dir_needs_no_network_and_no_code(monkeypatch, tmp_path):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        msg = "the hub was asked for a local model"
        raise AssertionError(msg)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    path = copy_model("tiny", tmp_path / "m")
    assert not list(path.glob("*.py"))
    assert load_adapter(str(path), device="cpu").embed_batch(["ACGT"]).shape == (1, 32)


@pytest.mark.cpu_kind
def test_cli_embed_equals_the_official_code(tmp_path, expected):
    last, got = contract.embed_cli(
        tmp_path, FIXTURES / "tiny", fixture_sequences(), "--no-progress"
    )
    # a duplicate sequence is computed once and still fills both rows
    assert last == f"computed={len(set(upper_sequences()))} cached=1"
    np.testing.assert_allclose(got, expected["tiny_mean_none"], atol=1e-4, rtol=0)


# -- options -----------------------------------------------------------------------


def test_options_that_do_not_apply_are_refused():
    for option, match in [
        ({"pooling": "cls"}, "cls"),
        ({"family_options": (("x", "1"),)}, "family-option"),
        ({"kmer_split": 3}, "kmer-split"),
        ({"layers": (3,)}, "layer 3"),
    ]:
        with pytest.raises(errors.AdapterOptionError, match=match):
            load(**option)


def test_too_long_raises_unless_truncation_is_asked_for(adapters):
    long = "ACGT" * 83  # 332 bases + [SEP] > 330
    with pytest.raises(errors.SequenceTooLongError, match="330"):
        adapters[("tiny", "mean")].embed_batch([long])
    cut = load(truncation="right")
    assert cut.key.truncation == "right"
    np.testing.assert_allclose(
        cut.embed_batch([long]), cut.embed_batch([long[:329]]), atol=1e-6, rtol=0
    )


def test_empty_sequence_is_refused(adapters):
    with pytest.raises(errors.InvalidSequenceError, match="no tokens"):
        adapters[("tiny", "mean")].embed_batch(["ACGT", ""])


# -- random init -------------------------------------------------------------------


def test_random_init_is_seeded_and_official(tmp_path):
    (tmp_path / "config.json").write_text(
        (FIXTURES / "tiny" / "config.json").read_text()
    )
    seqs = ["ACGTACGTTT", "GGA"]
    first = contract.seeded_twins(str(tmp_path), seqs, seeds=(1, 2), min_diff=1e-4)
    net = first.network
    w = net.layers[0].mlp.fc1.weight
    assert 0.015 < float(w.detach().std()) < 0.025
    assert float(net.layers[0].mlp.fc1.bias.detach().abs().max()) == 0.0
    assert float(net.layers[1].norm2.weight.detach().min()) == 1.0
    mixer = net.layers[0].mixer
    freq = mixer.filter_fn.implicit_filter[1].freq
    assert float(freq.detach().min()) == float(freq.detach().max()) == 10.0
    z, _ = positional_features(330, 5)
    torch.testing.assert_close(mixer.filter_fn.pos_emb.z, z)
    bound = 3**-0.5
    assert float(mixer.short_filter.weight.detach().abs().max()) <= bound


# shapes of the published checkpoints: medium-160k and large-1m as tcztzy/evo.cpp
# pins them (config.json and model.safetensors by sha256 and size, at
# configs/geneb-hyenadna-models.json); tiny-1k, small-32k and medium-450k from the
# MultiMolecule model card's table of the same checkpoints
PUBLISHED = {
    "LongSafari/hyenadna-tiny-1k-seqlen-hf": (128, 2, 1026, None),
    "LongSafari/hyenadna-small-32k-seqlen-hf": (256, 4, 32770, None),
    "LongSafari/hyenadna-medium-160k-seqlen-hf": (256, 8, 160002, 56_971_992),
    "LongSafari/hyenadna-medium-450k-seqlen-hf": (256, 8, 450002, None),
    "LongSafari/hyenadna-large-1m-seqlen-hf": (256, 8, 1000002, 218_252_304),
}


@pytest.mark.parametrize("hub_id", list(PUBLISHED))
def test_catalogue_matches_the_published_shapes(hub_id):
    from embedcache.models.catalogue import load_catalogue

    d, n, context, file_size = PUBLISHED[hub_id]
    config = {
        **published_config(),
        "d_model": d,
        "n_layer": n,
        "d_inner": 4 * d,
        "max_seq_len": context,
    }
    arch = arch_from_config(config, where=hub_id)
    with torch.device("meta"):
        net = HyenaBackbone(arch)
    entry = next(e for e in load_catalogue() if e.hub_id == hub_id)
    assert (entry.family, entry.context, entry.licence) == (
        "hyenadna",
        context,
        "bsd-3-clause",
    )
    params = sum(t.numel() for t in net.parameters())
    assert f"{params / 1e6:.2g}M" == entry.params
    if file_size is not None:
        # every stored tensor (backbone + lm_head, float32) fills the published file
        # but for its JSON header
        stored = sum(t.numel() for t in net.state_dict().values()) + 16 * d
        # the shared sine frequency is stored once, not at each odd index
        stored -= n * 2 * arch.filter_order
        header = file_size - 4 * stored
        # 26 tensors a layer, embedding, ln_f (2) and lm_head; ~120 bytes of JSON each
        n_tensors = 26 * n + 4
        assert 100 * n_tensors < header < 140 * n_tensors
