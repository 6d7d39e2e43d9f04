"""The scan's recurrence in explicit 16-lane vectors (LLVM IR via a numba intrinsic).

numba's own loops over channels vectorise, but keep the state in memory (a load and a
store per state vector per step) and rebuild slices and alias checks per state row.
Here 16 channels are one ``<16 x float>`` (one AVX-512 register, two AVX2 ones) and
the 16 state rows live in registers for a whole block of time steps::

    s_n = exp2(delta * a_n) * s_n + (delta * u) * B_n      n = 0 .. 15
    acc = sum_n s_n * C_n

The exp is the kernels' own :func:`.kernels._exp2` (same polynomial, same clamp, same
operation order), so the result is bit-identical to the loop kernel. ``avx512`` swaps
two instruction groups for AVX-512 ones that compute the same bits: ``vreduceps`` for
``x - rint(x)`` and ``vscalefps`` for ``q * 2**k`` (3 and 4 instructions each
otherwise); generic IR elsewhere, so the portable variant runs on any x86 or Arm CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from embedcache.models.families.caduceus.kernels import EXP2_COEF32, LOG2E32, SERIES32

LANES = 16
N_STATE = 16
_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I16 = ir.IntType(16)
_I64 = ir.IntType(64)
_VF = ir.VectorType(_F32, LANES)
_VI = ir.VectorType(_I32, LANES)
# x86 rounding immediates: round to nearest even, no exception (vreduceps: keep 0
# fraction bits); 4 = the current direction (MXCSR) for vscalefps, which is exact
_REDUCE_NEAREST = 8
_CUR_DIRECTION = 4


def _splat(value: float, vtype: ir.VectorType = _VF) -> ir.Constant:
    return ir.Constant(vtype, [ir.Constant(vtype.element, value)] * LANES)


def _vector_fn(builder: ir.IRBuilder, name: str, args: list[ir.Type]) -> ir.Function:
    fnty = ir.FunctionType(_VF, args)
    return cgutils.get_or_insert_function(builder.module, fnty, name)


def _call(builder: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """Call the llvm vector intrinsic ``name`` (``llvm.fma`` etc.) on ``<16 x float>``."""
    fn = _vector_fn(builder, f"{name}.v{LANES}f32", [_VF] * len(args))
    return builder.call(fn, list(args))


def _broadcast(builder: ir.IRBuilder, scalar: ir.Value) -> ir.Value:
    undef = ir.Constant(_VF, ir.Undefined)
    one = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(_VI, [0] * LANES))


def _exp2(builder: ir.IRBuilder, x: ir.Value, *, avx512: bool) -> ir.Value:
    """``2**max(x, -126)``: :func:`.kernels._exp2`'s steps on 16 lanes."""
    x = _call(builder, "llvm.maxnum", x, _splat(-126.0))
    if avx512:
        reduce = _vector_fn(
            builder, "llvm.x86.avx512.mask.reduce.ps.512", [_VF, _I32, _VF, _I16, _I32]
        )
        f = builder.call(
            reduce,
            [
                x,
                ir.Constant(_I32, _REDUCE_NEAREST),
                _splat(0.0),
                ir.Constant(_I16, -1),
                ir.Constant(_I32, _CUR_DIRECTION),
            ],
        )
        k = builder.fsub(x, f)
    else:
        k = _call(builder, "llvm.rint", x)
        f = builder.fsub(x, k)
    q = _splat(EXP2_COEF32[7])
    for i in range(6, -1, -1):
        q = _call(builder, "llvm.fma", q, f, _splat(EXP2_COEF32[i]))
    if avx512:
        scalef = _vector_fn(
            builder, "llvm.x86.avx512.mask.scalef.ps.512", [_VF, _VF, _VF, _I16, _I32]
        )
        return builder.call(
            scalef,
            [
                q,
                k,
                _splat(0.0),
                ir.Constant(_I16, -1),
                ir.Constant(_I32, _CUR_DIRECTION),
            ],
        )
    bits = builder.shl(
        builder.add(builder.fptosi(k, _VI), _splat(127, _VI)), _splat(23, _VI)
    )
    return builder.fmul(q, builder.bitcast(bits, _VF))


def _at(builder: ir.IRBuilder, ptr: ir.Value, index: ir.Value | int) -> ir.Value:
    offset = ir.Constant(_I64, index) if isinstance(index, int) else index
    return builder.gep(ptr, [offset])


def _load_vector(builder: ir.IRBuilder, ptr: ir.Value, index: ir.Value) -> ir.Value:
    return builder.load(
        builder.bitcast(_at(builder, ptr, index), _VF.as_pointer()), align=4
    )


def _emit_loop(
    builder: ir.IRBuilder,
    n_steps: ir.Value,
    carried: list[ir.Value],
    step: Callable[[ir.Value, list[ir.Value]], list[ir.Value]],
    name: str,
) -> list[ir.Value]:
    """``for i in range(n_steps)``: ``carried = step(i, carried)``; the final values."""
    entry = builder.block
    head = builder.append_basic_block(f"{name}.head")
    body = builder.append_basic_block(f"{name}.body")
    done = builder.append_basic_block(f"{name}.done")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    phis = []
    for value in carried:
        phi = builder.phi(value.type)
        phi.add_incoming(value, entry)
        phis.append(phi)
    builder.cbranch(builder.icmp_signed("<", i, n_steps), body, done)
    builder.position_at_end(body)
    updated = step(i, phis)
    i.add_incoming(builder.add(i, ir.Constant(_I64, 1)), builder.block)
    for phi, value in zip(phis, updated, strict=True):
        phi.add_incoming(value, builder.block)
    builder.branch(head)
    builder.position_at_end(done)
    return phis


def _emit_softplus(builder: ir.IRBuilder, x: ir.Value, *, avx512: bool) -> ir.Value:
    """:func:`.kernels._softplus` on 16 lanes, the same operations in the same order."""
    fabs = _call(builder, "llvm.fabs", x)
    e = _exp2(builder, builder.fmul(fabs, _splat(-LOG2E32)), avx512=avx512)
    s = builder.fdiv(e, builder.fadd(_splat(2.0), e))
    s.flags.append("fast")  # as numba's fastmath: reciprocal estimate + a Newton step
    s2 = builder.fmul(s, s)
    series = _splat(SERIES32[0])
    for coef in SERIES32[1:]:
        series = _call(builder, "llvm.fma", series, s2, _splat(coef))
    positive = _call(builder, "llvm.maxnum", x, _splat(0.0))
    result = _call(builder, "llvm.fma", builder.fmul(_splat(2.0), s), series, positive)
    large = builder.fcmp_ordered(">", x, _splat(20.0))
    return builder.select(large, x, result)


def _emit_recurrence(
    builder: ir.IRBuilder,
    where: tuple[ir.Value, ...],
    row_inputs: Callable[[ir.Value], tuple[ir.Value, ...]],
    *,
    avx512: bool,
) -> None:
    """The time loop, the 16 state vectors carried in phi nodes; ``row_inputs(i)``
    gives (delta, delta * u, B row pointer, C row pointer) for step ``i``; ``where``:
    the state, A and output addresses, the output's row stride, the step count."""
    state_a, a_a, acc_a, acc_stride, n_steps = where
    pv = _VF.as_pointer()
    state_p, a_p = builder.inttoptr(state_a, pv), builder.inttoptr(a_a, pv)
    acc_p = builder.inttoptr(acc_a, _F32.as_pointer())

    def store_acc(i: ir.Value, acc: ir.Value) -> None:
        row = builder.mul(i, acc_stride)
        builder.store(acc, builder.bitcast(_at(builder, acc_p, row), pv), align=4)

    a_rows = [builder.load(_at(builder, a_p, n), align=4) for n in range(N_STATE)]
    start = [builder.load(_at(builder, state_p, n), align=4) for n in range(N_STATE)]

    def step(i: ir.Value, states: list[ir.Value]) -> list[ir.Value]:
        delta, du, b_row, c_row = row_inputs(i)
        acc = _splat(0.0)
        updated = []
        for n in range(N_STATE):
            b_n = builder.load(_at(builder, b_row, n))
            c_n = builder.load(_at(builder, c_row, n))
            decay = _exp2(builder, builder.fmul(delta, a_rows[n]), avx512=avx512)
            drive = builder.fmul(du, _broadcast(builder, b_n))
            s = _call(builder, "llvm.fma", decay, states[n], drive)
            acc = _call(builder, "llvm.fma", s, _broadcast(builder, c_n), acc)
            updated.append(s)
        store_acc(i, acc)
        return updated

    final = _emit_loop(builder, n_steps, start, step, "steps")
    for n, value in enumerate(final):
        builder.store(value, _at(builder, state_p, n), align=4)


def _emit_steps(builder: ir.IRBuilder, args: list[ir.Value], *, avx512: bool) -> None:
    """:func:`recur16`: delta, delta * u and B, C staged in arrays by the caller."""
    state_a, a_a, delta_a, du_a, bc_a, acc_a, n_steps, stride = args
    pf = _F32.as_pointer()
    delta_p, du_p = builder.inttoptr(delta_a, pf), builder.inttoptr(du_a, pf)
    bc_p = builder.inttoptr(bc_a, pf)

    def row_inputs(i: ir.Value) -> tuple[ir.Value, ...]:
        row = builder.mul(i, stride)
        b_row = _at(builder, bc_p, builder.mul(i, ir.Constant(_I64, 2 * N_STATE)))
        return (
            _load_vector(builder, delta_p, row),
            _load_vector(builder, du_p, row),
            b_row,
            _at(builder, b_row, N_STATE),
        )

    _emit_recurrence(
        builder, (state_a, a_a, acc_a, stride, n_steps), row_inputs, avx512=avx512
    )


def _emit_fused(builder: ir.IRBuilder, args: list[ir.Value], *, avx512: bool) -> None:
    """:func:`fused16`: delta (dt projection + softplus) and delta * u computed here
    from the x_proj rows, B and C read in place; rows ``step`` floats apart (negative
    when time runs backwards)."""
    (state_a, a_a, dt_a, b_a, c_a, row_step, u_a, u_step, w_a, w_stride, n_rank,
     bias_a, acc_a, acc_stride, n_steps) = args  # fmt: skip
    pv, pf = _VF.as_pointer(), _F32.as_pointer()
    dt_p, b_p, c_p = (builder.inttoptr(x, pf) for x in (dt_a, b_a, c_a))
    u_p, w_p = builder.inttoptr(u_a, pf), builder.inttoptr(w_a, pf)
    bias = builder.load(builder.inttoptr(bias_a, pv), align=4)

    def row_inputs(i: ir.Value) -> tuple[ir.Value, ...]:
        row = builder.mul(i, row_step)
        dt_row = _at(builder, dt_p, row)

        def rank_step(k: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
            w_k = _load_vector(builder, w_p, builder.mul(k, w_stride))
            dt_k = _broadcast(builder, builder.load(_at(builder, dt_row, k)))
            return [_call(builder, "llvm.fma", w_k, dt_k, carried[0])]

        (pre,) = _emit_loop(builder, n_rank, [bias], rank_step, "rank")
        delta = _emit_softplus(builder, pre, avx512=avx512)
        u = _load_vector(builder, u_p, builder.mul(i, u_step))
        return (
            delta,
            builder.fmul(delta, u),
            _at(builder, b_p, row),
            _at(builder, c_p, row),
        )

    _emit_recurrence(
        builder, (state_a, a_a, acc_a, acc_stride, n_steps), row_inputs, avx512=avx512
    )


@intrinsic
def recur16(
    typingctx: Any,  # noqa: ANN401 (numba intrinsic protocol)
    state: types.Type,
    a: types.Type,
    delta: types.Type,
    du: types.Type,
    bc: types.Type,
    acc: types.Type,
    n_steps: types.Type,
    stride: types.Type,
    avx512: types.Type,
) -> Any:  # noqa: ANN401
    """``n_steps`` steps for 16 channels x 16 states (addresses of float32 data).

    ``state`` and ``a`` (16 states x 16 lanes, contiguous; ``a`` = A * log2(e)) ;
    ``delta``, ``du`` and the output ``acc``: rows of 16 floats ``stride`` floats apart;
    ``bc``: rows of 32 floats (B then C), contiguous. ``avx512`` must be a literal bool.
    """
    if not isinstance(avx512, types.BooleanLiteral):
        return None
    use_avx512 = bool(avx512.literal_value)
    sig = types.void(
        types.uintp,
        types.uintp,
        types.uintp,
        types.uintp,
        types.uintp,
        types.uintp,
        types.intp,
        types.intp,
        avx512,
    )

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:  # noqa: ANN401
        _emit_steps(builder, list(args[:8]), avx512=use_avx512)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fused16(
    typingctx: Any,  # noqa: ANN401 (numba intrinsic protocol)
    state: types.Type,
    a: types.Type,
    dt: types.Type,
    b: types.Type,
    c: types.Type,
    row_step: types.Type,
    u: types.Type,
    u_step: types.Type,
    w: types.Type,
    w_stride: types.Type,
    n_rank: types.Type,
    bias: types.Type,
    acc: types.Type,
    acc_stride: types.Type,
    n_steps: types.Type,
    avx512: types.Type,
) -> Any:  # noqa: ANN401
    """:func:`recur16` computing its own inputs: ``delta = softplus(bias + sum_k
    w[k] dt[k])`` (``w`` rows ``w_stride`` floats apart), ``delta * u``; B, C and dt
    read from the x_proj rows, ``row_step`` floats apart, ``u`` rows ``u_step``."""
    if not isinstance(avx512, types.BooleanLiteral):
        return None
    use_avx512 = bool(avx512.literal_value)
    kinds = "aaaaaiaiaiiaaii"  # address or integer, per argument
    sig = types.void(*(types.uintp if k == "a" else types.intp for k in kinds), avx512)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:  # noqa: ANN401
        _emit_fused(builder, list(args[:15]), avx512=use_avx512)
        return context.get_dummy_value()

    return sig, codegen
