"""Compiled CPU kernels (numba) for the HyenaDNA backbone; imported only when one runs.

Four kernels cover everything between the matmuls and the FFTs:

- ``short_conv_gate``: the in_proj bias, the depthwise causal convolution (width 3)
  and the first gate, channels-first (in_proj's matmul writes that layout): ``x0``
  and ``v * x1``, zero-padded as the FFT's input;
- ``gate_out``: ``(y + v * D) * x0`` from the FFT convolution's output, transposed
  to channels-last as the out_proj input;
- ``gelu_tanh``: fc1's bias and the tanh GELU in place (torch's GELU alone took
  ~2 ns an element here);
- ``add_norm``: a branch and its bias added to the residual stream, then the next
  LayerNorm, written in the next matmul's dtype.

The matmuls run without their biases (with one, ``addmm`` first copies it over the
whole output); each bias is added by the kernel that reads the matmul's output. Each
kernel replaces several passes over (tokens x channels) tensors (the first two, also
a transpose). In bfloat16 they read and write bfloat16 bits (int16) themselves. Work
is split with ``prange`` over (sequence, channel), (sequence, block of 64 positions)
or blocks of 64 rows; ``gate_out`` transposes through a small tile per item.
"""

from __future__ import annotations

import numba
import numpy as np

# the bfloat16 load/store helpers and the vectorisable exp are Caduceus's: one
# definition of the rounding and of the polynomial
from embedcache.models.families.caduceus.kernels import _exp2, _load, _store_row

TIME_BLOCK = 64
ROW_BLOCK = 64
_LOG2E = 1.4426950408889634
_GELU_A = 0.7978845608028654  # sqrt(2 / pi)
_GELU_B = 0.044715


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def short_conv_gate(z, z_bias, weight, bias, x0_out, v_out) -> None:  # noqa: ANN001
    """``x0_out = conv(z)[:, :d]``, ``v_out = conv(z)[:, 2d:] * conv(z)[:, d:2d]``.

    Channels-first throughout, so every loop runs along contiguous positions.
    ``z`` (B, 3d, L) float32 or bfloat16 bits (int16): the in_proj matmul, to which
    ``z_bias`` (3d,) is added here; ``weight`` (3d, 3): tap ``j`` multiplies
    ``z[t - 2 + j]`` (zeros before the start: the bias is part of the input, the
    padding is not); ``bias`` (3d,); ``x0_out`` (B, d, L) float32; ``v_out``
    (B, d, n >= L) float32, zero from L on (the FFT's padding).
    """
    n_seq, n_chan, length = z.shape
    d = n_chan // 3
    n_fft = v_out.shape[2]
    for item in numba.prange(n_seq * d):
        g = item // d
        c = item % d
        x0_row = x0_out[g, c]
        v_row = v_out[g, c]
        a, b, e = c, d + c, 2 * d + c  # x0, x1 and v's channels
        _conv_row(z[g, a], z_bias[a], weight[a], bias[a], x0_row)
        _conv_row(z[g, e], z_bias[e], weight[e], bias[e], v_row)
        # x1's convolution, multiplied into v's row as it is computed
        src, sb, w, cb = z[g, b], z_bias[b], weight[b], bias[b]
        const = cb + sb * (w[0] + w[1] + w[2])
        v_row[0] *= cb + w[2] * (_load(src[0]) + sb)
        if length > 1:
            v_row[1] *= cb + w[2] * (_load(src[1]) + sb) + w[1] * (_load(src[0]) + sb)
        for t in range(2, length):
            v_row[t] *= (
                const
                + w[2] * _load(src[t])
                + w[1] * _load(src[t - 1])
                + w[0] * _load(src[t - 2])
            )
        for t in range(length, n_fft):
            v_row[t] = np.float32(0.0)


@numba.njit(inline="always", fastmath=True)
def _conv_row(src, src_bias, w, b, out) -> None:  # noqa: ANN001
    """``out[t] = b + sum_j w[j] (src[t - 2 + j] + src_bias)`` over ``t < len(src)``,
    with zeros (not ``src_bias``) before the start, as the padded convolution has."""
    length = src.shape[0]
    const = b + src_bias * (w[0] + w[1] + w[2])
    out[0] = b + w[2] * (_load(src[0]) + src_bias)
    if length > 1:
        out[1] = (
            b + w[2] * (_load(src[1]) + src_bias) + w[1] * (_load(src[0]) + src_bias)
        )
    for t in range(2, length):
        out[t] = (
            const
            + w[2] * _load(src[t])
            + w[1] * _load(src[t - 1])
            + w[0] * _load(src[t - 2])
        )


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def gate_out(y, v, x0, d_bias, out) -> None:  # noqa: ANN001
    """``out = ((y + v * D) * x0)``, transposed to channels-last.

    ``y`` (B, d, n) float32: the FFT convolution, of which the first L positions are
    used; ``v`` (B, d, n) float32; ``x0`` (B, d, L) float32; ``d_bias`` (d,);
    ``out`` (B, L, d) float32 or bfloat16 bits (int16).
    """
    n_seq, d, length = x0.shape
    n_block = (length + TIME_BLOCK - 1) // TIME_BLOCK
    for item in numba.prange(n_seq * n_block):
        g = item // n_block
        t0 = (item % n_block) * TIME_BLOCK
        t1 = min(t0 + TIME_BLOCK, length)
        tile = np.empty((d, TIME_BLOCK), dtype=np.float32)
        for c in range(d):
            y_row = y[g, c, t0:t1]
            v_row = v[g, c, t0:t1]
            x0_row = x0[g, c, t0:t1]
            tile_row = tile[c]
            dc = d_bias[c]
            for k in range(t1 - t0):
                tile_row[k] = (y_row[k] + v_row[k] * dc) * x0_row[k]
        row = np.empty(d, dtype=np.float32)
        for t in range(t0, t1):
            for c in range(d):
                row[c] = tile[c, t - t0]
            _store_row(row, out[g, t])


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


__all__ = ["TIME_BLOCK", "add_norm", "gate_out", "gelu_tanh", "short_conv_gate"]
