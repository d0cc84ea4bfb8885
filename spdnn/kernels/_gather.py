"""Register-blocked gathers for the numba kernels, written as LLVM IR.

Each gathered row of the right-hand block is read through one block of its columns (up to 8
vectors of 512 bits: 128 float32 or 64 float64) while the block's accumulators stay in
registers for the whole row of W, and the rows ``pf`` entries ahead are prefetched. Written in
plain numba, the accumulators went through memory and nothing was prefetched: W X at n = 16384,
batch 256 took 11.1 ms against 6.2 ms for this and for PyTorch's embedding_bag (fbgemm, which
generates the same shape of code); see docs/BENCHMARKS.md. LLVM splits the 512-bit vectors
into what the CPU has (two 256-bit halves without AVX-512). Sums run in entry order with fused
multiply-adds; a dot product's lanes are added as a halving tree.

The blocks (``nvec`` vectors each) are:
- ``axpy[nvec](acc, k, x, ld, col, indices, data, e0, e1, pf)``:
  acc[k:k+n] += sum over e in [e0, e1) of data[e] * x[indices[e] * ld + col:...+n];
- ``dot[nvec](a, ka, x, ld, col, indices, out, e0, e1, first, pf)``:
  out[e] (= when ``first``, else +=) a[ka:ka+n] . x[indices[e] * ld + col:...+n];
- ``axpy_dot[nvec](acc, k, d, ld, col, indices, data, xj, kx, grad, order, e0, e1, first,
  pf)``: the axpy of d's rows into acc and grad[order[e]] (=, +=) d's row . xj[kx:kx+n].
Arrays are 1-D C-contiguous (flat views of the row-major blocks).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

MAX_VECTORS = 8
PREFETCH_AHEAD = 16  # entries; fbgemm's default too (16 measured best of 0, 8, 16 here)
_I32 = ir.IntType(32)
_LINE = 64


class _Arrays:
    """Data pointers of the intrinsic's array arguments and the vector type of the block."""

    def __init__(self, context, builder, sig, args, names):  # noqa: ANN001
        self.intp = context.get_value_type(types.intp)
        self.ptr = {}
        self.len = {}
        for name, ty, val in zip(names, sig.args, args):
            if isinstance(ty, types.Array):
                arr = context.make_array(ty)(context, builder, val)
                self.ptr[name] = arr.data
                self.len[name] = builder.extract_value(arr.shape, 0)
        elt = self.ptr["x"].type.pointee
        self.lanes = 512 // (32 if elt == ir.FloatType() else 64)
        self.vt = ir.VectorType(elt, self.lanes)

    def const(self, v: int) -> ir.Constant:
        return ir.Constant(self.intp, v)


def _index(builder, a: _Arrays, name: str, at):  # noqa: ANN001, ANN202
    v = builder.load(builder.gep(a.ptr[name], [at]))
    return builder.sext(v, a.intp) if v.type.width < 64 else v


def _vload(builder, a: _Arrays, base, r: int):  # noqa: ANN001, ANN202
    p = builder.gep(base, [a.const(r * a.lanes)])
    return builder.load(builder.bitcast(p, a.vt.as_pointer()), align=4)


def _vstore(builder, a: _Arrays, value, base, r: int) -> None:  # noqa: ANN001
    p = builder.gep(base, [a.const(r * a.lanes)])
    builder.store(value, builder.bitcast(p, a.vt.as_pointer()), align=4)


def _fma(builder, vt, x, y, z):  # noqa: ANN001, ANN202
    kind = "f32" if vt.element == ir.FloatType() else "f64"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                        f"llvm.fma.v{vt.count}{kind}")
    return builder.call(fn, [x, y, z])


def _cast(builder, value, ty):  # noqa: ANN001, ANN202
    """A float value in the float type ``ty`` (weights and blocks may differ in precision)."""
    if value.type == ty:
        return value
    wide = ty == ir.DoubleType()
    return builder.fpext(value, ty) if wide else builder.fptrunc(value, ty)


def _splat(builder, value, vt):  # noqa: ANN001, ANN202
    value = _cast(builder, value, vt.element)
    undef = ir.Constant(vt, None)
    one = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, vt.count), None))


def _hsum(builder, v):  # noqa: ANN001, ANN202
    """The lanes of ``v`` added as a halving tree."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n),
                                                      list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _prefetch_ahead(builder, a: _Arrays, e, pf, ld, col, nvec: int) -> None:  # noqa: ANN001
    """Prefetch the block of the row named ``pf`` entries after e (when there is one)."""
    ahead = builder.add(e, pf)
    with builder.if_then(builder.icmp_signed("<", ahead, a.len["indices"]), likely=True):
        row = _index(builder, a, "indices", ahead)
        base = builder.gep(a.ptr["x"], [builder.add(builder.mul(row, ld), col)])
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
            "llvm.prefetch.p0i8")
        step = _LINE // (a.vt.element.width if isinstance(a.vt.element, ir.IntType)
                         else (4 if a.vt.element == ir.FloatType() else 8))
        for q in range(max(1, nvec * a.lanes // step)):
            p = builder.bitcast(builder.gep(base, [a.const(q * step)]), i8p)
            builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                              ir.Constant(_I32, 1)])


def _gathered_row(builder, a: _Arrays, e, ld, col):  # noqa: ANN001, ANN202
    row = _index(builder, a, "indices", e)
    return builder.gep(a.ptr["x"], [builder.add(builder.mul(row, ld), col)])


def _registers(builder, a: _Arrays, base, nvec: int, load: bool) -> list:  # noqa: ANN001
    slots = []
    for r in range(nvec):
        slot = cgutils.alloca_once(builder, a.vt)  # promoted to a register by mem2reg
        builder.store(_vload(builder, a, base, r) if load else ir.Constant(a.vt, None), slot)
        slots.append(slot)
    return slots


def _store_dot(builder, a: _Arrays, dot, where, first) -> None:  # noqa: ANN001
    dot = _cast(builder, dot, where.type.pointee)
    with builder.if_else(builder.icmp_signed("!=", first, ir.Constant(first.type, 0))) as (
            then, other):
        with then:
            builder.store(dot, where)
        with other:
            builder.store(builder.fadd(builder.load(where), dot), where)


def _same(a, b) -> None:  # noqa: ANN001
    """Blocks read as vectors must share one float type (registers are of one type)."""
    if a.dtype != b.dtype or a.dtype not in (types.float32, types.float64):
        raise TypingError(f"gathered blocks must both be float32 or float64, not {a.dtype} "
                          f"and {b.dtype}")


def _make_axpy(nvec: int):  # noqa: ANN202
    names = ("acc", "k", "x", "ld", "col", "indices", "data", "e0", "e1", "pf")

    @intrinsic
    def axpy(typingctx, acc, k, x, ld, col, indices, data, e0, e1, pf):  # noqa: ANN001, ANN202
        _same(acc, x)
        sig = types.void(acc, types.intp, x, types.intp, types.intp, indices, data,
                         types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a = _Arrays(context, builder, signature, args, names)
            _, k_, _, ld_, col_, _, _, e0_, e1_, pf_ = args
            out = builder.gep(a.ptr["acc"], [k_])
            regs = _registers(builder, a, out, nvec, True)
            one = ir.Constant(e0_.type, 1)
            with cgutils.for_range_slice(builder, e0_, e1_, one, inc=True) as (e, _):
                _prefetch_ahead(builder, a, e, pf_, ld_, col_, nvec)
                xr = _gathered_row(builder, a, e, ld_, col_)
                v = _splat(builder, builder.load(builder.gep(a.ptr["data"], [e])), a.vt)
                for r in range(nvec):
                    builder.store(_fma(builder, a.vt, v, _vload(builder, a, xr, r),
                                       builder.load(regs[r])), regs[r])
            for r in range(nvec):
                _vstore(builder, a, builder.load(regs[r]), out, r)
            return context.get_dummy_value()
        return sig, codegen
    return axpy


def _make_dot(nvec: int):  # noqa: ANN202
    names = ("a", "ka", "x", "ld", "col", "indices", "out", "e0", "e1", "first", "pf")

    @intrinsic
    def dot(typingctx, a_, ka, x, ld, col, indices, out, e0, e1, first, pf):  # noqa: ANN001, ANN202
        _same(a_, x)
        sig = types.void(a_, types.intp, x, types.intp, types.intp, indices, out, types.intp,
                         types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a = _Arrays(context, builder, signature, args, names)
            _, ka_, _, ld_, col_, _, _, e0_, e1_, first_, pf_ = args
            regs = _registers(builder, a, builder.gep(a.ptr["a"], [ka_]), nvec, True)
            one = ir.Constant(e0_.type, 1)
            with cgutils.for_range_slice(builder, e0_, e1_, one, inc=True) as (e, _):
                _prefetch_ahead(builder, a, e, pf_, ld_, col_, nvec)
                xr = _gathered_row(builder, a, e, ld_, col_)
                s = builder.fmul(builder.load(regs[0]), _vload(builder, a, xr, 0))
                for r in range(1, nvec):
                    s = _fma(builder, a.vt, builder.load(regs[r]), _vload(builder, a, xr, r), s)
                _store_dot(builder, a, _hsum(builder, s), builder.gep(a.ptr["out"], [e]),
                           first_)
            return context.get_dummy_value()
        return sig, codegen
    return dot


def _make_axpy_dot(nvec: int):  # noqa: ANN202
    names = ("acc", "k", "x", "ld", "col", "indices", "data", "xj", "kx", "grad", "order",
             "e0", "e1", "first", "pf")

    @intrinsic
    def axpy_dot(typingctx, acc, k, d, ld, col, indices, data, xj, kx, grad, order, e0, e1,  # noqa: ANN001, ANN202
                 first, pf):
        _same(acc, d)
        _same(xj, d)
        sig = types.void(acc, types.intp, d, types.intp, types.intp, indices, data, xj,
                         types.intp, grad, order, types.intp, types.intp, types.intp,
                         types.intp)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a = _Arrays(context, builder, signature, args, names)
            _, k_, _, ld_, col_, _, _, _, kx_, _, _, e0_, e1_, first_, pf_ = args
            out = builder.gep(a.ptr["acc"], [k_])
            regs = _registers(builder, a, out, nvec, True)
            xregs = _registers(builder, a, builder.gep(a.ptr["xj"], [kx_]), nvec, True)
            one = ir.Constant(e0_.type, 1)
            with cgutils.for_range_slice(builder, e0_, e1_, one, inc=True) as (e, _):
                _prefetch_ahead(builder, a, e, pf_, ld_, col_, nvec)
                dr = _gathered_row(builder, a, e, ld_, col_)
                v = _splat(builder, builder.load(builder.gep(a.ptr["data"], [e])), a.vt)
                s = None
                for r in range(nvec):
                    dv = _vload(builder, a, dr, r)
                    builder.store(_fma(builder, a.vt, v, dv, builder.load(regs[r])), regs[r])
                    s = builder.fmul(dv, builder.load(xregs[r])) if s is None else \
                        _fma(builder, a.vt, dv, builder.load(xregs[r]), s)
                where = builder.gep(a.ptr["grad"], [_index(builder, a, "order", e)])
                _store_dot(builder, a, _hsum(builder, s), where, first_)
            for r in range(nvec):
                _vstore(builder, a, builder.load(regs[r]), out, r)
            return context.get_dummy_value()
        return sig, codegen
    return axpy_dot


@intrinsic
def fma(typingctx, x, y, z):  # noqa: ANN001, ANN201
    """x * y + z rounded once, in z's type: a column past the last whole vector sums exactly
    as a vector lane does, so a sample's result does not depend on its place in the batch."""
    if not all(isinstance(t, types.Float) for t in (x, y, z)):
        raise TypingError("fma takes floats")
    sig = z(x, y, z)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        ty = args[2].type
        kind = "f32" if ty == ir.FloatType() else "f64"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3),
                                            f"llvm.fma.{kind}")
        return builder.call(fn, [_cast(builder, args[0], ty), _cast(builder, args[1], ty),
                                 args[2]])
    return sig, codegen


AXPY = tuple(_make_axpy(n) for n in range(1, MAX_VECTORS + 1))
DOT = tuple(_make_dot(n) for n in range(1, MAX_VECTORS + 1))
AXPY_DOT = tuple(_make_axpy_dot(n) for n in range(1, MAX_VECTORS + 1))
