"""The scan kernel candidates: the blocked ones compute the loop kernel's bits, the
fused ones its values within the tuner's tolerance; all match the official code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedcache.hashing import normalise_sequence
from embedcache.models.families.caduceus import kernels, scan_blocked
from embedcache.models.families.caduceus.adapter import load_caduceus_adapter
from embedcache.models.shared import tuning
from tests.models import adapter_contract as contract

FIXTURES = Path(__file__).parents[1] / "fixtures" / "caduceus"
# every candidate the tuner may pick on this machine, the reference apart
NAMES = [
    name for name in scan_blocked.candidates(d_state=16, d_inner=80) if name != "loop"
]
KERNELS = scan_blocked.candidates(d_state=16, d_inner=80)
EXACT = [KERNELS[name] for name in NAMES if name.startswith("blocked")]
CLOSE = [KERNELS[name] for name in NAMES if name.startswith("fused")]


# one partial time block; several blocks and a partial one, the prefetch crossing
# into the second direction (one direction alone: the official-code tests, whose
# untied layers scan each direction by itself)
LENGTHS = [45, 150]


def run(kernel, *, bf16, length=45, dt_shift=0.0):
    # 80 channels: one full block of 64 and a 16-channel tail; the second direction
    # runs backwards; dt_rank 5. dt_shift moves the dt bias (-4: deltas near 0.01,
    # decays near 1, memories hundreds of steps long)
    args = list(
        scan_blocked.synthetic_inputs(
            n_seq=3, length=length, d_inner=80, d_state=16, dt_rank=5, bf16=bf16
        )
    )
    args[7] = args[7] + np.float32(dt_shift)
    kernel(*args)
    out = args[-1]
    return (
        (out.view(np.uint16).astype(np.uint32) << 16).view(np.float32) if bf16 else out
    )


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("kernel", EXACT, ids=lambda k: k.__name__)
def test_blocked_scans_are_bit_identical_to_the_loop(kernel, bf16):
    want = run(kernels.scan_gated, bf16=bf16)
    got = run(kernel, bf16=bf16)
    assert np.isfinite(want).all()
    assert np.abs(want).max() > 0.1
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("kernel", CLOSE, ids=lambda k: k.__name__)
def test_fused_scans_agree_with_the_loop_within_the_tuners_tolerance(
    kernel, bf16, length
):
    # cheaper exp polynomials and one gate on the directions' sum: other bits, the
    # same values within the tolerance the tuner enforces (relative to the output's
    # largest value)
    want = run(kernels.scan_gated, bf16=bf16, length=length)
    got = run(kernel, bf16=bf16, length=length)
    limit = tuning.TOLERANCE["bfloat16" if bf16 else "float32"]
    relative = np.abs(got - want).max() / np.abs(want).max()
    assert relative <= (limit if bf16 else limit / 4)
    assert relative > 0 or bf16  # float32: not the loop's bits (the exp differs)


@pytest.mark.parametrize("dt_shift", [0.0, -4.0])
@pytest.mark.parametrize("kernel", CLOSE, ids=lambda k: k.__name__)
def test_fused_bfloat16_scans_are_as_close_to_float32_as_the_loop(kernel, dt_shift):
    # a bfloat16 output takes a cheaper decay: its error, long memories included,
    # stays under the output's own rounding, which the bfloat16 loop shares
    def error(kernel, bf16):
        got = run(kernel, bf16=bf16, length=600, dt_shift=dt_shift)
        return np.abs(got - want)

    want = run(kernels.scan_gated, bf16=False, length=600, dt_shift=dt_shift)
    fused, loop = error(kernel, True), error(kernels.scan_gated, True)
    assert np.sqrt(np.mean(fused**2)) <= 1.02 * np.sqrt(np.mean(loop**2))
    assert fused.max() <= 1.1 * loop.max()


def test_fused_scans_are_offered_on_every_cpu():
    assert "fused" in KERNELS
    assert ("fused-avx512" in KERNELS) == ("blocked-avx512" in KERNELS)


@pytest.mark.parametrize("name", ["loop", *NAMES])
@pytest.mark.parametrize("variant", ["ph", "ps"])
def test_every_candidate_matches_the_official_code(
    monkeypatch, tmp_path, name, variant
):
    monkeypatch.setattr(tuning, "cache_path", lambda _environ: tmp_path / "t.json")
    monkeypatch.setenv(tuning.ENV_VAR, f"scan={name}")
    seqs = [
        normalise_sequence(s) for s in (FIXTURES / "sequences.txt").read_text().split()
    ]
    want = contract.read_expected(FIXTURES)[f"{variant}_average"]
    adapter = load_caduceus_adapter(FIXTURES / variant, rc_mode="average")
    np.testing.assert_allclose(adapter.embed_batch(seqs), want, atol=1e-4, rtol=0)


def test_blocked_scans_take_only_their_shapes():
    assert scan_blocked.fits(d_state=16, d_inner=80)
    assert not scan_blocked.fits(d_state=8, d_inner=80)
    assert not scan_blocked.fits(d_state=16, d_inner=72)
    assert list(scan_blocked.candidates(d_state=8, d_inner=80)) == ["loop"]


def test_fused_scan_of_one_direction_agrees_with_the_loop():
    # an untied or unidirectional layer scans one direction: the fused kernel's first
    # direction is then also its last (it gates and writes the output itself)
    def run_forward(kernel):
        args = scan_blocked.synthetic_inputs(
            n_seq=2, length=100, d_inner=32, d_state=16, dt_rank=5, bf16=False
        )
        one = tuple(
            a[:1] if isinstance(a, tuple) or i in range(4, 9) else a
            for i, a in enumerate(args)
        )
        kernel(*one)
        return one[-1]

    want = run_forward(kernels.scan_gated)
    got = run_forward(KERNELS["fused"])
    assert np.abs(want).max() > 0.1
    relative = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < relative <= tuning.TOLERANCE["float32"] / 4
