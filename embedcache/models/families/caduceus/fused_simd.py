"""The fused scan's vector code: :func:`fused16`, one call per 16 channels and
block of steps (see :mod:`.scan_blocked`'s ``fused`` candidates).

Built from :mod:`.simd`'s 16-lane pieces (the exps, the loop, the recurrence): a
first loop stages delta, delta * u and D * u (and silu(z) in the last direction),
then the recurrence adds each step's output into a float32 row buffer, or gates it
and writes the output in the last direction, while it prefetches the block that
runs next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from embedcache.models.families.caduceus.kernels import LOG2E32
from embedcache.models.families.caduceus.simd import (
    _F32,
    _I16,
    _I32,
    _I64,
    _VF,
    _VI,
    DECAY_EXP2_COEF32,
    DECAY_EXP2_COEF32_BF16,
    GATE_EXP2_COEF32,
    LANES,
    N_STATE,
    _at,
    _broadcast,
    _call,
    _emit_loop,
    _emit_recurrence,
    _emit_softplus,
    _exp2,
    _load_bf16_vector,
    _load_vector,
    _splat,
    _vector_at,
)

MAX_STEPS = 64  # fused16's stack buffer: steps per call at most
_GROUP = 8  # steps whose dt projections fused16 sums side by side (divides MAX_STEPS)


def _min(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return builder.select(builder.icmp_signed("<", x, y), x, y)


def _emit_silu(builder: ir.IRBuilder, z: ir.Value) -> ir.Value:
    """``z / (1 + 2**(-z log2 e))`` on 16 lanes, the exponent clamped to +-126."""
    x = _call(builder, "llvm.minnum", builder.fmul(z, _splat(-LOG2E32)), _splat(126.0))
    e = _exp2(builder, x, avx512=False, coefs=GATE_EXP2_COEF32)
    gate = builder.fdiv(z, builder.fadd(_splat(1.0), e))
    gate.flags.append("fast")  # a reciprocal estimate and a Newton step
    return gate


def _store_bf16_vector(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    """16 float32 as bfloat16 bits at ``ptr``, rounded to nearest even (as torch)."""
    bits = builder.bitcast(value, _VI)
    odd = builder.and_(builder.lshr(bits, _splat(16, _VI)), _splat(1, _VI))
    rounded = builder.add(builder.add(bits, _splat(0x7FFF, _VI)), odd)
    vi16 = ir.VectorType(_I16, LANES)
    half = builder.trunc(builder.lshr(rounded, _splat(16, _VI)), vi16)
    builder.store(half, builder.bitcast(ptr, vi16.as_pointer()), align=2)


def _prefetch(builder: ir.IRBuilder, ptr: ir.Value) -> None:
    """Ask for the cache line at ``ptr`` (a hint: never faults, even out of bounds)."""
    i8p = ir.IntType(8).as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    read, keep, data = (ir.Constant(_I32, v) for v in (0, 3, 1))
    builder.call(fn, [builder.bitcast(ptr, i8p), read, keep, data])


@dataclass(frozen=True)
class FusedMode:
    """What :func:`fused16` compiles for: the exp steps and the bfloat16-ness of z
    and out (int16 bits). Which direction it runs is a runtime flag: one copy of
    the code per kernel, not one per direction (each copy is minutes of LLVM time
    across the suite's kernels), for two predictable branches a step."""

    avx512: bool
    z_bf16: bool
    out_bf16: bool


def _emit_fused(builder: ir.IRBuilder, args: list[ir.Value], mode: FusedMode) -> None:
    """:func:`fused16`. A first loop computes, per step, delta (dt projection +
    softplus), delta * u, D * u (and, in the last direction, silu(z)) into stack
    buffers; its steps do not wait on each other, so their latencies overlap and none
    sits on the recurrence's path. Then the recurrence, which adds ``sum + D u`` into
    ``y`` (the last direction: gates it and writes ``out``) and meanwhile asks for
    the next block's rows: without that the strided loads of the first loop stall it,
    a third of the time at Caduceus-ph's shape."""
    (state_a, a_a, dt_a, b_a, c_a, row_step, u_a, u_step, w_a, w_stride, n_rank,
     bias_a, d_a, y_a, y_step, z_a, z_step, out_a, out_step, n_steps, next_u_a,
     next_u_step, next_dt_a, next_b_a, next_c_a, next_row_step, next_z_a,
     next_z_step, first_flag, last_flag) = args  # fmt: skip
    zero = ir.Constant(_I64, 0)
    first = builder.icmp_signed("!=", first_flag, zero)
    last = builder.icmp_signed("!=", last_flag, zero)
    pv, pf = _VF.as_pointer(), _F32.as_pointer()
    dt_p, b_p, c_p, u_p, w_p, y_p = (
        builder.inttoptr(x, pf) for x in (dt_a, b_a, c_a, u_a, w_a, y_a)
    )
    z_p = builder.inttoptr(z_a, (_I16 if mode.z_bf16 else _F32).as_pointer())
    next_u_p, next_dt_p, next_b_p, next_c_p = (
        builder.inttoptr(x, pf) for x in (next_u_a, next_dt_a, next_b_a, next_c_a)
    )
    next_z_p = builder.inttoptr(next_z_a, z_p.type)
    out_p = builder.inttoptr(out_a, (_I16 if mode.out_bf16 else _F32).as_pointer())
    bias = builder.load(builder.inttoptr(bias_a, pv), align=4)
    d = builder.load(builder.inttoptr(d_a, pv), align=4)
    size = ir.Constant(_I64, MAX_STEPS)
    deltas, dus, skips, gates = (
        cgutils.alloca_once(builder, _VF, size=size) for _ in range(4)
    )

    # the dt projection, GROUP steps at a time: one step's sum of n_rank products
    # alone is a chain of dependent FMAs (four cycles each) that no reordering hides
    last_step = builder.sub(n_steps, ir.Constant(_I64, 1))
    n_groups = builder.udiv(
        builder.add(n_steps, ir.Constant(_I64, _GROUP - 1)), ir.Constant(_I64, _GROUP)
    )

    def project(gi: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
        start = builder.mul(gi, ir.Constant(_I64, _GROUP))
        steps = [builder.add(start, ir.Constant(_I64, j)) for j in range(_GROUP)]
        # a short last group repeats the last step (its buffers have room)
        rows = [
            _at(builder, dt_p, builder.mul(_min(builder, i, last_step), row_step))
            for i in steps
        ]

        def rank(k: ir.Value, sums: list[ir.Value]) -> list[ir.Value]:
            w_k = _load_vector(builder, w_p, builder.mul(k, w_stride))
            return [
                _call(
                    builder,
                    "llvm.fma",
                    w_k,
                    _broadcast(builder, builder.load(_at(builder, row, k))),
                    total,
                )
                for row, total in zip(rows, sums, strict=True)
            ]

        sums = _emit_loop(builder, n_rank, [bias] * _GROUP, rank, "rank")
        for i, total in zip(steps, sums, strict=True):
            builder.store(total, _at(builder, deltas, i))
        return []

    _emit_loop(builder, n_groups, [], project, "project")

    def prepare(i: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
        pre = builder.load(_at(builder, deltas, i))
        delta = _emit_softplus(builder, pre, avx512=mode.avx512, coefs=GATE_EXP2_COEF32)
        u = _load_vector(builder, u_p, builder.mul(i, u_step))
        builder.store(delta, _at(builder, deltas, i))
        builder.store(builder.fmul(delta, u), _at(builder, dus, i))
        builder.store(builder.fmul(d, u), _at(builder, skips, i))
        with builder.if_then(last, likely=False):
            load_z = _load_bf16_vector if mode.z_bf16 else _load_vector
            z = load_z(builder, z_p, builder.mul(i, z_step))
            builder.store(_emit_silu(builder, z), _at(builder, gates, i))
        return []

    _emit_loop(builder, n_steps, [], prepare, "prepare")

    def row_inputs(i: ir.Value) -> tuple[Any, ...]:
        row = builder.mul(i, row_step)
        # the rows of the block the caller runs next (this direction's next block,
        # or the next direction's first), while this one computes
        _prefetch(builder, _at(builder, next_u_p, builder.mul(i, next_u_step)))
        next_row = builder.mul(i, next_row_step)
        for where in (0, builder.sub(n_rank, ir.Constant(_I64, 1))):
            _prefetch(builder, _at(builder, _at(builder, next_dt_p, next_row), where))
        for bc in (next_b_p, next_c_p):
            _prefetch(builder, _at(builder, bc, next_row))
            _prefetch(builder, _at(builder, _at(builder, bc, next_row), N_STATE - 1))
        _prefetch(builder, _at(builder, next_z_p, builder.mul(i, next_z_step)))

        def into_y(total: ir.Value) -> None:
            y_row = _vector_at(builder, y_p, builder.mul(i, y_step))
            value = builder.fadd(total, builder.load(_at(builder, skips, i)))
            # the first direction's y holds anything: selected away, never summed
            summed = builder.fadd(builder.load(y_row, align=4), value)
            value = builder.select(first, value, summed)
            with builder.if_else(last) as (gate, keep):
                with gate:
                    gated = builder.fmul(value, builder.load(_at(builder, gates, i)))
                    out_row = _at(builder, out_p, builder.mul(i, out_step))
                    if mode.out_bf16:
                        _store_bf16_vector(builder, gated, out_row)
                    else:
                        builder.store(gated, builder.bitcast(out_row, pv), align=4)
                with keep:
                    builder.store(value, y_row, align=4)

        return (
            builder.load(_at(builder, deltas, i)),
            builder.load(_at(builder, dus, i)),
            _at(builder, b_p, row),
            _at(builder, c_p, row),
            into_y,
        )

    _emit_recurrence(
        builder,
        (state_a, a_a, n_steps),
        row_inputs,
        avx512=mode.avx512,
        coefs=DECAY_EXP2_COEF32_BF16 if mode.out_bf16 else DECAY_EXP2_COEF32,
        n_sums=4,
    )


@intrinsic
def fused16(
    typingctx: Any,  # noqa: ANN401 (numba intrinsic protocol)
    addresses: types.Type,
    xz: types.Type,
    out: types.Type,
    avx512: types.Type,
) -> Any:  # noqa: ANN401
    """The scan of 16 channels over ``n_steps`` steps. ``addresses``: a tuple of
    addresses and strides (in elements, negative when time runs backwards)::

        state, a, dt, b, c, row_step, u, u_step, w, w_stride, n_rank, bias,
        d, y, y_step, z, z_step, out, out_step, n_steps,
        next_u, next_u_step, next_dt, next_b, next_c, next_row_step,
        next_z, next_z_step, first, last

    then the arrays z and the output are read from (for their dtypes), then a
    literal bool. ``delta = softplus(bias + sum_k w[k] dt[k])`` (``w`` rows
    ``w_stride`` floats apart; dt, B and C: x_proj rows ``row_step`` floats apart),
    the recurrence, and ``y (+)= sum_n s_n C_n + d u`` (``y`` float32; ``=`` when
    ``first``); when ``last``, ``out = y * silu(z)`` instead of writing y (both
    directions share z: their in_proj is tied). The exps are
    :data:`DECAY_EXP2_COEF32` (:data:`DECAY_EXP2_COEF32_BF16` for a bfloat16 output)
    and :data:`GATE_EXP2_COEF32`'s polynomials, not the loop kernel's: the output
    differs from it within the output dtype's tolerance, not bit for bit.
    ``avx512``: ``vreduceps`` and ``vscalefps`` in the decays' exp (no clamp needed),
    else float adds and integer ops (:func:`_exp2_magic`). At most
    :data:`MAX_STEPS` steps a call.
    """
    if not isinstance(avx512, types.BooleanLiteral):
        return None
    mode = FusedMode(
        bool(avx512.literal_value),
        z_bf16=isinstance(xz.dtype, types.Integer),
        out_bf16=isinstance(out.dtype, types.Integer),
    )

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:  # noqa: ANN401
        values = cgutils.unpack_tuple(builder, args[0])
        _emit_fused(builder, list(values), mode)
        return context.get_dummy_value()

    return types.void(addresses, xz, out, avx512), codegen
