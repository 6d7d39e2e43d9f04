"""Compiled CPU kernels (numba) for the Caduceus backbone; imported only when one runs.

Three kernels cover everything but the in, x and out projections: ``add_rms_norm``
(residual add + RMSNorm, with the RCPS frame swap), ``conv_silu`` (depthwise
convolution + SiLU) and ``scan_gated`` (dt projection, softplus, the selective scan,
the D skip, the ``silu(z)`` gate and the sum of the two directions). Fusing them
avoids a dozen passes over (tokens x d_inner) tensors; in bfloat16 they read and
write bfloat16 bits themselves, so no conversion pass sits between matmuls.

The scan splits work over (sequence, block of 64 channels) with ``prange``; each item
keeps its state (d_state x 64 floats) in L1, walks the sequence once per direction
and writes its slice of the output, so items never share memory. Inner loops run over
contiguous channels so LLVM vectorises them. That needs ``exp`` as plain arithmetic
(numba has no vector ``exp`` without Intel's SVML), hence :func:`_exp2`, a
range-reduced polynomial accurate to about one float32 ulp.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

CHANNEL_BLOCK = 64
TIME_BLOCK = 64
_LN2 = math.log(2.0)
_LOG2E = 1.0 / _LN2
_EXP2_COEF = tuple(_LN2**i / math.factorial(i) for i in range(8))
# the same coefficients rounded to float32, as the kernels use them
EXP2_COEF32 = tuple(float(np.float32(c)) for c in _EXP2_COEF)
LOG2E32 = float(np.float32(_LOG2E))
# _softplus's odd series in s**2, highest power first, as float32
SERIES32 = tuple(float(np.float32(1.0 / k)) for k in (13, 11, 9, 7, 5, 3, 1))


@intrinsic
def _bits_to_float(typingctx, bits):  # noqa: ANN001, ANN202 (numba intrinsic protocol)
    """Reinterpret an int32 as float32 (builds 2**k from its exponent bits)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _float_to_bits(typingctx, value):  # noqa: ANN001, ANN202 (numba intrinsic protocol)
    """Reinterpret a float32 as int32 (reads exponent and mantissa for the log)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@numba.njit(inline="always", fastmath=True)
def _exp2(x):  # noqa: ANN001, ANN202
    """2**x for x in [-126, 127]: 2**round(x) from exponent bits times a Taylor 2**f."""
    k = np.rint(x)
    f = x - k
    # 2**f = exp(f ln2), |f ln2| <= ln(2)/2: degree 7 is below one ulp; ln2**i / i!
    # is folded into the coefficients
    q = np.float32(_EXP2_COEF[7]) * f + np.float32(_EXP2_COEF[6])
    q = q * f + np.float32(_EXP2_COEF[5])
    q = q * f + np.float32(_EXP2_COEF[4])
    q = q * f + np.float32(_EXP2_COEF[3])
    q = q * f + np.float32(_EXP2_COEF[2])
    q = q * f + np.float32(_EXP2_COEF[1])
    q = q * f + np.float32(1.0)
    return q * _bits_to_float((np.int32(k) + np.int32(127)) << 23)


@numba.njit(inline="always", fastmath=True)
def _silu(z):  # noqa: ANN001, ANN202
    x = min(max(-z * np.float32(_LOG2E), np.float32(-126.0)), np.float32(126.0))
    return z / (np.float32(1.0) + _exp2(x))


@numba.njit(inline="always", fastmath=True)
def _softplus(x):  # noqa: ANN001, ANN202
    """log(1 + exp(x)) as torch computes it (x itself above 20), to about 1 ulp.

    ``max(x, 0) + log1p(e)`` with ``e = exp(-|x|)`` in (0, 1] and
    ``log1p(e) = 2 atanh(s)``, ``s = e / (2 + e)`` in (0, 1/3]: an odd series with no
    cancellation, so fastmath's reassociation cannot hurt it (Kahan's log1p trick,
    which relies on ``(1 + e) - 1`` not being simplified, does not survive it).
    """
    e = _exp2(max(-abs(x) * np.float32(_LOG2E), np.float32(-126.0)))
    s = e / (np.float32(2.0) + e)
    s2 = s * s
    series = np.float32(1.0 / 13.0) * s2 + np.float32(1.0 / 11.0)
    series = series * s2 + np.float32(1.0 / 9.0)
    series = series * s2 + np.float32(1.0 / 7.0)
    series = series * s2 + np.float32(1.0 / 5.0)
    series = series * s2 + np.float32(1.0 / 3.0)
    series = series * s2 + np.float32(1.0)
    result = max(x, np.float32(0.0)) + np.float32(2.0) * s * series
    return x if x > np.float32(20.0) else result


def _load(x):  # noqa: ANN001, ANN202
    """A float32 from a float32, or from bfloat16 bits held in an int16."""


@overload(_load, inline="always", jit_options={"fastmath": True})
def _load_impl(x):  # noqa: ANN001, ANN202
    if isinstance(x, types.Float):
        return lambda x: np.float32(x)
    # bfloat16 is the top half of a float32
    return lambda x: _bits_to_float((np.int32(x) & np.int32(0xFFFF)) << 16)


@numba.njit(inline="always", fastmath=True)
def _bf16_bits(v):  # noqa: ANN001, ANN202
    """float32 -> bfloat16 bits (int16), rounding to nearest even as torch does."""
    bits = _float_to_bits(v)
    bits = bits + np.int32(0x7FFF) + ((bits >> 16) & np.int32(1))
    return np.int16(bits >> 16)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def conv_silu(xz, weight, bias, reverse, out, out_bf16) -> None:  # noqa: ANN001
    """``out = silu(depthwise_conv(x))`` with x = ``xz[..., :Di]``.

    Causal (``out[t]`` sees ``x[t-K+1 .. t]``, tap ``K-1`` on ``x[t]``) or, when
    ``reverse``, anti-causal (tap ``K-1`` on ``x[t]``, tap 0 on ``x[t+K-1]``): the
    official reverse Mamba's causal conv over the flipped sequence, not flipped.
    Shapes: ``xz`` (G, L, 2Di) float32 or bfloat16 bits (int16); ``weight`` (K, Di);
    ``bias`` (Di,); ``out`` (G, L, Di) float32; ``out_bf16``: the same as bfloat16
    bits, for the next matmul, or an empty array to skip it.
    """
    n_seq, length, n_chan = out.shape
    n_tap = weight.shape[0]
    n_block = (length + TIME_BLOCK - 1) // TIME_BLOCK
    also_bf16 = out_bf16.size > 0
    for item in numba.prange(n_seq * n_block):
        g = item // n_block
        t0 = (item % n_block) * TIME_BLOCK
        acc = np.empty(n_chan, dtype=np.float32)
        for t in range(t0, min(t0 + TIME_BLOCK, length)):
            for ci in range(n_chan):
                acc[ci] = bias[ci]
            for j in range(n_tap):
                src = t + n_tap - 1 - j if reverse else t - n_tap + 1 + j
                if 0 <= src < length:
                    x_row = xz[g, src, :n_chan]
                    w_row = weight[j]
                    for ci in range(n_chan):
                        acc[ci] += w_row[ci] * _load(x_row[ci])
            out_row = out[g, t]
            for ci in range(n_chan):
                out_row[ci] = _silu(acc[ci])
            if also_bf16:
                row16 = out_bf16[g, t]
                for ci in range(n_chan):
                    row16[ci] = _bf16_bits(out_row[ci])


@numba.njit(inline="always", fastmath=True)
def _scan_block(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out, g, c0, w):  # noqa: ANN001, ANN202
    """Scan channels ``c0 .. c0+w`` of sequence ``g`` in every direction.

    Inlined twice by :func:`scan_gated`, once with ``w`` the constant
    ``CHANNEL_BLOCK``: a known trip count lets LLVM unroll the channel loops and keep
    the accumulators in registers (about 15% faster).
    """
    length, n_chan = out.shape[1], out.shape[2]
    n_state = a_log2.shape[1]
    state = np.empty((n_state, w), dtype=np.float32)
    y = np.zeros((length, w), dtype=np.float32)
    acc = np.empty(w, dtype=np.float32)
    du = np.empty(w, dtype=np.float32)
    delta_row = np.empty(w, dtype=np.float32)
    n_rank = dt_w.shape[1]
    for p in range(len(us)):
        u, dt, b, c = us[p], dts[p], bs[p], cs[p]
        d_row = d[p, c0 : c0 + w]
        bias_row = dt_bias[p, c0 : c0 + w]
        state[:] = 0.0
        for step in range(length):
            t = length - 1 - step if reverse[p] else step
            u_row = u[g, t, c0 : c0 + w]
            # dt_proj (rank 16 -> channels) here: as a torch matmul this thin
            # product ran at a tenth of the machine's matmul rate
            for ci in range(w):
                delta_row[ci] = bias_row[ci]
            for k in range(n_rank):
                dt_k = dt[g, t, k]
                w_row = dt_w[p, k, c0 : c0 + w]
                for ci in range(w):
                    delta_row[ci] += w_row[ci] * dt_k
            for ci in range(w):
                delta_row[ci] = _softplus(delta_row[ci])
            for ci in range(w):
                acc[ci] = 0.0
                du[ci] = delta_row[ci] * u_row[ci]
            for n in range(n_state):
                b_n = b[g, t, n]
                c_n = c[g, t, n]
                a_row = a_log2[p, n, c0 : c0 + w]
                s_row = state[n]
                for ci in range(w):
                    # delta * A <= 0; below 2**-126 the decay is 0 for our purpose
                    decay = _exp2(max(delta_row[ci] * a_row[ci], np.float32(-126.0)))
                    s = decay * s_row[ci] + du[ci] * b_n
                    s_row[ci] = s
                    acc[ci] += s * c_n
            z_row = xz[g, t, n_chan + c0 : n_chan + c0 + w]
            y_row = y[t]
            for ci in range(w):
                gate = _silu(_load(z_row[ci]))
                y_row[ci] += (acc[ci] + d_row[ci] * u_row[ci]) * gate
    for t in range(length):
        _store_row(y[t], out[g, t, c0 : c0 + w])


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def scan_gated(us, dts, bs, cs, a_log2, d, dt_w, dt_bias, reverse, xz, out) -> None:  # noqa: ANN001
    """``out = sum_p (scan_p(u_p) + D_p * u_p) * silu(z)`` with z = ``xz[..., Di:]``.

    ``us``: tuple of P (G, L, Di) float32 arrays; ``dts``, ``bs``, ``cs``: tuples of P
    (G, L, R) and (G, L, N) arrays (any strides), the x_proj outputs; the step size
    ``delta = softplus(dt_w @ dt + dt_bias)`` is computed here, with ``dt_w`` (P, R, Di)
    the transposed dt_proj weight and ``dt_bias`` (P, Di); ``a_log2`` (P, N, Di)
    = A * log2(e); ``d`` (P, Di); ``reverse`` (P,) bool; ``xz`` (G, L, 2Di) float32
    or bfloat16 bits (int16); ``out`` (G, L, Di) float32 or bfloat16 bits. The sum
    over directions is kept in float32 and rounded once.
    """
    n_seq, n_chan = out.shape[0], out.shape[2]
    n_block = (n_chan + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    for item in numba.prange(n_seq * n_block):
        g = item // n_block
        c0 = (item % n_block) * CHANNEL_BLOCK
        if c0 + CHANNEL_BLOCK <= n_chan:
            _scan_block(
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
            )
        else:
            _scan_block(
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
            )


def _store_row(src, dst):  # noqa: ANN001, ANN202
    """Copy float32 ``src`` into ``dst`` (float32, or bfloat16 bits as int16)."""


@overload(_store_row, inline="always", jit_options={"fastmath": True})
def _store_row_impl(src, dst):  # noqa: ANN001, ANN202
    if isinstance(dst.dtype, types.Float):

        def store(src, dst):  # noqa: ANN001, ANN202
            for i in range(src.shape[0]):
                dst[i] = src[i]

        return store

    def store_bf16(src, dst):  # noqa: ANN001, ANN202
        for i in range(src.shape[0]):
            dst[i] = _bf16_bits(src[i])

    return store_bf16


ROW_BLOCK = 32


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def add_rms_norm(hidden, residual, weight, eps, swap, res_out, norm_out) -> None:  # noqa: ANN001
    """Mamba's add + RMSNorm: ``res_out = hidden + residual``, ``norm_out = rms(res_out)``.

    ``hidden`` (G, L, d) float32 or bfloat16 bits; ``residual`` (G, L, d) float32, or
    an empty array for the first layer (no residual yet); ``weight`` (d,); ``swap``:
    the RCPS fused add+norm, which reads frame ``(g + G/2) % G`` at time ``L-1-t``,
    channel ``d-1-c``; ``res_out`` (G, L, d) float32; ``norm_out`` (G, L, d) float32
    or bfloat16 bits. Math in float32: ``x * (1 / sqrt(mean(x^2) + eps)) * weight``.
    """
    n_seq, length, dim = res_out.shape
    half = n_seq // 2
    has_residual = residual.size > 0
    n_rows = n_seq * length
    n_block = (n_rows + ROW_BLOCK - 1) // ROW_BLOCK
    for block in numba.prange(n_block):
        scratch = np.empty(dim, dtype=np.float32)
        for row in range(block * ROW_BLOCK, min((block + 1) * ROW_BLOCK, n_rows)):
            g, t = row // length, row % length
            out_row = res_out[g, t]
            if swap:
                gs, ts = (g + half) % n_seq, length - 1 - t
                h_row = hidden[gs, ts]
                for c in range(dim):
                    out_row[c] = _load(h_row[dim - 1 - c])
                if has_residual:
                    r_row = residual[gs, ts]
                    for c in range(dim):
                        out_row[c] += r_row[dim - 1 - c]
            else:
                h_row = hidden[g, t]
                for c in range(dim):
                    out_row[c] = _load(h_row[c])
                if has_residual:
                    r_row = residual[g, t]
                    for c in range(dim):
                        out_row[c] += r_row[c]
            total = np.float32(0.0)
            for c in range(dim):
                total += out_row[c] * out_row[c]
            rstd = np.float32(1.0) / np.sqrt(total / np.float32(dim) + np.float32(eps))
            for c in range(dim):
                scratch[c] = out_row[c] * rstd * weight[c]
            _store_row(scratch, norm_out[g, t])
