"""HyenaDNA's CPU kernels and long-convolution candidates against plain torch.

The fixtures' equality with the official code is tested in test_hyena.py; here each
piece is held to a torch reference at edge lengths (1 and 2 positions: the
convolution's zero padding), every long-convolution candidate to the reference FFT,
and the CPU forward to its promises: no transposed copy of in_proj's output, and the
same bytes for a sequence in any batch whichever long convolution is forced.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedcache.engine.local import embed_sequences
from embedcache.models import load_adapter
from embedcache.models.families.hyena import kernels, long_conv
from embedcache.models.shared.tuning import ENV_VAR, Tuner
from tests.engine.helpers import MemoryStore, random_seqs

TINY = Path(__file__).parents[1] / "fixtures" / "hyena" / "tiny"


def _bits(t: torch.Tensor) -> np.ndarray:
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def _reference(z, z_bias, weight, bias, d):
    """x0, x1, v of the padded depthwise convolution, float32, channels-first."""
    conv = F.conv1d(
        z.float() + z_bias[:, None],
        weight[:, None],
        bias,
        padding=2,
        groups=3 * d,
    )[..., : z.shape[2]]
    return conv[:, :d], conv[:, d : 2 * d], conv[:, 2 * d :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 2, 3, 70])
def test_conv_gate_and_gate_out_equal_torch(dtype, length):
    g = torch.Generator().manual_seed(length)
    b, d, n = 3, 16, 2 * length + 5
    z = torch.randn((b, 3 * d, length), generator=g).to(dtype)
    z_bias, bias = torch.randn(3 * d, generator=g), torch.randn(3 * d, generator=g)
    weight, d_bias = torch.randn((3 * d, 3), generator=g), torch.randn(d, generator=g)
    x0, x1, v_ref = _reference(z, z_bias, weight, bias, d)
    v = torch.full((b, d, n), 7.0)
    v[..., length:] = 0.0
    z2d = z.transpose(0, 1).reshape(3 * d, b * length).contiguous()  # (3d, b L)
    conv = (_bits(z2d), z_bias.numpy(), weight.numpy(), bias.numpy())
    kernels.short_conv_gate(*conv, v.numpy())
    torch.testing.assert_close(v[..., :length], v_ref * x1, rtol=1e-5, atol=1e-5)
    assert not v[..., length:].any()  # the padding is left as it was
    y = torch.randn((b, d, n), generator=g)
    out = torch.empty((d, b * length), dtype=dtype)
    kernels.gate_out(y.numpy(), v.numpy(), *conv, d_bias.numpy(), _bits(out))
    out = out.view(d, b, length).transpose(0, 1)
    want = (y[..., :length] + v[..., :length] * d_bias[:, None]) * x0
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def tiny():
    return load_adapter(str(TINY), device="cpu", dtype="float32")


@pytest.mark.parametrize("length", [1, 16, 100, 256])
def test_long_conv_candidates_agree(tiny, length):
    filt = tiny.network.layers[0].mixer.filter_fn
    v = torch.randn((2, filt.bias.shape[0], length))
    taps = filt.kernel(length).detach().numpy()
    want = torch.tensor(
        np.array(
            [
                [np.convolve(row, taps[:, c])[:length] for c, row in enumerate(seq)]
                for seq in v.numpy()
            ]
        )
    ).float()
    with torch.inference_mode():
        for name in long_conv.CANDIDATES:
            padded = torch.zeros((2, v.shape[1], long_conv.size(name, length)))
            padded[..., :length] = v
            got = long_conv.convolve(name, padded, length, filt)[..., :length]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)


def test_long_conv_choice_is_a_timed_eligible_candidate(tiny):
    tuner = Tuner(None, fingerprint={"test": "1"}, repeats=1, budget=0.0)
    filt = tiny.network.layers[0].mixer.filter_fn
    name = long_conv.choose(tuner, filt, 64)
    (choice,) = tuner.choices.values()
    assert choice.how == "timed"
    assert name in choice.seconds
    assert not choice.ineligible, choice.ineligible
    assert set(choice.seconds) == set(long_conv.CANDIDATES)


def test_cpu_forward_copies_no_activation(tiny):
    """in_proj's output is written channels-first, (3d, b L), by the matmul itself:
    ``torch.matmul(W, u.mT)`` copied it transposed (issue 43's copy_)."""
    from torch.profiler import ProfilerActivity, profile

    seqs = random_seqs(4, seed=3, low=60, high=61)
    tiny.embed_batch(seqs)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        tiny.embed_batch(seqs)
    big = [
        e.input_shapes
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::copy_"
        and any(np.prod(s) >= 4 * 60 * 32 for s in e.input_shapes)
    ]
    assert not big, big


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("choice", long_conv.CANDIDATES)
def test_same_bytes_in_any_batch_with_each_long_conv(monkeypatch, dtype, choice):
    monkeypatch.setenv(ENV_VAR, f"longconv={choice}")
    adapter = load_adapter(str(TINY), device="cpu", dtype=dtype)
    targets = random_seqs(4, seed=31, low=60, high=120)
    others = random_seqs(20, seed=32, low=30, high=120)
    alone = np.stack(
        [embed_sequences(adapter, [s], MemoryStore()).vectors[0] for s in targets]
    )
    got = embed_sequences(adapter, [*others[:9], *targets, *others[9:]], MemoryStore())
    assert got.vectors[9:13].tobytes() == alone.tobytes()
