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

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from embedcache.models.families.caduceus.kernels import EXP2_COEF32

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


def _emit_steps(builder: ir.IRBuilder, args: list[ir.Value], *, avx512: bool) -> None:
    """The loop over ``nt`` time steps, the 16 state vectors carried in phi nodes."""
    state_a, a_a, delta_a, du_a, bc_a, acc_a, n_steps, stride = args
    pv, pf = _VF.as_pointer(), _F32.as_pointer()
    state_p, a_p = builder.inttoptr(state_a, pv), builder.inttoptr(a_a, pv)
    delta_p, du_p = builder.inttoptr(delta_a, pf), builder.inttoptr(du_a, pf)
    bc_p, acc_p = builder.inttoptr(bc_a, pf), builder.inttoptr(acc_a, pf)

    def at(ptr: ir.Value, index: ir.Value | int) -> ir.Value:
        return builder.gep(
            ptr, [ir.Constant(_I64, index) if isinstance(index, int) else index]
        )

    a_rows = [builder.load(at(a_p, n), align=4) for n in range(N_STATE)]
    start = [builder.load(at(state_p, n), align=4) for n in range(N_STATE)]
    entry = builder.block
    head = builder.append_basic_block("steps.head")
    body = builder.append_basic_block("steps.body")
    done = builder.append_basic_block("steps.done")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    states = [builder.phi(_VF) for _ in range(N_STATE)]
    for phi, value in zip(states, start, strict=True):
        phi.add_incoming(value, entry)
    builder.cbranch(builder.icmp_signed("<", i, n_steps), body, done)

    builder.position_at_end(body)
    row = builder.mul(i, stride)
    delta = builder.load(builder.bitcast(at(delta_p, row), pv), align=4)
    du = builder.load(builder.bitcast(at(du_p, row), pv), align=4)
    bc_row = builder.mul(i, ir.Constant(_I64, 2 * N_STATE))
    acc = _splat(0.0)
    updated = []
    for n in range(N_STATE):
        b_n = builder.load(at(bc_p, builder.add(bc_row, ir.Constant(_I64, n))))
        c_n = builder.load(
            at(bc_p, builder.add(bc_row, ir.Constant(_I64, N_STATE + n)))
        )
        decay = _exp2(builder, builder.fmul(delta, a_rows[n]), avx512=avx512)
        drive = builder.fmul(du, _broadcast(builder, b_n))
        s = _call(builder, "llvm.fma", decay, states[n], drive)
        acc = _call(builder, "llvm.fma", s, _broadcast(builder, c_n), acc)
        updated.append(s)
    builder.store(acc, builder.bitcast(at(acc_p, row), pv), align=4)
    i.add_incoming(builder.add(i, ir.Constant(_I64, 1)), builder.block)
    for phi, value in zip(states, updated, strict=True):
        phi.add_incoming(value, builder.block)
    builder.branch(head)

    builder.position_at_end(done)
    for n, phi in enumerate(states):
        builder.store(phi, at(state_p, n), align=4)


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
