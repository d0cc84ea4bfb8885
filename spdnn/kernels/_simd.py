"""Vector compress and expand for numba kernels, as LLVM intrinsics (one 512-bit vector: 16
lanes of 4 bytes or 8 of 8). On AVX-512 they become vpcompress / vpexpand; elsewhere LLVM expands
them into scalar code with the same results. Used by spdnn.kernels._numba_encoding.

The compress is the register form followed by one plain store: AMD Zen 4 microcodes the
memory form (vpcompressd to memory was ten times slower per entry than the register form).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from spdnn.kernels._vectors import widen


def _lanes(context, builder, arrty, arr, index):  # noqa: ANN001, ANN202
    """(vector type, number of lanes, pointer to arr[index])."""
    ary = context.make_array(arrty)(context, builder, arr)
    elt = context.get_data_type(arrty.dtype)
    width = elt.width if isinstance(elt, ir.IntType) else (32 if elt == ir.FloatType() else 64)
    lanes = 512 // width
    return ir.VectorType(elt, lanes), lanes, builder.gep(ary.data, [index])


def _suffix(vt: ir.VectorType) -> str:
    elt = vt.element
    kind = f"i{elt.width}" if isinstance(elt, ir.IntType) else \
        ("f32" if elt == ir.FloatType() else "f64")
    return f"v{vt.count}{kind}"


def _mask(builder, m, lanes):  # noqa: ANN001, ANN202
    return builder.bitcast(builder.trunc(m, ir.IntType(lanes)),
                           ir.VectorType(ir.IntType(1), lanes))


def _store_packed(builder, vec, m, lanes, dp):  # noqa: ANN001, ANN202
    """Store the lanes of ``vec`` selected by the bits of ``m`` packed to the front, at dp
    (the register form of the compress, then one plain store)."""
    if not isinstance(vec.type.element, ir.IntType):
        # Float lanes are compressed as integers of their width (the same bits moved): LLVM 20
        # cannot expand a float vector.compress on targets without AVX-512 (an assertion,
        # "Cannot create FP integer constant", aborts the process; AMD EPYC with AVX2).
        width = 32 if vec.type.element == ir.FloatType() else 64
        vec = builder.bitcast(vec, ir.VectorType(ir.IntType(width), lanes))
    vt = vec.type
    mv = _mask(builder, m, lanes)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vt, [vt, mv.type, vt]),
        f"llvm.experimental.vector.compress.{_suffix(vt)}")
    packed = builder.call(fn, [vec, mv, ir.Constant(vt, None)])
    builder.store(packed, builder.bitcast(dp, vt.as_pointer()), align=4)


@intrinsic
def compress_store(typingctx, src, k, dst, d, mask):  # noqa: ANN001, ANN201
    """dst[d:d + L] = the lanes of src[k:k + L] whose bit in ``mask`` is set, packed to the
    front; the lanes after popcount(mask) are left undefined (dst needs room for all L)."""
    sig = types.void(src, types.intp, dst, types.intp, types.uint64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        s, k_, t, d_, m = args
        vt, lanes, sp = _lanes(context, builder, signature.args[0], s, k_)
        _, _, dp = _lanes(context, builder, signature.args[2], t, d_)
        vec = builder.load(builder.bitcast(sp, vt.as_pointer()), align=4)
        _store_packed(builder, vec, m, lanes, dp)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def expand_load(typingctx, src, v, dst, k, mask, fill_mask, fill):  # noqa: ANN001, ANN201
    """dst[k:k + L] = src[v], src[v + 1], ... in the lanes whose bit in ``mask`` is set,
    ``fill`` in the lanes of ``fill_mask``, 0 elsewhere. Reads popcount(mask) entries of src."""
    sig = types.void(src, types.intp, dst, types.intp, types.uint64, types.uint64, fill)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        s, v_, t, k_, m, fm, f = args
        vt, lanes, sp = _lanes(context, builder, signature.args[0], s, v_)
        _, _, dp = _lanes(context, builder, signature.args[2], t, k_)
        mv, fv = _mask(builder, m, lanes), _mask(builder, fm, lanes)
        f = context.cast(builder, f, signature.args[6], signature.args[0].dtype)
        splat = ir.Constant(vt, None)
        for i in range(lanes):
            splat = builder.insert_element(splat, f, ir.Constant(ir.IntType(32), i))
        passthru = builder.select(fv, splat, ir.Constant(vt, None))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vt, [sp.type, mv.type, vt]),
            f"llvm.masked.expandload.{_suffix(vt)}")
        out = builder.call(fn, [sp, mv, passthru])
        builder.store(out, builder.bitcast(dp, vt.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def popcount(typingctx, m):  # noqa: ANN001, ANN201
    """Set bits of a uint64."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), [ir.IntType(64)]), "llvm.ctpop.i64")
        return builder.call(fn, [args[0]])

    return sig, codegen


def _load(context, builder, arrty, arr, index):  # noqa: ANN001, ANN202
    vt, lanes, ptr = _lanes(context, builder, arrty, arr, index)
    return builder.load(builder.bitcast(ptr, vt.as_pointer()), align=4), vt, lanes


def _bits(builder, cond, lanes):  # noqa: ANN001, ANN202
    """<lanes x i1> as a uint64 (bit i = lane i)."""
    return builder.zext(builder.bitcast(cond, ir.IntType(lanes)), ir.IntType(64))


@intrinsic
def nonzero_lanes(typingctx, src, k):  # noqa: ANN001, ANN201
    """Bit i set where src[k + i] != 0 (an integer array: bit patterns)."""
    sig = types.uint64(src, types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        vec, vt, lanes = _load(context, builder, signature.args[0], args[0], args[1])
        return _bits(builder, builder.icmp_unsigned("!=", vec, ir.Constant(vt, None)), lanes)

    return sig, codegen


@intrinsic
def equal_lanes(typingctx, src, k, value):  # noqa: ANN001, ANN201
    """Bit i set where src[k + i] == value (an integer array: bit patterns)."""
    sig = types.uint64(src, types.intp, value)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        vec, vt, lanes = _load(context, builder, signature.args[0], args[0], args[1])
        v = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
        splat = ir.Constant(vt, None)
        for i in range(lanes):
            splat = builder.insert_element(splat, v, ir.Constant(ir.IntType(32), i))
        return _bits(builder, builder.icmp_unsigned("==", vec, splat), lanes)

    return sig, codegen


@intrinsic
def slope_lanes(typingctx, src, k, cap):  # noqa: ANN001, ANN201
    """Bit i set where 0 < src[k + i] (< cap when cap >= 0), compared in float64 as the
    scalar kernels do (a float32 cap may not be representable)."""
    sig = types.uint64(src, types.intp, types.float64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        if signature.args[0].dtype == types.uint16:  # bfloat16: 16 lanes, as float32's
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ht = ir.VectorType(ir.IntType(16), 16)
            ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ht.as_pointer())
            vt, lanes = ir.VectorType(ir.FloatType(), 16), 16
            vec = widen(builder, builder.load(ptr, align=2), vt)
        else:
            vec, vt, lanes = _load(context, builder, signature.args[0], args[0], args[1])
        dt = ir.VectorType(ir.DoubleType(), lanes)
        if vt.element != ir.DoubleType():
            vec = builder.fpext(vec, dt)
        splat = ir.Constant(dt, None)
        for i in range(lanes):
            splat = builder.insert_element(splat, args[2], ir.Constant(ir.IntType(32), i))
        positive = builder.fcmp_ordered(">", vec, ir.Constant(dt, None))
        below = builder.fcmp_ordered("<", vec, splat)
        no_cap = builder.fcmp_ordered("<", args[2], ir.Constant(ir.DoubleType(), 0.0))
        keep = builder.and_(positive, builder.select(no_cap, positive, below))
        return _bits(builder, keep, lanes)

    return sig, codegen


@intrinsic
def expand_add(typingctx, src, v, dst, k, mask):  # noqa: ANN001, ANN201
    """dst[k:k + L] += src[v], src[v + 1], ... in the lanes whose bit in ``mask`` is set (0.0
    added elsewhere). Reads popcount(mask) entries of src."""
    sig = types.void(src, types.intp, dst, types.intp, types.uint64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        s, v_, t, k_, m = args
        vt, lanes, sp = _lanes(context, builder, signature.args[0], s, v_)
        _, _, dp = _lanes(context, builder, signature.args[2], t, k_)
        mv = _mask(builder, m, lanes)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vt, [sp.type, mv.type, vt]),
            f"llvm.masked.expandload.{_suffix(vt)}")
        values = builder.call(fn, [sp, mv, ir.Constant(vt, None)])
        target = builder.bitcast(dp, vt.as_pointer())
        builder.store(builder.fadd(builder.load(target, align=4), values), target, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def above_lanes(typingctx, src, k, t):  # noqa: ANN001, ANN201
    """Bit i set where |src[k + i]| > t (a float array; t of its type: the caller rounds a
    wider threshold down, which keeps the comparison exact)."""
    sig = types.uint64(src, types.intp, src.dtype)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        vec, vt, lanes = _load(context, builder, signature.args[0], args[0], args[1])
        fabs = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vt, [vt]), f"llvm.fabs.{_suffix(vt)}")
        vec = builder.call(fabs, [vec])
        splat = ir.Constant(vt, None)
        for i in range(lanes):
            splat = builder.insert_element(splat, args[2], ir.Constant(ir.IntType(32), i))
        return _bits(builder, builder.fcmp_ordered(">", vec, splat), lanes)

    return sig, codegen


@intrinsic
def compress_iota(typingctx, k, dst, d, mask):  # noqa: ANN001, ANN201
    """dst[d:d + L] = the positions k + i (i < L = 64 bytes / dst's item size) whose bit in
    ``mask`` is set, packed to the front: the indices of a vector compress, made in a register
    instead of read from memory."""
    sig = types.void(types.intp, dst, types.intp, types.uint64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        k_, t, d_, m = args
        vt, lanes, dp = _lanes(context, builder, signature.args[1], t, d_)
        start = builder.trunc(k_, vt.element) if vt.element.width < 64 else k_
        splat = ir.Constant(vt, None)
        for i in range(lanes):
            splat = builder.insert_element(splat, start, ir.Constant(ir.IntType(32), i))
        iota = ir.Constant(vt, [ir.Constant(vt.element, i) for i in range(lanes)])
        _store_packed(builder, builder.add(splat, iota), m, lanes, dp)
        return context.get_dummy_value()

    return sig, codegen
