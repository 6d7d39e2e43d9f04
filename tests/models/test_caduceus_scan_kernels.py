"""The scan kernel candidates compute the loop kernel's bits (fp32 and bf16 I/O)."""

from __future__ import annotations

import numpy as np
import pytest

from embedcache.models.families.caduceus import kernels, scan_blocked

# every candidate the tuner may pick on this machine, the reference apart
CANDIDATES = [
    kernel
    for name, kernel in scan_blocked.candidates(d_state=16, d_inner=80).items()
    if name != "loop"
]


def run(kernel, *, bf16):
    # 80 channels: one full block of 64 and a 16-channel tail; 45 steps: a partial
    # time block; the second direction runs backwards; dt_rank 5
    args = scan_blocked.synthetic_inputs(
        n_seq=3, length=45, d_inner=80, d_state=16, dt_rank=5, bf16=bf16
    )
    kernel(*args)
    out = args[-1]
    return (
        (out.view(np.uint16).astype(np.uint32) << 16).view(np.float32) if bf16 else out
    )


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("kernel", CANDIDATES, ids=lambda k: k.__name__)
def test_candidate_scans_are_bit_identical_to_the_loop(kernel, bf16):
    want = run(kernels.scan_gated, bf16=bf16)
    got = run(kernel, bf16=bf16)
    assert np.isfinite(want).all()
    assert np.abs(want).max() > 0.1
    np.testing.assert_array_equal(got, want)


def test_blocked_scans_take_only_their_shapes():
    assert scan_blocked.fits(d_state=16, d_inner=80)
    assert not scan_blocked.fits(d_state=8, d_inner=80)
    assert not scan_blocked.fits(d_state=16, d_inner=72)
    assert list(scan_blocked.candidates(d_state=8, d_inner=80)) == ["loop"]
