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
# x + 1.5 * 2**23 rounds x (|x| < 2**22) to an integer, held in the low mantissa bits
_ROUNDER = 1.5 * 2**23
# fused16's exps: 2**f = 1 + f * q(f) on |f| <= 1/2, q a near-minimax float32 fit of
# (2**f - 1) / f (Lawson-weighted least squares on Chebyshev nodes). 1 is exact at
# f = 0, so the error of a decay near 1 (a long memory) shrinks with |f| and does not
# pile up over the steps. Largest relative error of 2**f in float32: degree 4 (the
# decays, 16 a step) 6.3e-6; degree 5 (softplus and silu, once a step) 2.5e-7; the
# loop kernel's degree-7 Taylor polynomial 1.2e-7.
DECAY_EXP2_COEF32 = (1.0, 0.6931369, 0.24023253, 0.05583729, 0.00961811)
# The decays when the output is bfloat16: degree 3, 1.0e-4, one FMA a decay fewer
# (the recurrence is bound by its FMAs). Its error is relative to f too, so the
# state's stays near 2e-4 whatever the memory length, below the output's own
# bfloat16 rounding (2**-9): the output's error against the float32 loop is the
# bfloat16 loop's (docs/kernels.md).
DECAY_EXP2_COEF32_BF16 = (1.0, 0.6932829, 0.24221095, 0.05500893)
GATE_EXP2_COEF32 = (1.0, 0.6931471, 0.24022351, 0.055505004, 0.009666245, 0.0013333538)


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


def _exp2(
    builder: ir.IRBuilder,
    x: ir.Value,
    *,
    avx512: bool,
    coefs: tuple[float, ...] = EXP2_COEF32,
) -> ir.Value:
    """``2**max(x, -126)``: :func:`.kernels._exp2`'s steps on 16 lanes (with its
    coefficients; ``coefs``: a polynomial for ``2**f`` on ``|f| <= 1/2``, low first)."""
    if coefs is EXP2_COEF32 or not avx512:
        x = _call(builder, "llvm.maxnum", x, _splat(-126.0))
    # else vscalefps takes any k: 2**k * q underflows to 0, as exp does
    if coefs is not EXP2_COEF32 and not avx512:
        return _exp2_magic(builder, x, coefs)
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
    q = _splat(coefs[-1])
    for coef in reversed(coefs[:-1]):
        q = _call(builder, "llvm.fma", q, f, _splat(coef))
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


def _exp2_magic(
    builder: ir.IRBuilder, x: ir.Value, coefs: tuple[float, ...]
) -> ir.Value:
    """``2**x`` for x in [-126, 0] with float adds and integer ops around the
    polynomial: adding 1.5 * 2**23 rounds x to an integer k held in the low mantissa
    bits, so ``x - k`` and ``2**k`` (k shifted into the exponent field, added to the
    polynomial's bits) cost no multiply and no conversion: on CPUs whose FMA pipes are
    the bottleneck (the recurrence's are) they run on the adder and integer pipes."""
    # "contract" only: numba's fastmath pass gives "fast" to every float op that has
    # no flag, and reassociation would fold (x + R) - R back into x
    shifted = builder.fadd(x, _splat(_ROUNDER), flags=["contract"])
    rounded = builder.fsub(shifted, _splat(_ROUNDER), flags=["contract"])
    f = builder.fsub(x, rounded, flags=["contract"])
    q = _splat(coefs[-1])
    for coef in reversed(coefs[:-1]):
        q = _call(builder, "llvm.fma", q, f, _splat(coef))
    scale = builder.shl(builder.bitcast(shifted, _VI), _splat(23, _VI))
    return builder.bitcast(builder.add(builder.bitcast(q, _VI), scale), _VF)


def _at(builder: ir.IRBuilder, ptr: ir.Value, index: ir.Value | int) -> ir.Value:
    offset = ir.Constant(_I64, index) if isinstance(index, int) else index
    return builder.gep(ptr, [offset])


def _vector_at(builder: ir.IRBuilder, ptr: ir.Value, index: ir.Value) -> ir.Value:
    return builder.bitcast(_at(builder, ptr, index), _VF.as_pointer())


def _load_vector(builder: ir.IRBuilder, ptr: ir.Value, index: ir.Value) -> ir.Value:
    return builder.load(_vector_at(builder, ptr, index), align=4)


def _load_bf16_vector(
    builder: ir.IRBuilder, ptr: ir.Value, index: ir.Value
) -> ir.Value:
    """16 bfloat16 (int16 bits at ``ptr``) as float32: the top halves of floats."""
    vi16 = ir.VectorType(_I16, LANES)
    bits = builder.load(builder.bitcast(_at(builder, ptr, index), vi16.as_pointer()))
    wide = builder.shl(builder.zext(bits, _VI), _splat(16, _VI))
    return builder.bitcast(wide, _VF)


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


def _emit_softplus(
    builder: ir.IRBuilder,
    x: ir.Value,
    *,
    avx512: bool,
    coefs: tuple[float, ...] = EXP2_COEF32,
) -> ir.Value:
    """:func:`.kernels._softplus` on 16 lanes, the same operations in the same order
    (with another exp polynomial when ``coefs`` says so)."""
    fabs = _call(builder, "llvm.fabs", x)
    e = _exp2(builder, builder.fmul(fabs, _splat(-LOG2E32)), avx512=avx512, coefs=coefs)
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
    coefs: tuple[float, ...] = EXP2_COEF32,
    n_sums: int = 1,
) -> None:
    """The time loop, the 16 state vectors carried in phi nodes; ``row_inputs(i)``
    gives (delta, delta * u, B row pointer, C row pointer, output(total)) for step
    ``i``; ``where``: the state and A addresses, the step count. ``n_sums`` > 1
    splits the sum over states into that many chains (a shorter critical path per
    step; 1 keeps the loop kernel's order)."""
    state_a, a_a, n_steps = where
    pv = _VF.as_pointer()
    state_p, a_p = builder.inttoptr(state_a, pv), builder.inttoptr(a_a, pv)

    a_rows = [builder.load(_at(builder, a_p, n), align=4) for n in range(N_STATE)]
    start = [builder.load(_at(builder, state_p, n), align=4) for n in range(N_STATE)]

    def step(i: ir.Value, states: list[ir.Value]) -> list[ir.Value]:
        delta, du, b_row, c_row, output = row_inputs(i)
        sums = [_splat(0.0)] * n_sums
        updated = []
        for n in range(N_STATE):
            b_n = builder.load(_at(builder, b_row, n))
            c_n = builder.load(_at(builder, c_row, n))
            x = builder.fmul(delta, a_rows[n])
            decay = _exp2(builder, x, avx512=avx512, coefs=coefs)
            drive = builder.fmul(du, _broadcast(builder, b_n))
            s = _call(builder, "llvm.fma", decay, states[n], drive)
            c_n = _broadcast(builder, c_n)
            sums[n % n_sums] = _call(builder, "llvm.fma", s, c_n, sums[n % n_sums])
            updated.append(s)
        while len(sums) > 1:  # pairwise: (0 + 1) + (2 + 3)
            sums = [
                builder.fadd(x, y) for x, y in zip(sums[::2], sums[1::2], strict=True)
            ]
        output(sums[0])
        return updated

    final = _emit_loop(builder, n_steps, start, step, "steps")
    for n, value in enumerate(final):
        builder.store(value, _at(builder, state_p, n), align=4)


def _emit_steps(builder: ir.IRBuilder, args: list[ir.Value], *, avx512: bool) -> None:
    """:func:`recur16`: delta, delta * u and B, C staged in arrays by the caller."""
    state_a, a_a, delta_a, du_a, bc_a, acc_a, n_steps, stride = args
    pf = _F32.as_pointer()
    delta_p, du_p = builder.inttoptr(delta_a, pf), builder.inttoptr(du_a, pf)
    bc_p, acc_p = builder.inttoptr(bc_a, pf), builder.inttoptr(acc_a, pf)

    def row_inputs(i: ir.Value) -> tuple[Any, ...]:
        row = builder.mul(i, stride)
        b_row = _at(builder, bc_p, builder.mul(i, ir.Constant(_I64, 2 * N_STATE)))

        def store_acc(acc: ir.Value) -> None:
            builder.store(acc, _vector_at(builder, acc_p, row), align=4)

        return (
            _load_vector(builder, delta_p, row),
            _load_vector(builder, du_p, row),
            b_row,
            _at(builder, b_row, N_STATE),
            store_acc,
        )

    _emit_recurrence(builder, (state_a, a_a, n_steps), row_inputs, avx512=avx512)


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
