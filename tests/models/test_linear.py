"""The linear-layer candidates: they agree within the dtype's tolerance, give a row
the same bits whatever the rows around it, and the tuner's choice is what runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedcache.models.shared import linear, tuning
from embedcache.models.shared.tuning import Tuner

PRINT = {"tuner": "1", "cpu_kind": "AVX2", "torch": "2.13.0"}
ONEDNN = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without mkldnn"
)


def layer(n_in, n_out, dtype):
    torch.manual_seed(0)
    return nn.Linear(n_in, n_out).to(dtype)


@ONEDNN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_candidates_agree_within_tolerance(dtype, activation):
    lin = layer(64, 96, dtype)
    x = torch.randn(300, 64).to(dtype)
    with torch.inference_mode():
        want = linear.run_aten(lin, x, activation).float()
        scale = want.abs().max().item()
        for name, run in linear.CANDIDATES.items():
            got = run(lin, x, activation).float()
            diff = (got - want).abs().max().item() / scale
            assert diff <= tuning.TOLERANCE[str(dtype)[6:]], name


@ONEDNN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(linear.CANDIDATES))
def test_a_row_has_the_same_bits_whatever_its_batch(dtype, name):
    # the choice is made per layer shape, not per row count: this is what makes
    # that safe for batch-invariant vectors
    lin = layer(128, 256, dtype)
    x = torch.randn(2048, 128).to(dtype)
    run = linear.CANDIDATES[name]
    with torch.inference_mode():
        full = run(lin, x, "gelu")
        for rows in (16, 17, 300, 1536):
            torch.testing.assert_close(
                run(lin, x[:rows], "gelu"), full[:rows], rtol=0, atol=0
            )
        torch.testing.assert_close(
            run(lin, x[40:], "gelu")[:16], full[40:56], rtol=0, atol=0
        )


@ONEDNN
def test_bf16_onednn_without_activation_gives_atens_bits():
    lin = layer(64, 96, torch.bfloat16)
    x = torch.randn(300, 64).to(torch.bfloat16)
    with torch.inference_mode():
        want = linear.run_aten(lin, x, "none")
        for name in ("onednn", "onednn-packed"):
            torch.testing.assert_close(
                linear.CANDIDATES[name](lin, x, "none"), want, rtol=0, atol=0
            )


@ONEDNN
def test_packed_weight_is_reordered_again_after_a_cast():
    lin = layer(32, 48, torch.float32)
    x = torch.randn(20, 32)
    with torch.inference_mode():
        first = linear.run_onednn_packed(lin, x, "none")
        torch.testing.assert_close(first, linear.run_aten(lin, x, "none"))
        lin.to(torch.bfloat16)
        got = linear.run_onednn_packed(lin, x.to(torch.bfloat16), "none")
        want = linear.run_aten(lin, x.to(torch.bfloat16), "none")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert "_embedcache_packed" not in lin.state_dict()


def test_the_choice_is_recorded_per_shape_and_runs(monkeypatch):
    lin = layer(32, 48, torch.float32)
    tuner = Tuner(None, fingerprint=PRINT, repeats=1, budget=0.01)
    with torch.inference_mode():
        a = linear.project(lin, torch.randn(7, 32), tuner=tuner, activation="gelu")
        linear.project(lin, torch.randn(300, 32), tuner=tuner, activation="gelu")
    (key,) = tuner.choices  # one problem whatever the rows
    assert key == "linear|float32|any|in=32,out=48,act=gelu,bias=True,device=cpu"
    assert a.shape == (7, 48)
    forced = Tuner(None, fingerprint=PRINT, override={"linear": "aten"})
    x = torch.randn(5, 32)
    with torch.inference_mode():
        got = linear.project(lin, x, tuner=forced, activation="gelu")
        torch.testing.assert_close(
            got, torch.nn.functional.gelu(lin(x)), rtol=0, atol=0
        )
