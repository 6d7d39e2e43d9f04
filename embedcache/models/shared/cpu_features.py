"""What the CPU can do fast: whether it has bf16 instructions (AVX-512 BF16 or AMX).

On a CPU without them PyTorch emulates bf16 matmuls, which then run many times
slower than float32 (measured on an AVX2-only EPYC: 1.3 vs 63.7 GFLOP/s, one
thread, 512²), so ``--dtype bfloat16`` is worth a word there. The key still records
what the user asked: the warning changes no vector.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")
# CPU flags (Linux names) under which PyTorch runs bf16 matmuls natively
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_warned: set[str] = set()


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The first CPU's feature flags from ``/proc/cpuinfo``; None where unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


@cache
def cpu_has_bf16() -> bool | None:
    """Whether this CPU runs bf16 matmuls natively; None when it cannot be told."""
    flags = cpu_flags()
    if flags is None:
        return None
    return bool(flags & BF16_FLAGS)


def warn_if_bf16_is_slow(dtype: str, device: str, *, model: str) -> bool:
    """Warn once per process that float32 will be faster for bf16 on this CPU.

    Returns whether the warning applies (it is logged only the first time).
    """
    if (
        dtype != "bfloat16"
        or not device.startswith("cpu")
        or cpu_has_bf16() is not False
    ):
        return False
    if "bf16" not in _warned:
        _warned.add("bf16")
        logger.warning(
            "%s: --dtype bfloat16 on a CPU without bf16 instructions (no avx512_bf16 "
            "or amx_bf16 in /proc/cpuinfo): PyTorch emulates bf16 matmuls here and "
            "--dtype float32 will be several times faster; the key records bfloat16 "
            "as asked",
            model,
        )
    return True
