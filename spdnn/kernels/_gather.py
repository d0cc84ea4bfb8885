"""Register-blocked gathers for the numba kernels, written as LLVM IR.

Each gathered row of the right-hand block is read through one block of its columns (up to 8
vectors of 512 bits: 128 float32 or 64 float64) while the block's accumulators stay in
registers for the whole row of W, and the rows ``pf`` entries ahead are prefetched. Written in
plain numba, the accumulators went through memory and nothing was prefetched, and W X ran
near half the speed of this and of PyTorch's embedding_bag (fbgemm, which generates the same
shape of code; docs/BENCHMARKS.md, "Kernels"). LLVM splits the 512-bit vectors
into what the CPU has (two 256-bit halves without AVX-512). Sums run in entry order with fused
multiply-adds; a dot product's lanes are added as a halving tree.

The blocks cover n = ``rem`` columns with ``nvec`` vectors (n = nvec x lanes for a full block;
a partial block's last vector keeps only its lanes below n, so a column sums exactly as in a
full block, wherever it sits in the batch, and no scalar loop is needed). ``AXPY[0]`` is the
full block of 8 vectors, ``AXPY[nvec]`` the partial block of nvec vectors; DOT, AXPY_DOT alike:
- ``AXPY[i](acc, k, x, ld, col, indices, data, e0, e1, rem, pf)``:
  acc[k:k+n] += sum over e in [e0, e1) of data[e] * x[indices[e] * ld + col:...+n];
- ``DOT[...](a, ka, x, ld, col, indices, out, e0, e1, first, rem, pf)``:
  out[e] (= when ``first``, else +=) a[ka:ka+n] . x[indices[e] * ld + col:...+n];
- ``AXPY_DOT[...](acc, k, d, ld, col, indices, data, xj, kx, grad, order, e0, e1, first,
  rem, pf, z, kz, cap, slope, sums, at_sum)``: the axpy of d's rows (weights
  data[order[e]]: W's values, read through the transpose's map) into acc, times ReLU's
  slope at z[kz:kz+n] (0 < z, and z < cap when cap >= 0) when ``slope``, and grad[order[e]]
  (=, +=) d's row . xj[kx:kx+n]; when ``sums`` is not empty, sums[at_sum] (=, +=) the sum of
  what acc received.
Arrays are 1-D C-contiguous (flat views of the row-major blocks).

numba's cache does not follow imports: after changing this file or _vectors.py, touch
_numba_products.py (an installed upgrade rewrites all three) or its cached kernels keep the old
blocks.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from spdnn.kernels._vectors import (
    activation,
    entries,
    fma,
    gathered,
    hsum,
    index_at,
    is_half,
    load_value,
    narrow,
    prefetch_ahead,
    prefetch_value,
    registers,
    same_float,
    setup,
    slope_lanes,
    splat,
    store_dot,
    vload,
    vstore,
    widen,
)

MAX_VECTORS = 8
PREFETCH_AHEAD = 16  # entries; fbgemm's default too (16 measured best of 0, 8, 16 here)


def _make_axpy(nvec: int, masked: bool):  # noqa: ANN202
    names = ("acc", "k", "x", "ld", "col", "indices", "data", "e0", "e1", "rem", "pf",
             "start", "fresh", "act", "ka", "cap", "activate", "alive")

    @intrinsic
    def axpy(typingctx, acc, k, x, ld, col, indices, data, e0, e1, rem, pf, start, fresh,  # noqa: ANN001, ANN202
             act, ka, cap, activate, alive):
        same_float(acc, x)
        same_float(act, x)
        sig = types.void(acc, types.intp, x, types.intp, types.intp, indices, data,
                         types.intp, types.intp, types.intp, types.intp, start, types.intp,
                         act, types.intp, types.float64, types.intp, alive)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a, v = setup(context, builder, signature, args, names, nvec, masked)
            out = builder.gep(a.ptr["acc"], [v["k"]])
            regs = registers(builder, a, out, nvec)
            fresh = builder.icmp_signed("!=", v["fresh"], ir.Constant(v["fresh"].type, 0))
            first = splat(builder, v["start"], a.vt)
            for r in range(nvec):  # a fresh row starts at ``start`` (its bias, or 0)
                builder.store(builder.select(fresh, first, builder.load(regs[r])), regs[r])
            with entries(builder, v) as (e, _):
                prefetch_ahead(builder, a, e, v["pf"], v["ld"], v["col"], nvec)
                xr = gathered(builder, a, e, v["ld"], v["col"], nvec)
                w = splat(builder, load_value(builder, builder.gep(a.ptr["data"], [e])), a.vt)
                for r in range(nvec):
                    builder.store(fma(builder, a.vt, w, xr[r], builder.load(regs[r])),
                                  regs[r])
            z = [builder.load(regs[r]) for r in range(nvec)]
            for r in range(nvec):
                vstore(builder, a, z[r], out, r)
            on = builder.icmp_signed("!=", v["activate"], ir.Constant(v["activate"].type, 0))
            with builder.if_then(on):
                activation(builder, a, v, z, nvec)
            return context.get_dummy_value()
        return sig, codegen
    return axpy


def _make_dot(nvec: int, masked: bool):  # noqa: ANN202
    names = ("a", "ka", "x", "ld", "col", "indices", "out", "e0", "e1", "first", "rem", "pf")

    @intrinsic
    def dot(typingctx, a_, ka, x, ld, col, indices, out, e0, e1, first, rem, pf):  # noqa: ANN001, ANN202
        same_float(a_, x)
        sig = types.void(a_, types.intp, x, types.intp, types.intp, indices, out, types.intp,
                         types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a, v = setup(context, builder, signature, args, names, nvec, masked)
            regs = registers(builder, a, builder.gep(a.ptr["a"], [v["ka"]]), nvec)
            with entries(builder, v) as (e, _):
                prefetch_ahead(builder, a, e, v["pf"], v["ld"], v["col"], nvec)
                xr = gathered(builder, a, e, v["ld"], v["col"], nvec)
                s = builder.fmul(builder.load(regs[0]), xr[0])
                for r in range(1, nvec):
                    s = fma(builder, a.vt, builder.load(regs[r]), xr[r], s)
                store_dot(builder, a, hsum(builder, s), builder.gep(a.ptr["out"], [e]),
                           v["first"])
            return context.get_dummy_value()
        return sig, codegen
    return dot


def _make_axpy_dot(nvec: int, masked: bool):  # noqa: ANN202
    names = ("acc", "k", "x", "ld", "col", "indices", "data", "xj", "kx", "grad", "order",
             "e0", "e1", "first", "rem", "pf", "z", "kz", "cap", "slope", "sums", "at_sum")

    @intrinsic
    def axpy_dot(typingctx, acc, k, d, ld, col, indices, data, xj, kx, grad, order, e0, e1,  # noqa: ANN001, ANN202
                 first, rem, pf, z, kz, cap, slope, sums, at_sum):
        same_float(acc, d)
        same_float(xj, d)
        same_float(z, d)
        ip = types.intp
        sig = types.void(acc, ip, d, ip, ip, indices, data, xj, ip, grad, order, ip, ip, ip,
                         ip, ip, z, ip, types.float64, ip, sums, ip)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a, v = setup(context, builder, signature, args, names, nvec, masked)
            out = builder.gep(a.ptr["acc"], [v["k"]])
            regs = registers(builder, a, out, nvec)
            xregs = registers(builder, a, builder.gep(a.ptr["xj"], [v["kx"]]), nvec)
            with entries(builder, v) as (e, _):
                prefetch_ahead(builder, a, e, v["pf"], v["ld"], v["col"], nvec)
                prefetch_value(builder, a, e, v["pf"])
                dr = gathered(builder, a, e, v["ld"], v["col"], nvec)
                at = index_at(builder, a, "order", e)  # W's entry: its value and its gradient
                w = splat(builder, load_value(builder, builder.gep(a.ptr["data"], [at])), a.vt)
                s = None
                for r in range(nvec):
                    dv = dr[r]
                    builder.store(fma(builder, a.vt, w, dv, builder.load(regs[r])), regs[r])
                    s = builder.fmul(dv, builder.load(xregs[r])) if s is None else \
                        fma(builder, a.vt, dv, builder.load(xregs[r]), s)
                where = builder.gep(a.ptr["grad"], [at])
                store_dot(builder, a, hsum(builder, s), where, v["first"])
            values = [builder.load(regs[r]) for r in range(nvec)]
            on = builder.icmp_signed("!=", v["slope"], ir.Constant(v["slope"].type, 0))
            zrow = builder.gep(a.ptr["z"], [v["kz"]])
            for r in range(nvec):  # times h'(z): ReLU's slope, in registers
                keep = slope_lanes(builder, a, v, vload(builder, a, zrow, r))
                keep = builder.select(on, keep, ir.Constant(keep.type, [1] * a.lanes))
                zero = builder.fmul(values[r], ir.Constant(a.vt, [0.0] * a.lanes))
                values[r] = builder.select(keep, values[r], zero)
                vstore(builder, a, values[r], out, r)
            with builder.if_then(builder.icmp_signed(">", a.len["sums"], a.const(0))):
                total = values[0]  # the row's sum of what was stored (rounded, if so)
                if is_half(a.ptr["acc"].type.pointee):
                    values = [widen(builder, narrow(builder, x), a.vt) for x in values]
                    total = values[0]
                for r in range(1, nvec):
                    total = builder.fadd(total, values[r])
                store_dot(builder, a, hsum(builder, total),
                          builder.gep(a.ptr["sums"], [v["at_sum"]]), v["first"])
            return context.get_dummy_value()
        return sig, codegen
    return axpy_dot


# A full block of MAX_VECTORS vectors, and partial blocks of 1 to 8 vectors (the last masked).
# The one-pass backward keeps the block's x row in registers beside its accumulators, twice the
# registers of the others: its blocks are half as wide (on AVX2, 8 + 8 of the 16 registers).
# Measured side by side (scripts/bench/bench_ab.py --steps): the training step was faster than
# with blocks of 8, and the pass alone faster than with blocks of 8 or of 2.
AXPY_DOT_VECTORS = 4
PARTIAL = tuple(range(1, MAX_VECTORS + 1))
AXPY = (_make_axpy(MAX_VECTORS, False),) + tuple(_make_axpy(n, True) for n in PARTIAL)
DOT = (_make_dot(MAX_VECTORS, False),) + tuple(_make_dot(n, True) for n in PARTIAL)
AXPY_DOT = (_make_axpy_dot(AXPY_DOT_VECTORS, False),) + tuple(
    _make_axpy_dot(n, True) for n in range(1, AXPY_DOT_VECTORS + 1))
