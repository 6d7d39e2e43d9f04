"""Caduceus random-init twins and layer sweeps (the official fixtures are in test_caduceus)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embedcache.errors import AdapterOptionError
from embedcache.models import BUILTIN_ARCHITECTURES, layer_count, load_adapter
from embedcache.models.families.caduceus.adapter import tokenize
from embedcache.models.families.caduceus.init import random_weights
from embedcache.models.families.caduceus.weights import arch_from_config
from embedcache.models.shared.char_tokens import BASE_IDS
from embedcache.models.shared.checkpoint import config_digest

FIXTURES = Path(__file__).parents[1] / "fixtures" / "caduceus"
SEQS = ["ACGTTGCAAGGCTTAGCNAC", "GGGCCCAATTACGATCGATC", "TTTTACGA"]


@pytest.fixture(scope="module")
def config_only(tmp_path_factory):
    """The ph fixture's config.json alone, without its weights."""
    folder = tmp_path_factory.mktemp("caduceus-config")
    shutil.copy(FIXTURES / "ph" / "config.json", folder / "config.json")
    return folder


def test_random_init_twin_is_deterministic_per_seed_and_differs_across_seeds(
    config_only,
):
    first = load_adapter(str(config_only), device="cpu", random_init=0)
    again = load_adapter(str(config_only), device="cpu", random_init=0)
    other = load_adapter(str(config_only), device="cpu", random_init=1)
    a, b, c = (x.embed_batch(SEQS) for x in (first, again, other))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c, atol=1e-3)
    assert first.key == again.key
    assert first.key.revision == "random-init:0"
    assert other.key.revision == "random-init:1"
    config = json.loads((config_only / "config.json").read_text())
    assert dict(first.key.options)["config"] == config_digest(config)


def test_twin_and_trained_model_have_different_keys(config_only):
    trained = load_adapter(str(FIXTURES / "ph"), device="cpu")
    twin = load_adapter(str(FIXTURES / "ph"), device="cpu", random_init=0)
    assert trained.key != twin.key
    assert trained.key.revision.startswith("sha256:")
    assert not np.allclose(trained.embed_batch(SEQS), twin.embed_batch(SEQS))
    # a twin needs no weights: built from the config alone it is the same twin
    alone = load_adapter(str(config_only), device="cpu", random_init=0)
    np.testing.assert_array_equal(alone.embed_batch(SEQS), twin.embed_batch(SEQS))


def test_random_weights_follow_the_family_init():
    config = {
        "d_model": 32,
        "n_layer": 4,
        "vocab_size": 12,
        "ssm_cfg": {"d_state": 16, "expand": 2},
    }
    arch = arch_from_config(config, where="test")
    w = random_weights(arch, config, seed=3)
    layer = w.layers[0]
    # A_log = log(1..d_state), stored as A = -exp(A_log) as the official model does
    np.testing.assert_allclose(
        layer.fwd.a[0].numpy(), -np.arange(1, 17, dtype=np.float32), rtol=1e-6
    )
    assert (layer.fwd.d == 1).all()
    assert layer.fwd.in_w is layer.rev.in_w  # tied directions share projections
    assert layer.fwd.out_w is layer.rev.out_w
    assert layer.fwd.conv_w is not layer.rev.conv_w
    assert abs(layer.fwd.in_w).max() <= 1 / np.sqrt(32)
    assert abs(layer.fwd.out_w).max() <= 1 / np.sqrt(64) / np.sqrt(4)
    dt = torch.nn.functional.softplus(layer.fwd.dt_b)
    assert dt.min() >= 1e-3 * 0.999
    assert dt.max() <= 0.1 * 1.001
    assert abs(w.embedding.std().item() - 0.02) < 0.005
    assert (w.norm_w == 1).all()


def test_layer_sweep_keys_and_last_layer_equal_a_plain_run():
    sweep = load_adapter(str(FIXTURES / "ph"), device="cpu", layers=(-1, 0, 2))
    plain = load_adapter(str(FIXTURES / "ph"), device="cpu")
    assert [k.layer for k in sweep.keys] == [-1, 0, 2]
    assert sweep.keys[0] == plain.key
    out = sweep.embed_layers(SEQS)
    assert out.shape == (3, len(SEQS), sweep.dim)
    np.testing.assert_allclose(out[0], plain.embed_batch(SEQS), atol=1e-6)
    assert not np.allclose(out[1], out[2])


def test_layer_zero_is_the_mean_token_embedding_of_both_strands():
    adapter = load_adapter(str(FIXTURES / "ph"), device="cpu", layers=(0,))
    emb = adapter.backbone.weights.embedding.numpy()
    complement = {"A": "T", "C": "G", "G": "C", "T": "A", "N": "N"}
    for seq, got in zip(SEQS, adapter.embed_batch(SEQS), strict=True):
        rc = "".join(complement[b] for b in reversed(seq))
        want = (emb[tokenize(seq)].mean(axis=0) + emb[tokenize(rc)].mean(axis=0)) / 2
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert BASE_IDS["N"] in tokenize("N")


def test_intermediate_layers_agree_between_numba_and_torch_kernels():
    from embedcache.models.families.caduceus.adapter import load_caduceus_adapter

    numba_ad = load_caduceus_adapter(FIXTURES / "ph", scan="numba")
    torch_ad = load_caduceus_adapter(FIXTURES / "ph", scan="torch")
    ids = torch.from_numpy(np.stack([tokenize(s) for s in SEQS[:2]]))
    layers = (0, 1, 3, -1)
    a = numba_ad.backbone.pooled_layers(ids, layers)
    b = torch_ad.backbone.pooled_layers(ids, layers)
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5)


def test_shipped_architecture_builds_only_as_a_twin():
    assert "caduceus-tiny" in BUILTIN_ARCHITECTURES
    assert layer_count("caduceus-tiny") == 3
    with pytest.raises(AdapterOptionError, match="--random-init"):
        load_adapter("caduceus-tiny", device="cpu")
    twin = load_adapter("caduceus-tiny", device="cpu", random_init=0, layers=(-1, 0))
    assert twin.key.model_id == "caduceus-tiny"
    assert twin.key.revision == "random-init:0"
    assert twin.embed_layers(SEQS).shape == (2, 3, 32)
    with pytest.raises(AdapterOptionError, match="without layers"):
        layer_count("kmer-3")
