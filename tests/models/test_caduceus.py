"""Caduceus adapter: equality with the official code, RC laws, loading edge cases.

The fixtures in tests/fixtures/caduceus/ were computed by the official Caduceus code (see
scripts/make_caduceus_fixtures.py): tiny random ph / ps models with every weight moved
off its init, and the pooled vectors of sequences with N and lower case.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from embedcache import errors
from embedcache.hashing import normalise_sequence, reverse_complement
from embedcache.models import load_adapter
from embedcache.models.families.caduceus.adapter import (
    CaduceusAdapter,
    is_caduceus_config,
    load_caduceus_adapter,
    tokenize,
)
from embedcache.models.families.caduceus.weights import arch_from_config
from tests.models import adapter_contract as contract

FIXTURES = Path(__file__).parents[1] / "fixtures" / "caduceus"
VARIANTS = ("ph", "ps", "ps_unfused")
TIED_NAME = "caduceus.backbone.layers.0.mixer.mamba_{}.in_proj.weight"


def fixture_sequences() -> list[str]:
    return (FIXTURES / "sequences.txt").read_text().split()


expected = contract.expected_fixture(FIXTURES)


@pytest.fixture(scope="module")
def adapters() -> dict[tuple[str, str, str], CaduceusAdapter]:
    """Every (variant, rc mode, scan) adapter, loaded once per module."""
    return {
        (variant, rc, scan): load_caduceus_adapter(
            FIXTURES / variant, rc_mode=rc, scan=scan
        )
        for variant in VARIANTS
        for rc in ("none", "average")
        for scan in ("numba", "torch")
    }


@pytest.mark.parametrize("scan", ["numba", "torch"])
@pytest.mark.parametrize("rc_mode", ["none", "average"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_official_code(adapters, expected, variant, rc_mode, scan):
    # the engine upper-cases; the official tokenizer upper-cases itself
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    assert any(s != n for s, n in zip(fixture_sequences(), seqs, strict=True))
    got = adapters[(variant, rc_mode, scan)].embed_batch(seqs)
    want = expected[f"{variant}_{rc_mode}"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_fixture_vectors_are_not_degenerate(expected):
    # a fixture where every vector looked alike could not catch a bug
    for name, vectors in expected.items():
        assert np.isfinite(vectors).all(), name
        assert np.abs(vectors[0] - vectors[-1]).max() > 0.05, name
    d = expected["ph_average"].shape[1]
    assert expected["ps_none"].shape[1] == 2 * d
    assert np.abs(expected["ph_none"] - expected["ph_average"]).max() > 0.01


@pytest.mark.parametrize("variant", VARIANTS)
def test_dim_follows_variant_and_rc_mode(adapters, variant):
    d = 40
    assert adapters[(variant, "average", "numba")].dim == d
    assert adapters[(variant, "none", "numba")].dim == (d if variant == "ph" else 2 * d)


@pytest.mark.parametrize("variant", VARIANTS)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seqs=st.lists(
        st.text(alphabet="ACGTN", min_size=1, max_size=40), min_size=1, max_size=4
    )
)
def test_average_is_exactly_rc_invariant(adapters, variant, seqs):
    adapter = adapters[(variant, "average", "numba")]
    forward = adapter.embed_batch(seqs)
    reverse = adapter.embed_batch([reverse_complement(s) for s in seqs])
    np.testing.assert_array_equal(forward, reverse)


@pytest.mark.parametrize("variant", ["ps", "ps_unfused"])
def test_ps_none_is_rc_equivariant(adapters, variant):
    # RC of the input swaps the two halves of ps's pooled vector (channel-flipped)
    adapter = adapters[(variant, "none", "numba")]
    seqs = ["ACGTTGCANNAGT", "GATTACA"]
    fwd = adapter.embed_batch(seqs)
    rev = adapter.embed_batch([reverse_complement(s) for s in seqs])
    d = adapter.dim // 2
    np.testing.assert_allclose(rev[:, :d], fwd[:, d:][:, ::-1], atol=1e-5, rtol=0)


def test_ph_none_is_not_rc_invariant(adapters):
    adapter = adapters[("ph", "none", "numba")]
    seq = "ACGTTGCAAAGTCCC"
    fwd, rev = adapter.embed_batch([seq, reverse_complement(seq)])
    assert np.abs(fwd - rev).max() > 1e-3


@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_equals_one_by_one(adapters, variant):
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    for rc_mode in ("none", "average"):
        adapter = adapters[(variant, rc_mode, "numba")]
        batch = adapter.embed_batch(seqs)
        alone = np.stack([adapter.embed_batch([s])[0] for s in seqs])
        np.testing.assert_allclose(batch, alone, atol=1e-6, rtol=0)


def test_numba_and_torch_scans_agree(adapters):
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    for variant in VARIANTS:
        fast = adapters[(variant, "none", "numba")].embed_batch(seqs)
        slow = adapters[(variant, "none", "torch")].embed_batch(seqs)
        np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)


def test_tokenize_follows_official_ids():
    np.testing.assert_array_equal(tokenize("ACGTNX"), [7, 8, 9, 10, 11, 6])
    np.testing.assert_array_equal(tokenize("acgtn"), [7, 8, 9, 10, 11])


def test_key_records_what_changes_vectors(adapters):
    key = adapters[("ps", "none", "numba")].key
    assert key.adapter == "caduceus"
    assert key.rc_mode == "none"
    assert key.dtype == "float32"
    assert key.special_tokens == "none"
    assert key.pooling == "mean"
    assert key.layer == -1
    assert key.revision.startswith("sha256:")
    assert key.digest != adapters[("ps", "average", "numba")].key.digest
    assert key.revision != adapters[("ph", "none", "numba")].key.revision
    assert adapters[("ps", "none", "numba")].n_tokens("ACGTN") == 5


def test_is_caduceus_config():
    assert is_caduceus_config(json.loads((FIXTURES / "ph" / "config.json").read_text()))
    assert is_caduceus_config({"architectures": ["CaduceusForMaskedLM"]})
    assert not is_caduceus_config({"model_type": "bert"})


class TestContract(contract.AdapterContract):
    @pytest.fixture(params=["ph", "ps"])
    def adapter(self, adapters, request):
        return adapters[(request.param, "average", "numba")]


# -- loading -----------------------------------------------------------------------


def copy_model(variant: str, dest: Path) -> Path:
    shutil.copytree(FIXTURES / variant, dest)
    return dest


def test_local_dir_needs_no_network(monkeypatch, tmp_path):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        msg = "the hub was asked for a local model"
        raise AssertionError(msg)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    adapter = load_caduceus_adapter(copy_model("ph", tmp_path / "m"), rc_mode="none")
    assert adapter.embed_batch(["ACGT"]).shape == (1, 40)


def test_revision_is_a_content_digest(tmp_path):
    path = copy_model("ph", tmp_path / "m")
    first = load_caduceus_adapter(path).key.revision
    assert load_caduceus_adapter(path).key.revision == first
    contract.edit_config(path, norm_epsilon=1e-6)
    assert load_caduceus_adapter(path).key.revision != first
    with pytest.raises(errors.AdapterOptionError, match="content digest"):
        load_caduceus_adapter(path, revision="main")


def test_renamed_copy_keeps_its_key_and_shows_its_folder(tmp_path):
    first = load_caduceus_adapter(copy_model("ph", tmp_path / "a" / "caduceus-tiny"))
    renamed = load_caduceus_adapter(copy_model("ph", tmp_path / "b" / "other-name"))
    assert first.key.model_id == renamed.key.model_id == "local"
    assert renamed.key.digest == first.key.digest
    assert (first.alias, renamed.alias) == ("caduceus-tiny", "other-name")


@pytest.mark.parametrize("variant", ["ph", "ps"])
def test_pytorch_model_bin_with_all_tied_names(expected, tmp_path, variant):
    # a torch.save'd state dict holds every name, the tied ones included
    path = tmp_path / "m"
    path.mkdir()
    shutil.copy(FIXTURES / variant / "config.json", path)
    state = load_file(FIXTURES / variant / "model.safetensors")
    for name in list(state):
        if ".mamba_fwd.in_proj." in name or ".mamba_fwd.out_proj." in name:
            state[name.replace("mamba_fwd", "mamba_rev")] = state[name]
    torch.save(state, path / "pytorch_model.bin")
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    got = load_caduceus_adapter(path, rc_mode="none").embed_batch(seqs)
    np.testing.assert_allclose(got, expected[f"{variant}_none"], atol=1e-4, rtol=0)


def test_tied_weight_stored_under_the_reverse_name(expected, tmp_path):
    path = copy_model("ph", tmp_path / "m")
    state = load_file(path / "model.safetensors")
    for name in [n for n in state if ".mamba_fwd.in_proj." in n]:
        state[name.replace("mamba_fwd", "mamba_rev")] = state.pop(name)
    save_file(state, path / "model.safetensors")
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    got = load_caduceus_adapter(path, rc_mode="average").embed_batch(seqs)
    np.testing.assert_allclose(got, expected["ph_average"], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "missing",
    [
        "caduceus.backbone.layers.1.mixer.mamba_rev.x_proj.weight",
        "caduceus.backbone.norm_f.weight",
        TIED_NAME.format("fwd"),  # and its tied twin is absent from the file too
    ],
)
def test_missing_weight_is_a_clear_error(tmp_path, missing):
    path = copy_model("ph", tmp_path / "m")
    state = load_file(path / "model.safetensors")
    del state[missing]
    save_file(state, path / "model.safetensors")
    with pytest.raises(
        errors.CheckpointError,
        match=missing.removeprefix("caduceus.").replace(".", r"\."),
    ):
        load_caduceus_adapter(path)


def test_wrong_shape_is_a_clear_error(tmp_path):
    path = copy_model("ph", tmp_path / "m")
    contract.edit_config(path, d_model=48)
    with pytest.raises(errors.CheckpointError, match="shape"):
        load_caduceus_adapter(path)


def test_missing_weights_file(tmp_path):
    path = copy_model("ph", tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(errors.CheckpointError, match=r"model\.safetensors"):
        load_caduceus_adapter(path)


def test_hub_id_resolves_offline_from_the_cache(monkeypatch, tmp_path):
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--caduceus-tiny"
    shutil.copytree(FIXTURES / "ph", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    adapter = load_adapter("someone/caduceus-tiny", rc_mode="none", device="cpu")
    assert adapter.key.adapter == "caduceus"
    assert adapter.key.revision == commit
    assert adapter.key.model_id == "someone/caduceus-tiny"
    with pytest.raises(errors.UnknownModelError, match="someone/not-cached"):
        load_adapter("someone/not-cached")
    with pytest.raises(
        errors.UnknownModelError, match="load hub ids with load_adapter"
    ):
        load_caduceus_adapter("someone/caduceus-tiny")


def test_options_are_checked():
    with pytest.raises(errors.AdapterOptionError, match="rc mode"):
        load_caduceus_adapter(FIXTURES / "ph", rc_mode="both")
    for option, flag in [
        ({"pooling": "cls"}, "pooling 'cls'"),
        ({"layers": (4,)}, "layer 4 does not exist"),  # the fixture has 3 blocks
        ({"kmer_split": 3}, "--kmer-split"),
    ]:
        with pytest.raises(errors.AdapterOptionError, match=flag):
            load_adapter(str(FIXTURES / "ph"), device="cpu", **option)
    with pytest.raises(errors.AdapterOptionError, match="last layer only"):
        load_adapter(str(FIXTURES / "ps"), device="cpu", layers=(1, -1))
    with pytest.raises(errors.AdapterOptionError, match="dtype"):
        load_caduceus_adapter(FIXTURES / "ph", dtype="float16")
    with pytest.raises(errors.UnknownModelError):
        load_caduceus_adapter(FIXTURES / "does-not-exist")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_absent_cuda_raises():
    with pytest.raises(errors.DeviceUnavailableError, match="CUDA"):
        load_caduceus_adapter(FIXTURES / "ph", device="cuda")


def test_empty_sequence_raises(adapters):
    with pytest.raises(errors.InvalidSequenceError, match="empty"):
        adapters[("ph", "none", "numba")].embed_batch(["ACGT", ""])


@pytest.mark.parametrize("variant", ["ph", "ps"])
def test_bfloat16_stays_close(adapters, variant):
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    exact = adapters[(variant, "average", "numba")].embed_batch(seqs)
    fast = load_caduceus_adapter(FIXTURES / variant, dtype="bfloat16").embed_batch(seqs)
    assert (
        load_caduceus_adapter(FIXTURES / variant, dtype="bfloat16").key.dtype
        == "bfloat16"
    )
    assert contract.min_cosine(exact, fast) > 0.999
    assert 0 < np.abs(exact - fast).max() < 0.05


def test_only_bfloat16_keys_moved_with_the_bfloat16_decay():
    path = FIXTURES / "ph"
    versions = {
        dtype: load_caduceus_adapter(path, dtype=dtype).key.adapter_version
        for dtype in ("float32", "bfloat16")
    }
    assert versions == {"float32": "3", "bfloat16": "4"}


@pytest.mark.parametrize("variant", ["ph", "ps"])
def test_bfloat16_kernels_are_as_close_to_float32_as_torch_bfloat16(adapters, variant):
    # the numba kernels read and write bfloat16 bits themselves (the scan with a
    # cheaper decay); torch converts. Two bfloat16 paths round differently, so each
    # is held to its distance from the float32 vectors, and they stay much closer to
    # each other than to those
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    exact = adapters[(variant, "average", "numba")].embed_batch(seqs)
    path = FIXTURES / variant
    fast = load_caduceus_adapter(path, dtype="bfloat16", scan="numba").embed_batch(seqs)
    slow = load_caduceus_adapter(path, dtype="bfloat16", scan="torch").embed_batch(seqs)

    def rms(x):
        return float(np.sqrt(np.mean(x**2)))

    assert rms(fast - exact) <= 1.05 * rms(slow - exact)
    assert np.abs(fast - exact).max() <= 1.1 * np.abs(slow - exact).max()
    assert np.abs(fast - slow).max() <= 0.25 * np.abs(slow - exact).max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_matches_official_code(expected, variant):
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    adapter = load_caduceus_adapter(FIXTURES / variant, rc_mode="none", device="cuda")
    got = adapter.embed_batch(seqs)
    np.testing.assert_allclose(got, expected[f"{variant}_none"], atol=1e-4, rtol=0)


def _variant(tmp_path, change: str) -> Path:
    """The ph fixture with one architecture option the published models do not use."""
    path = copy_model("ph", tmp_path / change)
    config = json.loads((path / "config.json").read_text())
    state = load_file(path / "model.safetensors")
    gen = torch.Generator().manual_seed(1)

    def noise(like):
        return torch.randn(like.shape, generator=gen) * 0.1

    layers = [n for n in state if n.endswith("mamba_fwd.in_proj.weight")]
    if change == "untied":
        config["bidirectional_weight_tie"] = False
        for name in list(state):
            if ".mamba_fwd.in_proj." in name or ".mamba_fwd.out_proj." in name:
                state[name.replace("mamba_fwd", "mamba_rev")] = state[name] + noise(
                    state[name]
                )
    elif change == "ew_multiply":
        config["bidirectional_strategy"] = "ew_multiply"
    elif change == "layer_norm":
        config["rms_norm"] = False
        for name in [n for n in state if n.endswith(("norm.weight", "norm_f.weight"))]:
            state[name.replace(".weight", ".bias")] = noise(state[name])
    elif change == "proj_bias":
        config["ssm_cfg"]["bias"] = True
        for name in layers:
            out_name = name.replace("in_proj", "out_proj")
            state[name.replace(".weight", ".bias")] = noise(state[name][:, 0])
            state[out_name.replace(".weight", ".bias")] = noise(state[out_name][:, 0])
    elif change == "one_way":
        config["bidirectional"] = False
        state = {n: t for n, t in state.items() if ".mamba_rev." not in n}
    (path / "config.json").write_text(json.dumps(config))
    save_file(state, path / "model.safetensors")
    return path


@pytest.mark.parametrize(
    "change", ["untied", "ew_multiply", "layer_norm", "proj_bias", "one_way"]
)
def test_other_architecture_options_agree_across_paths(tmp_path, change):
    # no official fixture covers these: the numba kernels must at least agree with the
    # plain torch path, and the option must change the vectors
    path = _variant(tmp_path, change)
    seqs = [normalise_sequence(s) for s in fixture_sequences()]
    fast = load_caduceus_adapter(path, rc_mode="none", scan="numba").embed_batch(seqs)
    slow = load_caduceus_adapter(path, rc_mode="none", scan="torch").embed_batch(seqs)
    np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)
    base = load_caduceus_adapter(FIXTURES / "ph", rc_mode="none").embed_batch(seqs)
    assert np.abs(fast - base).max() > 1e-3


def test_kernel_exp_and_softplus_are_accurate():
    # the kernels' own exp and softplus (no SVML, fastmath on); an earlier softplus
    # lost all precision below x = -15 once fastmath reassociated Kahan's log1p
    import numba

    from embedcache.models.families.caduceus.kernels import _exp2, _softplus

    @numba.njit(fastmath=True)
    def evaluate(x, exp_out, softplus_out):
        for i in range(x.size):
            exp_out[i] = _exp2(x[i])
            softplus_out[i] = _softplus(x[i])

    x = np.linspace(-40, 40, 400_001, dtype=np.float32)
    exp_out, softplus_out = np.empty_like(x), np.empty_like(x)
    negative = x <= 0
    evaluate(x, exp_out, softplus_out)
    x64 = x.astype(np.float64)
    exp_err = np.abs(exp_out[negative] / np.exp2(x64[negative]) - 1)
    softplus_want = torch.nn.functional.softplus(torch.from_numpy(x64)).numpy()
    softplus_err = np.abs(softplus_out / softplus_want - 1)
    assert exp_err.max() < 2e-7
    assert softplus_err.max() < 5e-6


def test_published_ps_config_parses_to_the_official_shape():
    """config.json of caduceus-ps_seqlen-131k_d_model-256_n_layer-16 as published on the hub
    (copied from a public project's setup script; the hub itself is unreachable here)."""
    config = json.loads((FIXTURES / "published_ps_config.json").read_text())
    assert is_caduceus_config(config)
    arch = arch_from_config(config, where="published ps config")
    assert (arch.d_model, arch.n_layer, arch.vocab_size) == (256, 16, 16)
    assert (arch.d_state, arch.d_conv, arch.expand, arch.dt_rank) == (16, 4, 2, 16)
    assert arch.rcps
    assert arch.weight_tie
    assert arch.fused_add_norm
    assert (arch.conv_bias, arch.proj_bias) == (True, False)
