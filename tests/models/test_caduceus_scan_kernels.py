"""The scan kernel candidates compute the loop kernel's bits (fp32 and bf16 I/O)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedcache.models.families.caduceus import kernels, scan_blocked
from embedcache.models.shared.cpu_features import cpu_flags


def scan_inputs(*, n_seq=3, length=45, d_inner=80, bf16=False, seed=0):
    """Random scan inputs in the layouts the network passes (x_proj output views)."""
    rng = np.random.default_rng(seed)
    n_dir, n_state, rank = 2, 16, 5

    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    dbl = [f32(n_seq, length, rank + 2 * n_state) for _ in range(n_dir)]
    xz = torch.from_numpy(f32(n_seq, length, 2 * d_inner))
    a = -np.exp(f32(n_dir, n_state, d_inner, scale=0.5)) * np.arange(1, 17)[:, None]
    return (
        tuple(f32(n_seq, length, d_inner) for _ in range(n_dir)),
        tuple(x[..., :rank] for x in dbl),
        tuple(x[..., rank : rank + n_state] for x in dbl),
        tuple(x[..., rank + n_state :] for x in dbl),
        (a / np.log(2.0)).astype(np.float32),
        f32(n_dir, d_inner),
        f32(n_dir, rank, d_inner, scale=0.3),
        f32(n_dir, d_inner, scale=0.5) - 2.0,
        np.array([False, True]),
        xz.bfloat16().view(torch.int16).numpy() if bf16 else xz.numpy(),
    )


def run(kernel, args, *, bf16):
    n_seq, length, two_di = args[-1].shape
    out = torch.empty((n_seq, length, two_di // 2), dtype=torch.float32)
    if bf16:
        out = out.bfloat16()
        kernel(*args, out.view(torch.int16).numpy())
    else:
        kernel(*args, out.numpy())
    return out.float().numpy()


CANDIDATES = [scan_blocked.scan_gated_blocked] + (
    [scan_blocked.scan_gated_blocked_avx512] if "avx512f" in (cpu_flags() or ()) else []
)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("kernel", CANDIDATES, ids=lambda k: k.__name__)
def test_blocked_scan_is_bit_identical_to_the_loop(kernel, bf16):
    # 80 channels: one full block of 64 and a 16-channel tail; 45 steps: a partial
    # time block; the second direction runs backwards
    args = scan_inputs(bf16=bf16)
    want = run(kernels.scan_gated, args, bf16=bf16)
    got = run(kernel, args, bf16=bf16)
    assert np.isfinite(want).all()
    assert np.abs(want).max() > 0.1
    np.testing.assert_array_equal(got, want)


def test_blocked_scan_takes_only_its_shapes():
    assert scan_blocked.fits(d_state=16, d_inner=80)
    assert not scan_blocked.fits(d_state=8, d_inner=80)
    assert not scan_blocked.fits(d_state=16, d_inner=72)
