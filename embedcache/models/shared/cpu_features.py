"""What the CPU can do fast: its kind (AMX, AVX-512 BF16, AVX-512, AVX2), and so
the compute dtype ``--dtype auto`` resolves to.

On a CPU without bf16 instructions PyTorch emulates bf16 matmuls, which then run
many times slower than float32 (measured on an AVX2-only EPYC: 1.3 vs 63.7 GFLOP/s,
one thread, 512²), so ``--dtype bfloat16`` is worth a word there and ``auto`` takes
float32; with them (AMX: 2,214-2,477 against 330 GFLOP/s on 2 cores) ``auto`` takes
bfloat16. The key records the dtype that runs, never ``auto``.

For tests and CI only, ``EMBEDCACHE_CPU_KIND`` (one of :data:`KINDS`) overrides
the detection, so that the suite can run as on another kind of CPU, subprocesses
included (``EMBEDCACHE_CPU_KIND=AMX python -m pytest ...``). It changes what
``auto`` resolves to and the kind that is reported, never the instructions that
run. It is the one environment variable read outside ``cli``: a test setting,
read here where the CPU is detected so that every process sees the same kind.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

from embedcache.errors import AdapterOptionError

logger = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")
# CPU flags (Linux names) under which PyTorch runs bf16 matmuls natively
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# the kinds, each named by the first of these flags the CPU has
CPU_KINDS = (
    ("amx_bf16", "AMX"),
    ("avx512_bf16", "AVX-512 BF16"),
    ("avx512f", "AVX-512"),
    ("avx2", "AVX2"),
)
KINDS = tuple(kind for _, kind in CPU_KINDS)
# the kinds whose CPUs run bf16 matmuls natively
BF16_KINDS = frozenset({"AMX", "AVX-512 BF16"})
# for tests and CI only: run as on a CPU of this kind (see the module docstring)
FORCED_KIND_VAR = "EMBEDCACHE_CPU_KIND"
AUTO = "auto"
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


def forced_kind() -> str | None:
    """The CPU kind ``EMBEDCACHE_CPU_KIND`` forces (tests and CI only), or None.

    Raises
    ------
    AdapterOptionError
        When it names no kind of :data:`KINDS`.
    """
    forced = os.environ.get(FORCED_KIND_VAR, "").strip()
    if not forced:
        return None
    if forced not in KINDS:
        msg = (
            f"{FORCED_KIND_VAR}={forced!r} names no CPU kind: use one of "
            f"{', '.join(KINDS)}, or unset it to detect the CPU"
        )
        raise AdapterOptionError(msg)
    return forced


def cpu_has_bf16() -> bool | None:
    """Whether this CPU runs bf16 matmuls natively; None when it cannot be told."""
    forced = forced_kind()
    if forced is not None:
        return forced in BF16_KINDS
    return _flags_have_bf16()


@cache
def _flags_have_bf16() -> bool | None:
    flags = cpu_flags()
    if flags is None:
        return None
    return bool(flags & BF16_FLAGS)


def kind_of(flags: frozenset[str] | None) -> str:
    """The CPU kind the flags name: the first of :data:`CPU_KINDS`, else ``unknown``."""
    return next((kind for flag, kind in CPU_KINDS if flag in (flags or ())), "unknown")


def cpu_kind() -> str:
    """This machine's CPU kind (``AMX``, ``AVX-512 BF16``, ``AVX-512``, ``AVX2``,
    ``unknown``), or the kind ``EMBEDCACHE_CPU_KIND`` forces."""
    return forced_kind() or _detected_kind()


@cache
def _detected_kind() -> str:
    return kind_of(cpu_flags())


def resolve_dtype(dtype: str, device: str) -> str:
    """``dtype``, with ``auto`` resolved to what runs fastest on ``device``.

    bfloat16 on a CUDA device that runs it natively and on a CPU with bf16
    instructions (AMX, AVX-512 BF16); float32 elsewhere, where bf16 is emulated or
    the CPU cannot be told. ``device`` may be ``auto`` (CUDA when present), as a
    Dask client resolves it for workers it cannot see.
    """
    if dtype != AUTO:
        return dtype
    if device == "auto" or device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            native = torch.cuda.is_bf16_supported(including_emulation=False)
            return "bfloat16" if native else "float32"
        if device != "auto":  # asked for CUDA here without one: load_adapter says so
            return "float32"
    return "bfloat16" if cpu_has_bf16() is True else "float32"


def describe_auto(device: str) -> str:
    """What ``--dtype auto`` computes in on ``device`` and why, for a log line."""
    dtype = resolve_dtype(AUTO, device)
    if device.startswith("cuda"):
        return f"--dtype auto: {dtype} on {device}"
    why = "bf16 instructions" if dtype == "bfloat16" else "no bf16 instructions"
    forced = f", forced by {FORCED_KIND_VAR}" if forced_kind() else ""
    return f"--dtype auto: {dtype} (CPU kind {cpu_kind()}{forced}: {why})"


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
