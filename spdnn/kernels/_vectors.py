"""LLVM IR building blocks of spdnn.kernels._gather's register-blocked gathers: the arrays'
pointers, 512-bit vectors of the block's float type (LLVM splits them into what the CPU has),
the mask of a partial block's last vector, loads and stores, fused multiply-adds, a halving-tree
horizontal sum, and prefetches of the rows ahead.

An array of bfloat16 bits (uint16: spdnn.kernels.bfloat16) is read as float32 lanes, widened
by a shift as it is loaded, and rounded to nearest even as it is stored; the registers and
every sum are float32.

numba's cache does not follow imports: after changing this file, touch _numba_products.py.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError

I32 = ir.IntType(32)
I16 = ir.IntType(16)


def is_half(ty) -> bool:  # noqa: ANN001
    return isinstance(ty, ir.IntType) and ty.width == 16


def widen(builder, bits, vt):  # noqa: ANN001, ANN202
    """bfloat16 bits (i16, or a vector of them) as float32 (``vt``: the float type)."""
    wide = builder.zext(bits, I32 if vt == ir.FloatType() else ir.VectorType(I32, vt.count))
    shift = ir.Constant(wide.type, 16 if vt == ir.FloatType() else [16] * vt.count)
    return builder.bitcast(builder.shl(wide, shift), vt)


def narrow(builder, value):  # noqa: ANN001, ANN202
    """float32 values (a scalar or a vector) rounded to nearest even as bfloat16 bits; NaN
    stays a quiet NaN."""
    scalar = value.type == ir.FloatType()
    n = 1 if scalar else value.type.count
    it = I32 if scalar else ir.VectorType(I32, n)

    def const(v: int) -> ir.Constant:
        return ir.Constant(it, v if scalar else [v] * n)
    bits = builder.bitcast(value, it)
    lsb = builder.and_(builder.lshr(bits, const(16)), const(1))
    up = builder.lshr(builder.add(builder.add(bits, const(0x7FFF)), lsb), const(16))
    nan = builder.fcmp_unordered("uno", value, value)
    up = builder.select(nan, const(0x7FC0), up)
    return builder.trunc(up, I16 if scalar else ir.VectorType(I16, n))


def load_value(builder, ptr, ty=None):  # noqa: ANN001, ANN202
    """The element at ``ptr`` as a number (bfloat16 bits widened to float32)."""
    v = builder.load(ptr)
    return widen(builder, v, ir.FloatType()) if is_half(v.type) else v


class Arrays:
    """Data pointers and lengths of the intrinsic's array arguments, the vector type of the
    block and, for a partial block, the mask of its last vector."""

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
        if is_half(elt):  # bfloat16 blocks: float32 registers
            elt = ir.FloatType()
        self.lanes = 512 // (32 if elt == ir.FloatType() else 64)
        self.vt = ir.VectorType(elt, self.lanes)
        self.mask = None  # the lanes kept in the block's last vector (None: every lane)
        self.last = -1

    def const(self, v: int) -> ir.Constant:
        return ir.Constant(self.intp, v)

    def mask_lanes(self, builder, rem, nvec: int) -> None:  # noqa: ANN001
        """The last vector keeps its lanes l with (nvec - 1) * lanes + l < rem; the others
        are whole (one mask: with a mask per vector, the masks and 8 accumulators did not fit
        the 16 registers of AVX2, and the loop spilled and re-expanded them)."""
        iota = ir.Constant(ir.VectorType(self.intp, self.lanes), list(range(self.lanes)))
        vi = ir.VectorType(self.intp, self.lanes)
        self.last = nvec - 1
        keep = builder.sub(rem, self.const(self.last * self.lanes))
        self.mask = builder.icmp_signed("<", iota, splat(builder, keep, vi))
        # The same lanes as all-ones words, for an AND after a plain load: the sign of
        # lane - keep, without an i1 vector, which LLVM keeps packed on AVX2 and unpacks again
        # in every iteration (8 instructions a vector).
        width = 32 if self.vt.element == ir.FloatType() else 64
        self.bits = ir.VectorType(ir.IntType(width), self.lanes)
        lane = ir.Constant(self.bits, list(range(self.lanes)))
        below = builder.sub(lane, splat(builder, builder.trunc(keep, ir.IntType(width)),
                                        self.bits))
        self.and_mask = builder.ashr(below, ir.Constant(self.bits, [width - 1] * self.lanes))

    def masked(self, r: int):  # noqa: ANN201
        """The mask of vector r, or None where it is whole."""
        return self.mask if r == self.last else None


def index_at(builder, a: Arrays, name: str, at):  # noqa: ANN001, ANN202
    v = builder.load(builder.gep(a.ptr[name], [at]))
    return builder.sext(v, a.intp) if v.type.width < 64 else v


def masked_op(builder, vt, what: str, args: list):  # noqa: ANN001, ANN202
    """llvm.masked.load or .store of a vector of type ``vt`` (float, int32 or int16 lanes)."""
    names = {ir.FloatType(): "f32", ir.DoubleType(): "f64", ir.IntType(32): "i32", I16: "i16"}
    kind = f"v{vt.count}{names[vt.element]}"
    vp, mt = vt.as_pointer(), ir.VectorType(ir.IntType(1), vt.count)
    if what == "load":
        fnty = ir.FunctionType(vt, [vp, I32, mt, vt])
    else:
        fnty = ir.FunctionType(ir.VoidType(), [vt, vp, I32, mt])
    fn = cgutils.get_or_insert_function(builder.module, fnty,
                                        f"llvm.masked.{what}.{kind}.p0{kind}")
    return builder.call(fn, args)


def vload(builder, a: Arrays, base, r: int, vt=None, whole: bool = False):  # noqa: ANN001, ANN202
    """Vector r of the block at ``base`` (of the block's float type, or ``vt``; bfloat16 bits
    widened); in the last vector of a partial block, lanes past the batch read as 0 (unless
    ``whole``)."""
    vt = vt or a.vt
    half = is_half(base.type.pointee) and not isinstance(vt.element, ir.IntType)
    lt = ir.VectorType(I16, vt.count) if half else vt
    p = builder.bitcast(builder.gep(base, [a.const(r * a.lanes)]), lt.as_pointer())
    if whole or a.masked(r) is None:
        v = builder.load(p, align=2 if half else 4)
    else:
        v = masked_op(builder, lt, "load", [p, ir.Constant(I32, 2 if half else 4), a.mask,
                                            ir.Constant(lt, [0] * a.lanes)])
    return widen(builder, v, vt) if half else v


def vstore(builder, a: Arrays, value, base, r: int, whole: bool = False) -> None:  # noqa: ANN001
    """Store vector r at ``base`` (rounded to bfloat16 where ``base`` holds its bits): masked
    in the last vector of a partial block, unless ``whole``."""
    half = is_half(base.type.pointee) and not isinstance(value.type.element, ir.IntType)
    if half:
        value = narrow(builder, value)
    p = builder.bitcast(builder.gep(base, [a.const(r * a.lanes)]), value.type.as_pointer())
    align = 2 if half else 4
    if whole or a.masked(r) is None:
        builder.store(value, p, align=align)
    else:
        masked_op(builder, value.type, "store", [value, p, ir.Constant(I32, align), a.mask])


def fma(builder, vt, x, y, z):  # noqa: ANN001, ANN202
    kind = "f32" if vt.element == ir.FloatType() else "f64"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                        f"llvm.fma.v{vt.count}{kind}")
    return builder.call(fn, [x, y, z])


def cast(builder, value, ty):  # noqa: ANN001, ANN202
    """A float value in the float type ``ty`` (weights and blocks may differ in precision)."""
    if value.type == ty:
        return value
    wide = ty == ir.DoubleType()
    return builder.fpext(value, ty) if wide else builder.fptrunc(value, ty)


def splat(builder, value, vt):  # noqa: ANN001, ANN202
    if not isinstance(vt.element, ir.IntType):
        value = cast(builder, value, vt.element)
    undef = ir.Constant(vt, None)
    one = builder.insert_element(undef, value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, vt.count), None))


def hsum(builder, v):  # noqa: ANN001, ANN202
    """The lanes of ``v`` added as a halving tree."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n),
                                                      list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(I32, 0))


def prefetch_ahead(builder, a: Arrays, e, pf, ld, col, nvec: int) -> None:  # noqa: ANN001
    """Prefetch the block of the row named ``pf`` entries after e (when there is one)."""
    ahead = builder.add(e, pf)
    with builder.if_then(builder.icmp_signed("<", ahead, a.len["indices"]), likely=True):
        row = index_at(builder, a, "indices", ahead)
        base = builder.gep(a.ptr["x"], [builder.add(builder.mul(row, ld), col)])
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, I32, I32, I32]),
            "llvm.prefetch.p0i8")
        # a 512-bit vector is one 64-byte cache line; one of bfloat16's is half of one
        for r in range(0, nvec, 2 if is_half(a.ptr["x"].type.pointee) else 1):
            p = builder.bitcast(builder.gep(base, [a.const(r * a.lanes)]), i8p)
            builder.call(fn, [p, ir.Constant(I32, 0), ir.Constant(I32, 3),
                              ir.Constant(I32, 1)])


def prefetch_value(builder, a: Arrays, e, pf) -> None:  # noqa: ANN001
    """Prefetch the value ``pf`` entries after e, data[order[e + pf]]: W's values read
    through the transpose's map are scattered, and each one is needed before its row's
    multiply-adds can start."""
    ahead = builder.add(e, pf)
    with builder.if_then(builder.icmp_signed("<", ahead, a.len["order"]), likely=True):
        at = index_at(builder, a, "order", ahead)
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, I32, I32, I32]),
            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(builder.gep(a.ptr["data"], [at]), i8p),
                          ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def gathered(builder, a: Arrays, e, ld, col, nvec: int) -> list:  # noqa: ANN001
    """The block of the row named by entry e, as vectors. In a partial block, the last
    vector's lanes past the batch read as 0: by a plain load and an AND where the vector
    lies inside x (a masked load costs more on AMD's Zen 3), by a masked load at x's end."""
    row = index_at(builder, a, "indices", e)
    at = builder.add(builder.mul(row, ld), col)
    base = builder.gep(a.ptr["x"], [at])
    whole = [vload(builder, a, base, r) for r in range(nvec if a.mask is None else a.last)]
    if a.mask is None:
        return whole
    fits = builder.icmp_signed("<=", builder.add(at, a.const(nvec * a.lanes)), a.len["x"])
    with builder.if_else(fits, likely=True) as (inside, at_end):
        with inside:
            loaded = vload(builder, a, base, a.last, whole=True)
            word = builder.and_(builder.bitcast(loaded, a.bits), a.and_mask)
            plain = builder.bitcast(word, a.vt)
            from_inside = builder.block
        with at_end:
            masked = vload(builder, a, base, a.last)
            from_end = builder.block
    phi = builder.phi(a.vt)
    phi.add_incoming(plain, from_inside)
    phi.add_incoming(masked, from_end)
    return whole + [phi]


def registers(builder, a: Arrays, base, nvec: int) -> list:  # noqa: ANN001
    slots = []
    for r in range(nvec):
        slot = cgutils.alloca_once(builder, a.vt)  # promoted to a register by mem2reg
        builder.store(vload(builder, a, base, r), slot)
        slots.append(slot)
    return slots


def store_dot(builder, a: Arrays, dot, where, first) -> None:  # noqa: ANN001
    if is_half(where.type.pointee):
        raise TypingError("dot products are stored in float32 or float64, not bfloat16")
    dot = cast(builder, dot, where.type.pointee)
    with builder.if_else(builder.icmp_signed("!=", first, ir.Constant(first.type, 0))) as (
            then, other):
        with then:
            builder.store(dot, where)
        with other:
            builder.store(builder.fadd(builder.load(where), dot), where)


def same_float(a, b) -> None:  # noqa: ANN001
    """Blocks read as vectors must share one float type (registers are of one type; bfloat16
    bits, uint16, are read as float32)."""
    def register(t):  # noqa: ANN001, ANN202
        return types.float32 if t == types.uint16 else t
    ra, rb = register(a.dtype), register(b.dtype)
    if ra != rb or ra not in (types.float32, types.float64):
        raise TypingError(f"gathered blocks must both be float32 (or bfloat16) or float64, "
                          f"not {a.dtype} and {b.dtype}")


def setup(context, builder, signature, args, names, nvec, masked):  # noqa: ANN001, ANN202
    a = Arrays(context, builder, signature, args, names)
    if masked:
        a.mask_lanes(builder, args[names.index("rem")], nvec)
    return a, dict(zip(names, args))


def entries(builder, v: dict):  # noqa: ANN001, ANN202
    return cgutils.for_range_slice(builder, v["e0"], v["e1"], ir.Constant(v["e0"].type, 1),
                                   inc=True)


def activation(builder, a: Arrays, v: dict, z: list, nvec: int) -> None:  # noqa: ANN001
    """act[ka:] = h(z): ReLU, then the cap where cap >= 0, as comparisons (NaN and -0.0 pass
    through); and alive[col + lane] = 1 for every nonzero lane, when alive is not empty.
    In registers: written as loops over the stored row, a row's tail re-read what the block
    had just stored and cost as much as its sum at narrow widths."""
    zero = ir.Constant(a.vt, [0.0] * a.lanes)
    act = builder.gep(a.ptr["act"], [v["ka"]])
    track = builder.icmp_signed(">", a.len["alive"], a.const(0))
    flags = ir.VectorType(ir.IntType(32), a.lanes)
    alive = builder.gep(a.ptr["alive"], [v["col"]])
    for r in range(nvec):
        h = relu_cap(builder, a, v, z[r])
        vstore(builder, a, h, act, r)
        with builder.if_then(track):
            live = builder.zext(builder.fcmp_unordered("!=", h, zero), flags)
            vstore(builder, a, builder.or_(vload(builder, a, alive, r, flags), live), alive, r)


def slope_lanes(builder, a: Arrays, v: dict, z):  # noqa: ANN001, ANN202
    """The lanes where ReLU's slope is 1: 0 < z, and z < v["cap"] where it is >= 0 (NaN: 0)."""
    zero = ir.Constant(a.vt, [0.0] * a.lanes)
    cap = splat(builder, v["cap"], a.vt)
    uncapped = builder.fcmp_ordered("<", v["cap"], ir.Constant(ir.DoubleType(), 0.0))
    below = builder.or_(builder.fcmp_ordered("<", z, cap),
                        splat(builder, uncapped, ir.VectorType(ir.IntType(1), a.lanes)))
    return builder.and_(builder.fcmp_ordered(">", z, zero), below)


def relu_cap(builder, a: Arrays, v: dict, z):  # noqa: ANN001, ANN202
    """h(z): ReLU, then the cap where v["cap"] >= 0, as comparisons (NaN and -0.0 pass)."""
    zero = ir.Constant(a.vt, [0.0] * a.lanes)
    cap = splat(builder, v["cap"], a.vt)
    capped = builder.fcmp_ordered(">=", v["cap"], ir.Constant(ir.DoubleType(), 0.0))
    h = builder.select(builder.fcmp_ordered("<", z, zero), zero, z)
    return builder.select(capped, builder.select(builder.fcmp_ordered(">", h, cap), cap, h), h)
