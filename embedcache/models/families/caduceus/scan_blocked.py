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

import numba
import numpy as np

from embedcache.models.families.caduceus.kernels import (
    _load,
    _silu,
    _softplus,
    _store_row,
)
from embedcache.models.families.caduceus.simd import LANES, N_STATE, recur16

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


@numba.njit(inline="always", fastmath=True)
def _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, avx512):
    n_seq, n_chan = out.shape[0], out.shape[2]
    n_block = (n_chan + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    for item in numba.prange(n_seq * n_block):
        g = item // n_block
        c0 = (item % n_block) * CHANNEL_BLOCK
        if c0 + CHANNEL_BLOCK <= n_chan:
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
                CHANNEL_BLOCK,
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
                n_chan - c0,
                avx512,
            )


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_blocked(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out
) -> None:
    """:func:`.kernels.scan_gated`, recurrence in portable 16-lane vectors."""
    _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, False)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated_blocked_avx512(
    us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out
) -> None:
    """:func:`scan_gated_blocked` with AVX-512 exp steps; call only where avx512f."""
    _scan(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, True)
