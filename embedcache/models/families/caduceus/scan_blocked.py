# ruff: noqa: ANN001, ANN002, ANN202 (numba kernels: types come from the call)
"""The selective scan with its recurrence in registers: :func:`scan_gated_blocked`.

Same contract and same float32 bits as :func:`.kernels.scan_gated` (the loop
kernel), organised for the CPU: per (sequence, block of 64 channels) and block of
``TIME_BLOCK`` steps, numba loops compute ``delta`` (dt projection + softplus),
``delta * u`` and gather B and C for the whole time block, then
:func:`.simd.recur16` runs the recurrence 16 channels at a time with the state in
registers, then the D skip and the ``silu(z)`` gate are applied row by row. The dt
projection runs rank-outer so that no row waits on its own previous update.

:func:`scan_gated_fused` goes further (issue 43): one vector call per 16 channels
and time block computes delta, ``D * u`` and ``silu(z)`` for every step, runs the
recurrence and adds the gated output into the row; its exps are cheaper polynomials
(:data:`.simd.DECAY_EXP2_COEF32`), so its float32 output equals the loop kernel's
within float32 tolerance (about 2e-6 relative), not bit for bit; a bfloat16 output
takes a degree-3 decay (:data:`.simd.DECAY_EXP2_COEF32_BF16`), whose error its own
rounding hides.

Needs ``d_state == 16`` and ``d_inner % 16 == 0`` (:func:`fits`); the loop kernel
takes any shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from embedcache.models.families.caduceus.fused_simd import MAX_STEPS, fused16
from embedcache.models.families.caduceus.kernels import (
    _load,
    _silu,
    _softplus,
    _store_row,
)
from embedcache.models.families.caduceus.simd import LANES, N_STATE, recur16
from embedcache.models.shared import kernel_cache

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.models.shared.tuning import Tuner

# the cached kernels go stale with the vector IR of simd and fused_simd
kernel_cache.track(__name__)

CHANNEL_BLOCK = 64
TIME_BLOCK = 32
FUSED_TIME_BLOCK = MAX_STEPS  # fused16's calls: fewer, and its prefetch further ahead
_FLOAT_BYTES = 4


def fits(*, d_state: int, d_inner: int) -> bool:
    """Whether :func:`scan_gated_blocked` takes this shape."""
    return d_state == N_STATE and d_inner % LANES == 0


@numba.njit(inline="always")
def _time(length, reverse, s0, i):
    """The position of step ``s0 + i`` (time runs backwards when ``reverse``)."""
    return length - 1 - (s0 + i) if reverse else s0 + i


@numba.njit(inline="always")
def _address(arr, i, j, k):
    """The byte address of ``arr[i, j, k]`` (any strides)."""
    s = arr.strides
    return arr.ctypes.data + i * s[0] + j * s[1] + k * s[2]


@numba.njit(inline="always", fastmath=True)
def _stage(ins, p, g, c0, w, s0, n_steps, delta, du, bc):
    """delta (dt projection rank-outer, then softplus), delta * u, B and C of
    ``n_steps`` steps into contiguous rows for :func:`.simd.recur16`."""
    us, dts, bs, cs, _, _, dt_w, dt_bias, reverse, _, out = ins
    u, dt, b, c, length = us[p], dts[p], bs[p], cs[p], out.shape[1]
    bias_row = dt_bias[p, c0 : c0 + w]
    for i in range(n_steps):
        t = _time(length, reverse[p], s0, i)
        delta_row = delta[i]
        for ci in range(w):
            delta_row[ci] = bias_row[ci]
        for n in range(N_STATE):
            bc[i, n] = b[g, t, n]
            bc[i, N_STATE + n] = c[g, t, n]
    for k in range(dt_w.shape[1]):
        w_row = dt_w[p, k, c0 : c0 + w]
        for i in range(n_steps):
            dt_k = dt[g, _time(length, reverse[p], s0, i), k]
            delta_row = delta[i]
            for ci in range(w):
                delta_row[ci] += w_row[ci] * dt_k
    for i in range(n_steps):
        delta_row, du_row = delta[i], du[i]
        u_row = u[g, _time(length, reverse[p], s0, i), c0 : c0 + w]
        for ci in range(w):
            step = _softplus(delta_row[ci])
            delta_row[ci] = step
            du_row[ci] = step * u_row[ci]


@numba.njit(inline="always", fastmath=True)
def _recur_fused(ins, p, g, ch, s0, n_steps, state, a, y, avx512, first, last):
    """:func:`.fused_simd.fused16` on channels ``ch .. ch+16``: nothing staged; adds its
    output into ``y`` (float32, (L, w), its channels from ``ch``), or when ``last``
    gates it and writes it into the output."""
    us, dts, bs, cs, _, d, dt_w, dt_bias, reverse, xz, out = ins
    u, dt, length, n_chan = us[p], dts[p], out.shape[1], out.shape[2]
    first_t = _time(length, reverse[p], s0, 0)
    sign = -1 if reverse[p] else 1
    # what runs next here, for fused16 to prefetch: this direction's next block,
    # else the next direction's first (else this block again: a harmless hint)
    q, s1 = p, s0 + FUSED_TIME_BLOCK
    if s1 >= length:
        q, s1 = (p + 1, 0) if p + 1 < len(us) else (p, s0)
    next_t = _time(length, reverse[q], s1, 0)
    next_sign = -1 if reverse[q] else 1
    addresses = (
        state.ctypes.data,
        a.ctypes.data,
        _address(dt, g, first_t, 0),
        _address(bs[p], g, first_t, 0),
        _address(cs[p], g, first_t, 0),
        sign * (dt.strides[1] // _FLOAT_BYTES),
        _address(u, g, first_t, ch),
        sign * (u.strides[1] // _FLOAT_BYTES),
        _address(dt_w, p, 0, ch),
        dt_w.strides[1] // _FLOAT_BYTES,
        dt_w.shape[1],
        dt_bias[p, ch:].ctypes.data,
        d[p, ch:].ctypes.data,
        y[first_t].ctypes.data,
        sign * (y.strides[0] // _FLOAT_BYTES),
        _address(xz, g, first_t, n_chan + ch),
        sign * (xz.strides[1] // xz.itemsize),
        _address(out, g, first_t, ch),
        sign * (out.strides[1] // out.itemsize),
        n_steps,
        _address(us[q], g, next_t, ch),
        next_sign * (us[q].strides[1] // _FLOAT_BYTES),
        _address(dts[q], g, next_t, 0),
        _address(bs[q], g, next_t, 0),
        _address(cs[q], g, next_t, 0),
        next_sign * (dts[q].strides[1] // _FLOAT_BYTES),
        _address(xz, g, next_t, n_chan + ch),
        next_sign * (xz.strides[1] // xz.itemsize),
        1 if first else 0,
        1 if last else 0,
    )
    fused16(addresses, xz, out, avx512)


@numba.njit(inline="always", fastmath=True)
def _gate(ins, p, g, c0, w, s0, n_steps, acc, y):
    """``y += (acc + D * u) * silu(z)`` over ``n_steps`` steps."""
    us, _, _, _, _, d, _, _, reverse, xz, out = ins
    length, n_chan = out.shape[1], out.shape[2]
    d_row = d[p, c0 : c0 + w]
    for i in range(n_steps):
        t = _time(length, reverse[p], s0, i)
        z_row = xz[g, t, n_chan + c0 : n_chan + c0 + w]
        u_row = us[p][g, t, c0 : c0 + w]
        acc_row, y_row = acc[i], y[t]
        for ci in range(w):
            gate = _silu(_load(z_row[ci]))
            y_row[ci] += (acc_row[ci] + d_row[ci] * u_row[ci]) * gate


@numba.njit(inline="always", fastmath=True)
def _fused_direction(ins, p, g, c0, w, state, a_loc, y, avx512, first, last):
    """One direction of channels ``c0 .. c0+w`` with :func:`.fused_simd.fused16`."""
    length = ins[10].shape[1]
    state[:] = 0.0
    for s0 in range(0, length, FUSED_TIME_BLOCK):
        n_steps = min(FUSED_TIME_BLOCK, length - s0)
        for sb in range(w // LANES):
            lanes = slice(sb * LANES, (sb + 1) * LANES)
            _recur_fused(
                ins, p, g, c0 + sb * LANES, s0, n_steps, state[sb], a_loc[p, sb],
                y[:, lanes], avx512, first, last,
            )  # fmt: skip


@numba.njit(inline="always", fastmath=True)
def _block(ins, g, c0, w, avx512, fused):
    """Channels ``c0 .. c0+w`` (``w`` a multiple of 16) of sequence ``g``, each
    direction, time in blocks; 16 channels a vector call."""
    a_log2, out = ins[4], ins[10]
    n_dir, length, n_sub = len(ins[0]), out.shape[1], w // LANES
    state = np.empty((n_sub, N_STATE, LANES), dtype=np.float32)
    a_loc = np.empty((n_dir, n_sub, N_STATE, LANES), dtype=np.float32)
    for p in range(n_dir):
        for sb in range(n_sub):
            for n in range(N_STATE):
                for lane in range(LANES):
                    a_loc[p, sb, n, lane] = a_log2[p, n, c0 + sb * LANES + lane]
    if fused:  # y: the directions' sum, before the gate
        y = np.empty((length, w), dtype=np.float32)
        for p in range(n_dir):
            _fused_direction(
                ins, p, g, c0, w, state, a_loc, y, avx512, p == 0, p == n_dir - 1
            )
        return
    y = np.zeros((length, w), dtype=np.float32)
    acc = np.empty((TIME_BLOCK, w), dtype=np.float32)
    delta = np.empty((TIME_BLOCK, w), dtype=np.float32)
    du = np.empty((TIME_BLOCK, w), dtype=np.float32)
    bc = np.empty((TIME_BLOCK, 2 * N_STATE), dtype=np.float32)
    for p in range(n_dir):
        state[:] = 0.0
        for s0 in range(0, length, TIME_BLOCK):
            n_steps = min(TIME_BLOCK, length - s0)
            _stage(ins, p, g, c0, w, s0, n_steps, delta, du, bc)
            for sb in range(n_sub):
                lanes = slice(sb * LANES, (sb + 1) * LANES)
                recur16(
                    state[sb].ctypes.data, a_loc[p, sb].ctypes.data,
                    delta[:, lanes].ctypes.data, du[:, lanes].ctypes.data,
                    bc.ctypes.data, acc[:, lanes].ctypes.data, n_steps, w, avx512,
                )  # fmt: skip
            _gate(ins, p, g, c0, w, s0, n_steps, acc, y)
    for t in range(length):
        _store_row(y[t], out[g, t, c0 : c0 + w])


@numba.njit(inline="always")
def _check_strides(us, dts, bs, cs, d, dt_w, dt_bias, xz, out):
    """fused16 reads rows as contiguous values, dt, B and C rows one step apart."""
    for p in range(len(us)):
        rows = dts[p].strides[1]
        if (
            us[p].strides[2] != _FLOAT_BYTES
            or dts[p].strides[2] != _FLOAT_BYTES
            or bs[p].strides[2] != _FLOAT_BYTES
            or cs[p].strides[2] != _FLOAT_BYTES
            or bs[p].strides[1] != rows
            or cs[p].strides[1] != rows
            or dt_w.strides[2] != _FLOAT_BYTES
            or dt_bias.strides[1] != _FLOAT_BYTES
            or d.strides[1] != _FLOAT_BYTES
            or xz.strides[2] != xz.itemsize
            or out.strides[2] != out.itemsize
        ):
            raise ValueError("fused scan: u, dt, B, C rows must be contiguous floats")  # noqa: EM101 (numba: a constant message)


@numba.njit(inline="always", fastmath=True)
def _scan(ins, avx512, fused):
    # the prange body takes the arrays one by one (parfors cannot pass a tuple
    # holding tuples of arrays) and packs them again per item
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out = ins
    if fused:
        _check_strides(us, dts, bs, cs, d, dt_w, dt_bias, xz, out)
    n_seq, n_chan = out.shape[0], out.shape[2]
    n_block = (n_chan + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    for item in numba.prange(n_seq * n_block):
        g = item // n_block
        c0 = (item - g * n_block) * CHANNEL_BLOCK
        packed = (us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out)
        # a constant width for full blocks lets LLVM unroll the channel loops
        if c0 + CHANNEL_BLOCK <= n_chan:
            _block(packed, g, c0, CHANNEL_BLOCK, avx512, fused)
        else:
            _block(packed, g, c0, n_chan - c0, avx512, fused)


# the candidates: the scan_gated contract (11 arrays); *ins keeps each a one-liner
@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_blocked(*ins) -> None:
    """Recurrence in portable 16-lane vectors, its inputs staged by numba loops."""
    _scan(ins, False, False)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_blocked_avx512(*ins) -> None:
    """As :func:`scan_gated_blocked`, with AVX-512 exp steps (only where avx512f)."""
    _scan(ins, True, False)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_fused(*ins) -> None:
    """Everything in the vector code (:func:`.fused_simd.fused16`): dt projection,
    softplus, recurrence, D skip and gate; u, dt, B, C, z rows must be contiguous."""
    _scan(ins, False, True)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_fused_avx512(*ins) -> None:
    """:func:`scan_gated_fused` with the AVX-512 exp steps."""
    _scan(ins, True, True)


def synthetic_inputs(
    *,
    n_seq: int,
    length: int,
    d_inner: int,
    d_state: int,
    dt_rank: int,
    bf16: bool,
    seed: int = 0,
) -> tuple[Any, ...]:
    """Random scan inputs in the layouts the network passes (views of x_proj's output),
    two directions, the second reversed; the output array last."""
    import torch

    rng = np.random.default_rng(seed)

    def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    dbl = [f32(n_seq, length, dt_rank + 2 * d_state) for _ in range(2)]
    a = (
        -np.exp(f32(2, d_state, d_inner, scale=0.5))
        * np.arange(1, d_state + 1)[:, None]
    )
    xz = torch.from_numpy(f32(n_seq, length, 2 * d_inner))
    out = torch.empty((n_seq, length, d_inner), dtype=torch.float32)
    return (
        tuple(f32(n_seq, length, d_inner) for _ in range(2)),
        tuple(x[..., :dt_rank] for x in dbl),
        tuple(x[..., dt_rank : dt_rank + d_state] for x in dbl),
        tuple(x[..., dt_rank + d_state :] for x in dbl),
        (a / np.log(2.0)).astype(np.float32),
        f32(2, d_inner),
        f32(2, dt_rank, d_inner, scale=0.3),
        f32(2, d_inner, scale=0.5) - 2.0,
        np.array([False, True]),
        xz.bfloat16().view(torch.int16).numpy() if bf16 else xz.numpy(),
        out.bfloat16().view(torch.int16).numpy() if bf16 else out.numpy(),
    )


def candidates(*, d_state: int, d_inner: int) -> dict[str, Callable[..., None]]:
    """The scan kernels that take this shape, by name; ``loop`` first (the reference)."""
    from embedcache.models.families.caduceus.kernels import scan_gated
    from embedcache.models.shared.cpu_features import cpu_flags

    found: dict[str, Callable[..., None]] = {"loop": scan_gated}
    if fits(d_state=d_state, d_inner=d_inner):
        found["blocked"] = scan_gated_blocked
        found["fused"] = scan_gated_fused
        if _targets_avx512(cpu_flags()):
            found["blocked-avx512"] = scan_gated_blocked_avx512
            found["fused-avx512"] = scan_gated_fused_avx512
    return found


def _targets_avx512(flags: frozenset[str] | None) -> bool:
    """Whether numba compiles for a CPU with AVX-512F: this one's features unless
    ``NUMBA_CPU_FEATURES`` lists others (with ``NUMBA_CPU_NAME=haswell``, to measure
    AVX2 code on an AVX-512 CPU; the name alone keeps the host's features)."""
    from numba.core import config

    if config.CPU_FEATURES is None:
        return "avx512f" in (flags or ())
    return "+avx512f" in config.CPU_FEATURES


def choose_kernel(
    *, d_state: int, d_inner: int, dt_rank: int, bf16: bool, tuner: Tuner
) -> Callable[..., None]:
    """The fastest scan kernel for this shape on this machine (see ``tuning``)."""
    from embedcache.models.shared.tuning import Candidate, Problem

    kernels = candidates(d_state=d_state, d_inner=d_inner)

    def runner(kernel: Callable[..., None]) -> Callable[[tuple[Any, ...]], np.ndarray]:
        def run(args: tuple[Any, ...]) -> np.ndarray:
            kernel(*args)
            out = args[-1]
            if bf16:  # bfloat16 bits -> the float32 values they stand for
                return (out.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            return out.copy()

        return run

    def make_input() -> tuple[Any, ...]:
        return synthetic_inputs(
            n_seq=2,
            length=128,
            d_inner=d_inner,
            d_state=d_state,
            dt_rank=dt_rank,
            bf16=bf16,
        )

    problem = Problem(
        "scan",
        "bfloat16" if bf16 else "float32",
        shape=f"d_inner={d_inner},d_state={d_state},dt_rank={dt_rank}",
    )
    name = tuner.choose(
        problem,
        [Candidate(name, runner(kernel)) for name, kernel in kernels.items()],
        make_input,
    )
    return kernels[name]
