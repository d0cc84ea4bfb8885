"""Register-blocked gathers for the numba kernels, written as LLVM IR.

Each gathered row of the right-hand block is read through one block of its columns (up to 8
vectors of 512 bits: 128 float32 or 64 float64) while the block's accumulators stay in
registers for the whole row of W, and the rows ``pf`` entries ahead are prefetched. Written in
plain numba, the accumulators went through memory and nothing was prefetched: W X at n = 16384,
batch 256 took 11.1 ms against 6.2 ms for this and for PyTorch's embedding_bag (fbgemm, which
generates the same shape of code); see docs/BENCHMARKS.md. LLVM splits the 512-bit vectors
into what the CPU has (two 256-bit halves without AVX-512). Sums run in entry order with fused
multiply-adds; a dot product's lanes are added as a halving tree.

The blocks cover n = ``rem`` columns with ``nvec`` vectors (n = nvec x lanes for a full block;
a partial block reads and writes its last columns with masked loads and stores, so a column sums
exactly as in a full block, wherever it sits in the batch, and no scalar loop is needed):
- ``AXPY[(nvec, masked)](acc, k, x, ld, col, indices, data, e0, e1, rem, pf)``:
  acc[k:k+n] += sum over e in [e0, e1) of data[e] * x[indices[e] * ld + col:...+n];
- ``DOT[...](a, ka, x, ld, col, indices, out, e0, e1, first, rem, pf)``:
  out[e] (= when ``first``, else +=) a[ka:ka+n] . x[indices[e] * ld + col:...+n];
- ``AXPY_DOT[...](acc, k, d, ld, col, indices, data, xj, kx, grad, order, e0, e1, first,
  rem, pf)``: the axpy of d's rows (weights data[order[e]]: W's values, read through the
  transpose's map) into acc and grad[order[e]] (=, +=) d's row . xj[kx:kx+n].
Arrays are 1-D C-contiguous (flat views of the row-major blocks).

numba's cache does not follow imports: after changing this file, touch _numba_kernels.py (an
installed upgrade rewrites both) or its cached kernels keep the old blocks.
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


class _Arrays:
    """Data pointers of the intrinsic's array arguments, the vector type of the block and, for
    a partial block, the mask of each vector (None: every lane)."""

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
        self.masks: list | None = None

    def const(self, v: int) -> ir.Constant:
        return ir.Constant(self.intp, v)

    def mask_lanes(self, builder, rem, nvec: int) -> None:  # noqa: ANN001
        """Vector r keeps its lanes l with r * lanes + l < rem."""
        iota = ir.Constant(ir.VectorType(self.intp, self.lanes), list(range(self.lanes)))
        vi = ir.VectorType(self.intp, self.lanes)
        self.masks = [builder.icmp_signed("<", iota, _splat(
            builder, builder.sub(rem, self.const(r * self.lanes)), vi)) for r in range(nvec)]


def _index(builder, a: _Arrays, name: str, at):  # noqa: ANN001, ANN202
    v = builder.load(builder.gep(a.ptr[name], [at]))
    return builder.sext(v, a.intp) if v.type.width < 64 else v


def _masked(builder, a: _Arrays, what: str, args: list):  # noqa: ANN001, ANN202
    vt = a.vt
    kind = f"v{vt.count}{'f32' if vt.element == ir.FloatType() else 'f64'}"
    vp, mt = vt.as_pointer(), ir.VectorType(ir.IntType(1), vt.count)
    if what == "load":
        fnty = ir.FunctionType(vt, [vp, _I32, mt, vt])
    else:
        fnty = ir.FunctionType(ir.VoidType(), [vt, vp, _I32, mt])
    fn = cgutils.get_or_insert_function(builder.module, fnty,
                                        f"llvm.masked.{what}.{kind}.p0{kind}")
    return builder.call(fn, args)


def _vload(builder, a: _Arrays, base, r: int):  # noqa: ANN001, ANN202
    p = builder.bitcast(builder.gep(base, [a.const(r * a.lanes)]), a.vt.as_pointer())
    if a.masks is None:
        return builder.load(p, align=4)
    return _masked(builder, a, "load", [p, ir.Constant(_I32, 4), a.masks[r],
                                        ir.Constant(a.vt, [0.0] * a.lanes)])


def _vstore(builder, a: _Arrays, value, base, r: int) -> None:  # noqa: ANN001
    p = builder.bitcast(builder.gep(base, [a.const(r * a.lanes)]), a.vt.as_pointer())
    if a.masks is None:
        builder.store(value, p, align=4)
    else:
        _masked(builder, a, "store", [value, p, ir.Constant(_I32, 4), a.masks[r]])


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
    if not isinstance(vt.element, ir.IntType):
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
        for r in range(nvec):  # a 512-bit vector is one 64-byte cache line
            p = builder.bitcast(builder.gep(base, [a.const(r * a.lanes)]), i8p)
            builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                              ir.Constant(_I32, 1)])


def _prefetch_value(builder, a: _Arrays, e, pf) -> None:  # noqa: ANN001
    """Prefetch the value ``pf`` entries after e, data[order[e + pf]]: W's values read
    through the transpose's map are scattered, and each one is needed before its row's
    multiply-adds can start."""
    ahead = builder.add(e, pf)
    with builder.if_then(builder.icmp_signed("<", ahead, a.len["order"]), likely=True):
        at = _index(builder, a, "order", ahead)
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(builder.gep(a.ptr["data"], [at]), i8p),
                          ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _gathered_row(builder, a: _Arrays, e, ld, col):  # noqa: ANN001, ANN202
    row = _index(builder, a, "indices", e)
    return builder.gep(a.ptr["x"], [builder.add(builder.mul(row, ld), col)])


def _registers(builder, a: _Arrays, base, nvec: int) -> list:  # noqa: ANN001
    slots = []
    for r in range(nvec):
        slot = cgutils.alloca_once(builder, a.vt)  # promoted to a register by mem2reg
        builder.store(_vload(builder, a, base, r), slot)
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


def _setup(context, builder, signature, args, names, nvec, masked):  # noqa: ANN001, ANN202
    a = _Arrays(context, builder, signature, args, names)
    if masked:
        a.mask_lanes(builder, args[names.index("rem")], nvec)
    return a, dict(zip(names, args))


def _entries(builder, v: dict):  # noqa: ANN001, ANN202
    return cgutils.for_range_slice(builder, v["e0"], v["e1"], ir.Constant(v["e0"].type, 1),
                                   inc=True)


def _make_axpy(nvec: int, masked: bool):  # noqa: ANN202
    names = ("acc", "k", "x", "ld", "col", "indices", "data", "e0", "e1", "rem", "pf")

    @intrinsic
    def axpy(typingctx, acc, k, x, ld, col, indices, data, e0, e1, rem, pf):  # noqa: ANN001, ANN202
        _same(acc, x)
        sig = types.void(acc, types.intp, x, types.intp, types.intp, indices, data,
                         types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a, v = _setup(context, builder, signature, args, names, nvec, masked)
            out = builder.gep(a.ptr["acc"], [v["k"]])
            regs = _registers(builder, a, out, nvec)
            with _entries(builder, v) as (e, _):
                _prefetch_ahead(builder, a, e, v["pf"], v["ld"], v["col"], nvec)
                xr = _gathered_row(builder, a, e, v["ld"], v["col"])
                w = _splat(builder, builder.load(builder.gep(a.ptr["data"], [e])), a.vt)
                for r in range(nvec):
                    builder.store(_fma(builder, a.vt, w, _vload(builder, a, xr, r),
                                       builder.load(regs[r])), regs[r])
            for r in range(nvec):
                _vstore(builder, a, builder.load(regs[r]), out, r)
            return context.get_dummy_value()
        return sig, codegen
    return axpy


def _make_dot(nvec: int, masked: bool):  # noqa: ANN202
    names = ("a", "ka", "x", "ld", "col", "indices", "out", "e0", "e1", "first", "rem", "pf")

    @intrinsic
    def dot(typingctx, a_, ka, x, ld, col, indices, out, e0, e1, first, rem, pf):  # noqa: ANN001, ANN202
        _same(a_, x)
        sig = types.void(a_, types.intp, x, types.intp, types.intp, indices, out, types.intp,
                         types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a, v = _setup(context, builder, signature, args, names, nvec, masked)
            regs = _registers(builder, a, builder.gep(a.ptr["a"], [v["ka"]]), nvec)
            with _entries(builder, v) as (e, _):
                _prefetch_ahead(builder, a, e, v["pf"], v["ld"], v["col"], nvec)
                xr = _gathered_row(builder, a, e, v["ld"], v["col"])
                s = builder.fmul(builder.load(regs[0]), _vload(builder, a, xr, 0))
                for r in range(1, nvec):
                    s = _fma(builder, a.vt, builder.load(regs[r]), _vload(builder, a, xr, r), s)
                _store_dot(builder, a, _hsum(builder, s), builder.gep(a.ptr["out"], [e]),
                           v["first"])
            return context.get_dummy_value()
        return sig, codegen
    return dot


def _make_axpy_dot(nvec: int, masked: bool):  # noqa: ANN202
    names = ("acc", "k", "x", "ld", "col", "indices", "data", "xj", "kx", "grad", "order",
             "e0", "e1", "first", "rem", "pf")

    @intrinsic
    def axpy_dot(typingctx, acc, k, d, ld, col, indices, data, xj, kx, grad, order, e0, e1,  # noqa: ANN001, ANN202
                 first, rem, pf):
        _same(acc, d)
        _same(xj, d)
        sig = types.void(acc, types.intp, d, types.intp, types.intp, indices, data, xj,
                         types.intp, grad, order, types.intp, types.intp, types.intp,
                         types.intp, types.intp)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a, v = _setup(context, builder, signature, args, names, nvec, masked)
            out = builder.gep(a.ptr["acc"], [v["k"]])
            regs = _registers(builder, a, out, nvec)
            xregs = _registers(builder, a, builder.gep(a.ptr["xj"], [v["kx"]]), nvec)
            with _entries(builder, v) as (e, _):
                _prefetch_ahead(builder, a, e, v["pf"], v["ld"], v["col"], nvec)
                _prefetch_value(builder, a, e, v["pf"])
                dr = _gathered_row(builder, a, e, v["ld"], v["col"])
                at = _index(builder, a, "order", e)  # W's entry: its value and its gradient
                w = _splat(builder, builder.load(builder.gep(a.ptr["data"], [at])), a.vt)
                s = None
                for r in range(nvec):
                    dv = _vload(builder, a, dr, r)
                    builder.store(_fma(builder, a.vt, w, dv, builder.load(regs[r])), regs[r])
                    s = builder.fmul(dv, builder.load(xregs[r])) if s is None else \
                        _fma(builder, a.vt, dv, builder.load(xregs[r]), s)
                where = builder.gep(a.ptr["grad"], [at])
                _store_dot(builder, a, _hsum(builder, s), where, v["first"])
            for r in range(nvec):
                _vstore(builder, a, builder.load(regs[r]), out, r)
            return context.get_dummy_value()
        return sig, codegen
    return axpy_dot


# A full block of MAX_VECTORS vectors, and partial blocks of 1, 2, 4 and 8 vectors (masked).
PARTIAL = (1, 2, 4, 8)
AXPY = (_make_axpy(MAX_VECTORS, False),) + tuple(_make_axpy(n, True) for n in PARTIAL)
DOT = (_make_dot(MAX_VECTORS, False),) + tuple(_make_dot(n, True) for n in PARTIAL)
AXPY_DOT = (_make_axpy_dot(MAX_VECTORS, False),) + tuple(_make_axpy_dot(n, True)
                                                         for n in PARTIAL)
