# ruff: noqa: ANN001, ANN202 (numba kernels: types come from the call)
"""The selective scan with its recurrence in registers: :func:`scan_gated_blocked`.

Same contract and same float32 bits as :func:`.kernels.scan_gated` (the loop
kernel), organised for the CPU: per (sequence, block of 64 channels) and block of
``TIME_BLOCK`` steps, numba loops compute ``delta`` (dt projection + softplus),
``delta * u`` and gather B and C for the whole time block, then
:func:`.simd.recur16` runs the recurrence 16 channels at a time with the state in
registers, then the D skip and the ``silu(z)`` gate are applied row by row. The dt
projection runs rank-outer so that no row waits on its own previous update.

Needs ``d_state == 16`` and ``d_inner % 16 == 0`` (:func:`fits`); the loop kernel
takes any shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from embedcache.models.families.caduceus.kernels import (
    _load,
    _silu,
    _softplus,
    _store_row,
)
from embedcache.models.families.caduceus.simd import LANES, N_STATE, fused16, recur16

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.models.shared.tuning import Tuner

CHANNEL_BLOCK = 64
TIME_BLOCK = 32
_FLOAT_BYTES = 4


def fits(*, d_state: int, d_inner: int) -> bool:
    """Whether :func:`scan_gated_blocked` takes this shape."""
    return d_state == N_STATE and d_inner % LANES == 0


@numba.njit(inline="always", fastmath=True)
def _block(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, g, c0, w, avx512
):
    """Channels ``c0 .. c0+w`` (``w`` a multiple of 16) of sequence ``g``."""
    length, n_chan = out.shape[1], out.shape[2]
    n_rank = dt_w.shape[1]
    n_sub = w // LANES
    state = np.empty((n_sub, N_STATE, LANES), dtype=np.float32)
    a_loc = np.empty((n_sub, N_STATE, LANES), dtype=np.float32)
    y = np.zeros((length, w), dtype=np.float32)
    delta = np.empty((TIME_BLOCK, w), dtype=np.float32)
    du = np.empty((TIME_BLOCK, w), dtype=np.float32)
    acc = np.empty((TIME_BLOCK, w), dtype=np.float32)
    bc = np.empty((TIME_BLOCK, 2 * N_STATE), dtype=np.float32)
    for p in range(len(us)):
        u, dt, b, c = us[p], dts[p], bs[p], cs[p]
        for sb in range(n_sub):
            for n in range(N_STATE):
                for lane in range(LANES):
                    a_loc[sb, n, lane] = a_log2[p, n, c0 + sb * LANES + lane]
        state[:] = 0.0
        bias_row = dt_bias[p, c0 : c0 + w]
        d_row = d[p, c0 : c0 + w]
        for s0 in range(0, length, TIME_BLOCK):
            n_steps = min(TIME_BLOCK, length - s0)
            for i in range(n_steps):
                t = length - 1 - (s0 + i) if reverse[p] else s0 + i
                delta_row = delta[i]
                for ci in range(w):
                    delta_row[ci] = bias_row[ci]
                for n in range(N_STATE):
                    bc[i, n] = b[g, t, n]
                    bc[i, N_STATE + n] = c[g, t, n]
            for k in range(n_rank):
                w_row = dt_w[p, k, c0 : c0 + w]
                for i in range(n_steps):
                    t = length - 1 - (s0 + i) if reverse[p] else s0 + i
                    dt_k = dt[g, t, k]
                    delta_row = delta[i]
                    for ci in range(w):
                        delta_row[ci] += w_row[ci] * dt_k
            for i in range(n_steps):
                t = length - 1 - (s0 + i) if reverse[p] else s0 + i
                delta_row, du_row = delta[i], du[i]
                u_row = u[g, t, c0 : c0 + w]
                for ci in range(w):
                    step = _softplus(delta_row[ci])
                    delta_row[ci] = step
                    du_row[ci] = step * u_row[ci]
            for sb in range(n_sub):
                offset = sb * LANES * _FLOAT_BYTES
                recur16(
                    state[sb].ctypes.data,
                    a_loc[sb].ctypes.data,
                    delta.ctypes.data + offset,
                    du.ctypes.data + offset,
                    bc.ctypes.data,
                    acc.ctypes.data + offset,
                    n_steps,
                    w,
                    avx512,
                )
            for i in range(n_steps):
                t = length - 1 - (s0 + i) if reverse[p] else s0 + i
                z_row = xz[g, t, n_chan + c0 : n_chan + c0 + w]
                u_row = u[g, t, c0 : c0 + w]
                acc_row, y_row = acc[i], y[t]
                for ci in range(w):
                    gate = _silu(_load(z_row[ci]))
                    y_row[ci] += (acc_row[ci] + d_row[ci] * u_row[ci]) * gate
    for t in range(length):
        _store_row(y[t], out[g, t, c0 : c0 + w])


@numba.njit(inline="always")
def _address(arr, i, j, k):
    """The byte address of ``arr[i, j, k]`` (any strides)."""
    s = arr.strides
    return arr.ctypes.data + i * s[0] + j * s[1] + k * s[2]


@numba.njit(inline="always", fastmath=True)
def _block_fused(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, g, c0, w, avx512
):
    """:func:`_block` with delta, delta * u, B and C computed or read inside
    :func:`.simd.fused16`: only the D skip and the gate are left to numba loops."""
    length, n_chan = out.shape[1], out.shape[2]
    n_sub = w // LANES
    state = np.empty((n_sub, N_STATE, LANES), dtype=np.float32)
    a_loc = np.empty((n_sub, N_STATE, LANES), dtype=np.float32)
    y = np.zeros((length, w), dtype=np.float32)
    acc = np.empty((TIME_BLOCK, w), dtype=np.float32)
    for p in range(len(us)):
        u, dt, b, c = us[p], dts[p], bs[p], cs[p]
        for sb in range(n_sub):
            for n in range(N_STATE):
                for lane in range(LANES):
                    a_loc[sb, n, lane] = a_log2[p, n, c0 + sb * LANES + lane]
        state[:] = 0.0
        sign = -1 if reverse[p] else 1
        row_step = sign * (dt.strides[1] // _FLOAT_BYTES)
        u_step = sign * (u.strides[1] // _FLOAT_BYTES)
        d_row = d[p, c0 : c0 + w]
        for s0 in range(0, length, TIME_BLOCK):
            n_steps = min(TIME_BLOCK, length - s0)
            first = length - 1 - s0 if reverse[p] else s0
            for sb in range(n_sub):
                ch = c0 + sb * LANES
                fused16(
                    state[sb].ctypes.data,
                    a_loc[sb].ctypes.data,
                    _address(dt, g, first, 0),
                    _address(b, g, first, 0),
                    _address(c, g, first, 0),
                    row_step,
                    _address(u, g, first, ch),
                    u_step,
                    _address(dt_w, p, 0, ch),
                    dt_w.strides[1] // _FLOAT_BYTES,
                    dt_w.shape[1],
                    dt_bias[p, ch:].ctypes.data,
                    acc.ctypes.data + sb * LANES * _FLOAT_BYTES,
                    w,
                    n_steps,
                    avx512,
                )
            for i in range(n_steps):
                t = length - 1 - (s0 + i) if reverse[p] else s0 + i
                z_row = xz[g, t, n_chan + c0 : n_chan + c0 + w]
                u_row = u[g, t, c0 : c0 + w]
                acc_row, y_row = acc[i], y[t]
                for ci in range(w):
                    gate = _silu(_load(z_row[ci]))
                    y_row[ci] += (acc_row[ci] + d_row[ci] * u_row[ci]) * gate
    for t in range(length):
        _store_row(y[t], out[g, t, c0 : c0 + w])


@numba.njit(inline="always")
def _check_strides(us, dts, bs, cs, dt_w, dt_bias):
    """fused16 reads rows as contiguous floats, dt, B and C rows one step apart."""
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
        ):
            raise ValueError("fused scan: u, dt, B, C rows must be contiguous floats")  # noqa: EM101 (numba: a constant message)


@numba.njit(inline="always", fastmath=True)
def _one_block(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, g, c0, w, avx512, fused
):
    if fused:
        _block_fused(
            us,
            dts,
            bs,
            cs,
            a_log2,
            d,
            dt_w,
            dt_bias,
            reverse,
            xz,
            out,
            g,
            c0,
            w,
            avx512,
        )
    else:
        _block(
            us,
            dts,
            bs,
            cs,
            a_log2,
            d,
            dt_w,
            dt_bias,
            reverse,
            xz,
            out,
            g,
            c0,
            w,
            avx512,
        )


@numba.njit(inline="always", fastmath=True)
def _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, avx512, fused):
    if fused:
        _check_strides(us, dts, bs, cs, dt_w, dt_bias)
    n_seq, n_chan = out.shape[0], out.shape[2]
    n_block = (n_chan + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    for item in numba.prange(n_seq * n_block):
        g = item // n_block
        c0 = (item % n_block) * CHANNEL_BLOCK
        # a constant width for full blocks lets LLVM unroll the channel loops
        if c0 + CHANNEL_BLOCK <= n_chan:
            _one_block(
                us,
                dts,
                bs,
                cs,
                a_log2,
                d,
                dt_w,
                dt_bias,
                reverse,
                xz,
                out,
                g,
                c0,
                CHANNEL_BLOCK,
                avx512,
                fused,
            )
        else:
            _one_block(
                us,
                dts,
                bs,
                cs,
                a_log2,
                d,
                dt_w,
                dt_bias,
                reverse,
                xz,
                out,
                g,
                c0,
                n_chan - c0,
                avx512,
                fused,
            )


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_blocked(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out
) -> None:
    """:func:`.kernels.scan_gated`, recurrence in portable 16-lane vectors."""
    _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, False, False)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_blocked_avx512(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out
) -> None:
    """:func:`scan_gated_blocked` with AVX-512 exp steps; call only where avx512f."""
    _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, True, False)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_fused(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out
) -> None:
    """:func:`scan_gated_blocked` with delta, delta * u, B and C inside the vector
    code (:func:`.simd.fused16`); u, dt, B, C rows must be contiguous floats."""
    _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, False, True)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_fused_avx512(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out
) -> None:
    """:func:`scan_gated_fused` with AVX-512 exp steps; call only where avx512f."""
    _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, True, True)


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
        if "avx512f" in (cpu_flags() or ()):
            found["blocked-avx512"] = scan_gated_blocked_avx512
            found["fused-avx512"] = scan_gated_fused_avx512
    return found


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
