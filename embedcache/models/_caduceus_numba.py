"""The compiled CPU selective scan (numba); imported only when a CPU Caduceus runs.

Work is split over (direction, sequence, block of 64 channels) and spread over all
cores with ``prange``. Each work item keeps its state (d_state x 64 floats) in L1 and
walks the sequence once. The inner loop runs over contiguous channels so LLVM can
vectorise it; that needs ``exp`` as plain arithmetic (numba has no vector ``exp``
without Intel's SVML), hence the range-reduced polynomial below, accurate to about
one float32 ulp.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

CHANNEL_BLOCK = 64
_LN2 = math.log(2.0)


@intrinsic
def _bits_to_float(typingctx, bits):  # noqa: ANN001, ANN202 (numba intrinsic protocol)
    """Reinterpret an int32 as float32 (builds 2**k from its exponent bits)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def selective_scan(u, delta, b, c, a_log2, d, reverse, out) -> None:  # noqa: ANN001
    """Scan every (direction, sequence, channel block); results go to ``out``.

    Shapes: ``u``, ``delta``, ``out`` (P, G, L, Di); ``b``, ``c`` (P, G, L, N);
    ``a_log2`` (P, N, Di) = A * log2(e); ``d`` (P, Di); ``reverse`` (P,) bool.
    """
    n_dir, n_seq, length, n_chan = u.shape
    n_state = a_log2.shape[1]
    n_block = (n_chan + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    for item in numba.prange(n_dir * n_seq * n_block):
        p = item // (n_seq * n_block)
        g = (item // n_block) % n_seq
        c0 = (item % n_block) * CHANNEL_BLOCK
        w = min(CHANNEL_BLOCK, n_chan - c0)
        state = np.zeros((n_state, w), dtype=np.float32)
        acc = np.empty(w, dtype=np.float32)
        du = np.empty(w, dtype=np.float32)
        d_row = d[p, c0 : c0 + w]
        for step in range(length):
            t = length - 1 - step if reverse[p] else step
            delta_row = delta[p, g, t, c0 : c0 + w]
            u_row = u[p, g, t, c0 : c0 + w]
            for ci in range(w):
                acc[ci] = 0.0
                du[ci] = delta_row[ci] * u_row[ci]
            for n in range(n_state):
                b_n = b[p, g, t, n]
                c_n = c[p, g, t, n]
                a_row = a_log2[p, n, c0 : c0 + w]
                s_row = state[n]
                for ci in range(w):
                    # exp(delta * A) = 2**k * 2**f with k = round(x), |f| <= 1/2;
                    # delta * A <= 0, and below 2**-126 the factor is 0 for our purpose
                    x = max(delta_row[ci] * a_row[ci], np.float32(-126.0))
                    k = np.floor(x + np.float32(0.5))
                    f = (x - k) * np.float32(_LN2)
                    q = np.float32(1.0 / 5040.0) * f + np.float32(1.0 / 720.0)
                    q = q * f + np.float32(1.0 / 120.0)
                    q = q * f + np.float32(1.0 / 24.0)
                    q = q * f + np.float32(1.0 / 6.0)
                    q = q * f + np.float32(0.5)
                    q = q * f + np.float32(1.0)
                    q = q * f + np.float32(1.0)
                    decay = q * _bits_to_float((np.int32(k) + np.int32(127)) << 23)
                    s = decay * s_row[ci] + du[ci] * b_n
                    s_row[ci] = s
                    acc[ci] += s * c_n
            out_row = out[p, g, t, c0 : c0 + w]
            for ci in range(w):
                out_row[ci] = acc[ci] + d_row[ci] * u_row[ci]
