"""This machine's matmul rates, measured beside a benchmark: both dtypes, and the best.

Every share a benchmark prints is against **the machine's best matmul rate** (max
over float32 and bfloat16). On a CPU without bf16 instructions PyTorch emulates
bf16 matmuls (~50x slower than fp32 on an AVX2-only EPYC), so its bf16 rate is
measured at 512² there (a 2048² bf16 matmul would take many seconds) and float32 is
the faster dtype.
"""

from __future__ import annotations

import time

import torch

from embedcache.models.shared.cpu_features import cpu_has_bf16, cpu_kind


def matmul_peak(dtype: torch.dtype, *, size: int = 2048, seconds: float = 2.0) -> float:
    """Sustained FLOP/s of a square matmul in ``dtype`` (best of a few timed runs)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = 0.0
    end = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
        if time.perf_counter() >= end:
            return best


def machine_peaks(*, seconds: float = 1.5) -> dict[str, float]:
    """FLOP/s of float32 and bfloat16 matmuls, and ``best`` (their max)."""
    bf16_size = 512 if cpu_has_bf16() is False else 2048
    peaks = {
        "float32": matmul_peak(torch.float32, seconds=seconds),
        "bfloat16": matmul_peak(torch.bfloat16, size=bf16_size, seconds=seconds),
    }
    peaks["best"] = max(peaks.values())
    return peaks


def faster_dtype(peaks: dict[str, float] | None = None) -> str:
    """The dtype whose matmuls run faster here (from ``peaks``, else the CPU flags)."""
    if peaks is not None:
        return "bfloat16" if peaks["bfloat16"] > peaks["float32"] else "float32"
    return "float32" if cpu_has_bf16() is False else "bfloat16"


def cpu_kind_line() -> str:
    return f"CPU kind {cpu_kind()} (/proc/cpuinfo flags)"


def describe(peaks: dict[str, float]) -> str:
    return (
        f"matmul fp32 {peaks['float32'] / 1e9:.1f} GFLOP/s, bf16 "
        f"{peaks['bfloat16'] / 1e9:.1f} GFLOP/s (best {peaks['best'] / 1e9:.1f})"
    )
