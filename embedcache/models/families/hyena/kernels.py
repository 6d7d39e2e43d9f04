"""Compiled CPU kernels (numba) for the HyenaDNA backbone; imported only when one runs.

Four kernels cover everything between the matmuls and the FFTs:

- ``short_conv_gate``: the in_proj bias, the depthwise causal convolution (width 3)
  of the ``x1`` and ``v`` channels and the first gate ``v * x1``, from in_proj's
  output channels-first, (3d, b L) as its one matmul writes it, into the FFT's input (the caller's buffer keeps
  the zero padding: the kernel writes the first L positions only);
- ``gate_out``: ``(y + v * D) * x0`` from the FFT convolution's output, with ``x0``
  convolved again from in_proj's output (3 taps cost less than writing ``x0`` out
  and reading it back), written (d, b L) as out_proj's transposed input;
- ``gelu_tanh``: fc1's bias and the tanh GELU in place (torch's GELU alone took
  ~2 ns an element here);
- ``add_norm``: a branch and its bias added to the residual stream, then the next
  LayerNorm, written in the next matmul's dtype.

The matmuls run without their biases (with one, ``addmm`` first copies it over the
whole output); each bias is added by the kernel that reads the matmul's output. In
bfloat16 the kernels read and write bfloat16 bits (int16) themselves, in float32
inside. The loops run along contiguous memory and vectorise: the convolution reads
its taps through shifted slices, never ``t - 1`` (numba wraps a negative index, and
that check kept main's loops scalar: 12 ms a call where 1 ms does). Work is split
with ``prange`` over (sequence, channel) or blocks of 64 rows.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import overload

# the bfloat16 load/store helpers and the vectorisable exp are Caduceus's: one
# definition of the rounding and of the polynomial
from embedcache.models.families.caduceus.kernels import (
    _bf16_bits,
    _exp2,
    _load,
    _store_row,
)
from embedcache.models.shared import kernel_cache

kernel_cache.track(__name__)  # the cached kernels go stale with Caduceus's helpers

ROW_BLOCK = 64
_LOG2E = 1.4426950408889634
_GELU_A = 0.7978845608028654  # sqrt(2 / pi)
_GELU_B = 0.044715


def _store(like, x):  # noqa: ANN001, ANN202
    """``x`` (float32) as an element of ``like``'s array: float32, or bfloat16 bits."""


@overload(_store, inline="always", jit_options={"fastmath": True})
def _store_impl(like, x):  # noqa: ANN001, ANN202
    if isinstance(like, types.Float):
        return lambda like, x: np.float32(x)
    return lambda like, x: _bf16_bits(x)


@numba.njit(inline="always", fastmath=True)
def _conv_head(src, src_bias, w, b, t):  # noqa: ANN001, ANN202
    """The convolution at ``t`` = 0 or 1: zeros (not ``src_bias``) before the start,
    as the padded convolution has."""
    acc = b + w[2] * (_load(src[t]) + src_bias)
    if t == 1:
        acc += w[1] * (_load(src[0]) + src_bias)
    return acc


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def short_conv_gate(z, z_bias, weight, bias, v_out) -> None:  # noqa: ANN001
    """``v_out[:, c, :L] = conv(z)[:, 2d + c] * conv(z)[:, d + c]``.

    ``z`` (3d, B L) float32 or bfloat16 bits (int16): the in_proj matmul, sequence
    ``g`` at columns ``g L`` to ``(g + 1) L``, to which ``z_bias`` (3d,) is added here; ``weight`` (3d, 3): tap ``j`` multiplies
    ``z[t - 2 + j]``; ``bias`` (3d,); ``v_out`` (B, d, n >= L) float32.
    """
    n_seq, d = v_out.shape[:2]
    length = z.shape[1] // n_seq
    for item in numba.prange(n_seq * d):
        c = item // n_seq  # along a row of z: its sequences are adjacent
        g = item % n_seq
        b, e = d + c, 2 * d + c  # x1's and v's channels
        cols = slice(g * length, (g + 1) * length)
        xs, vs, out = z[b, cols], z[e, cols], v_out[g, c]
        wb, we = weight[b], weight[e]
        for t in range(min(2, length)):
            out[t] = _conv_head(vs, z_bias[e], we, bias[e], t) * _conv_head(
                xs, z_bias[b], wb, bias[b], t
            )
        # the bias of the input folded into a constant; the taps as shifted slices
        kb = bias[b] + z_bias[b] * (wb[0] + wb[1] + wb[2])
        ke = bias[e] + z_bias[e] * (we[0] + we[1] + we[2])
        x2, x1, x0 = xs[2:], xs[1 : length - 1], xs[: max(length - 2, 0)]
        v2, v1, v0 = vs[2:], vs[1 : length - 1], vs[: max(length - 2, 0)]
        dst = out[2:length]
        for t in range(length - 2):
            xv = kb + wb[2] * _load(x2[t]) + wb[1] * _load(x1[t]) + wb[0] * _load(x0[t])
            vv = ke + we[2] * _load(v2[t]) + we[1] * _load(v1[t]) + we[0] * _load(v0[t])
            dst[t] = vv * xv


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def gate_out(y, v, z, z_bias, weight, bias, d_bias, out) -> None:  # noqa: ANN001
    """``out = (y + v * D) * x0``, channels-first, ``x0`` = ``conv(z)[:d]``.

    ``y`` (B, d, n >= L) float32: the FFT convolution; ``v`` (B, d, n) float32: its
    input; ``z``, ``z_bias``, ``weight``, ``bias`` as for :func:`short_conv_gate`;
    ``d_bias`` (d,); ``out`` (d, B L) float32 or bfloat16 bits (int16).
    """
    n_seq, d = y.shape[:2]
    length = z.shape[1] // n_seq
    for item in numba.prange(n_seq * d):
        c = item // n_seq  # along a row of z: its sequences are adjacent
        g = item % n_seq
        cols = slice(g * length, (g + 1) * length)
        xs, yr, vr, o = z[c, cols], y[g, c], v[g, c], out[c, cols]
        w, dc = weight[c], d_bias[c]
        for t in range(min(2, length)):
            x0 = _conv_head(xs, z_bias[c], w, bias[c], t)
            o[t] = _store(o[t], (yr[t] + vr[t] * dc) * x0)
        k = bias[c] + z_bias[c] * (w[0] + w[1] + w[2])
        x2, x1, x0s = xs[2:], xs[1 : length - 1], xs[: max(length - 2, 0)]
        y2, v2, dst = yr[2:length], vr[2:length], o[2:]
        for t in range(length - 2):
            x0 = k + w[2] * _load(x2[t]) + w[1] * _load(x1[t]) + w[0] * _load(x0s[t])
            dst[t] = _store(dst[t], (y2[t] + v2[t] * dc) * x0)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def gelu_tanh(x, bias) -> None:  # noqa: ANN001
    """In place: ``x = gelu(x + bias)``, the tanh GELU.

    ``0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))`` is computed as the same
    function ``h / (1 + exp(-2 a))`` with the vectorisable :func:`_exp2`. ``x``
    (rows, cols) float32 or bfloat16 bits (int16); ``bias`` (cols,) float32.
    """
    n_rows, n_cols = x.shape
    n_block = (n_rows + ROW_BLOCK - 1) // ROW_BLOCK
    for item in numba.prange(n_block):
        tmp = np.empty(n_cols, dtype=np.float32)
        for r in range(item * ROW_BLOCK, min((item + 1) * ROW_BLOCK, n_rows)):
            row = x[r]
            for c in range(n_cols):
                h = _load(row[c]) + bias[c]
                a = np.float32(_GELU_A) * (h + np.float32(_GELU_B) * h * h * h)
                e = -np.float32(2.0 * _LOG2E) * a
                e = min(max(e, np.float32(-126.0)), np.float32(126.0))
                tmp[c] = h / (np.float32(1.0) + _exp2(e))
            _store_row(tmp, row)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def add_norm(x, y, y_bias, weight, bias, eps, out) -> None:  # noqa: ANN001
    """In place ``x += y + y_bias``, then ``out = LayerNorm(x) * weight + bias``.

    ``x`` (rows, d) float32, the residual stream; ``y`` (rows, d) float32 or bfloat16
    bits, or empty (no add); ``out`` (rows, d) float32 or bfloat16 bits, or empty (no
    norm). Mean and variance in float32, as torch's LayerNorm.
    """
    n_rows, d = x.shape
    add, norm = y.size > 0, out.size > 0
    n_block = (n_rows + ROW_BLOCK - 1) // ROW_BLOCK
    for item in numba.prange(n_block):
        tmp = np.empty(d, dtype=np.float32)
        for r in range(item * ROW_BLOCK, min((item + 1) * ROW_BLOCK, n_rows)):
            row = x[r]
            if add:
                y_row = y[r]
                for c in range(d):
                    row[c] += _load(y_row[c]) + y_bias[c]
            if norm:
                total = np.float32(0.0)
                for c in range(d):
                    total += row[c]
                mean = total / d
                total = np.float32(0.0)
                for c in range(d):
                    dev = row[c] - mean
                    tmp[c] = dev
                    total += dev * dev
                scale = np.float32(1.0) / np.sqrt(total / d + eps)
                for c in range(d):
                    tmp[c] = tmp[c] * scale * weight[c] + bias[c]
                _store_row(tmp, out[r])


__all__ = ["add_norm", "gate_out", "gelu_tanh", "short_conv_gate"]
