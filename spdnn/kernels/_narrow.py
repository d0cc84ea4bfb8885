"""The gather of spdnn.kernels._gather for narrow batches (up to 4 vectors of 256 bits: 32
float32 or 16 float64 columns), a group of rows at a time, written as LLVM IR.

Once most samples have died (Graph Challenge inference keeps 19 of 1,200 after a few layers),
the blocks of 512-bit vectors cost a row its set-up, masked stores and prefetches, and half
their lanes were idle: a narrow batch took as long as one of 32 columns.
Here a vector is 256 bits, nothing is prefetched (x is small, or its rows are as likely cached
as not), the rows of a group advance together (entry j of each in turn, each row still adding
its own entries in order from the same start, so every bit equals the block's), a row's last
vector is stored whole where the lanes past the batch fall on rows this call writes afterwards
(``limit``), and the group's live-column flags are merged in registers and stored once.

``NARROW[nvec][0 or 1](acc, ko, x, ld, indices, data, starts, ends, i, rem, bias, init, act,
ka, cap, activate, alive, limit_o, limit_a)``, one row ([0]) or GROUP[nvec] rows ([1]) from
row i: over entries [starts[row], ends[row]), acc[row * ko : ... + rem] = start + sum_e data[e]
x[indices[e] * ld : ... + rem], where start is bias[row] (``init`` 1), 0 (2) or acc's own values
(0); with ``activate``, act[row * ka : ... + rem] = h(acc) and alive[c] |= (h != 0) when alive
is not empty. The last vector may be stored whole where it ends by ``limit_o`` (acc) or
``limit_a`` (act), 0 for never. Arrays are flat (1-D C-contiguous).

numba's cache does not follow imports: after changing this file, touch _numba_products.py.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from spdnn.kernels._vectors import (
    Arrays,
    cast,
    fma,
    gathered,
    index_at,
    load_value,
    relu_cap,
    same_float,
    splat,
    vload,
    vstore,
)

# A row is ``nvec`` vectors of 256 bits (8 float32 or 4 float64), and GROUP[nvec] rows advance
# together: pairs of rows were fastest up to 2 vectors (fours were slower), one row at a time
# from 3 (pairs were slower there), each well ahead of the 512-bit blocks. 5 to 8 vectors gained
# at widths 48 and 64 as well, but doubled the time to compile spmm_rows.
GROUP = {1: 2, 2: 2, 3: 1, 4: 1}
_NAMES = ("acc", "ko", "x", "ld", "indices", "data", "starts", "ends", "i", "rem", "bias",
          "init", "act", "ka", "cap", "activate", "alive", "limit_o", "limit_a")


def _store(builder, a, value, base, k, q: int, limit) -> None:  # noqa: ANN001
    """Vector q of the row at flat offset k: whole where it ends by ``limit``, else masked."""
    if a.masked(q) is None:
        vstore(builder, a, value, base, q)
        return
    end = builder.add(k, a.const((q + 1) * a.lanes))
    with builder.if_else(builder.icmp_signed("<=", end, limit), likely=True) as (whole, part):
        with whole:
            vstore(builder, a, value, base, q, whole=True)
        with part:
            vstore(builder, a, value, base, q)


def _make_narrow(nvec: int, rows: int):  # noqa: ANN202
    @intrinsic
    def narrow(typingctx, acc, ko, x, ld, indices, data, starts, ends, i, rem, bias, init,  # noqa: ANN001, ANN202
               act, ka, cap, activate, alive, limit_o, limit_a):
        same_float(acc, x)
        same_float(act, x)
        ip = types.intp
        sig = types.void(acc, ip, x, ip, indices, data, starts, ends, ip, ip, bias, ip, act, ip,
                         types.float64, ip, alive, ip, ip)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            a, v = Arrays(context, builder, signature, args, _NAMES), dict(zip(_NAMES, args))
            a.lanes = 8 if a.vt.element == ir.FloatType() else 4  # 256 bits
            a.vt = ir.VectorType(a.vt.element, a.lanes)
            a.mask_lanes(builder, v["rem"], nvec)
            init = v["init"]
            first = [builder.add(v["i"], a.const(r)) for r in range(rows)]
            lo = [index_at(builder, a, "starts", row) for row in first]
            hi = [index_at(builder, a, "ends", row) for row in first]
            k = [builder.mul(row, v["ko"]) for row in first]
            out = [builder.gep(a.ptr["acc"], [kr]) for kr in k]
            regs = [[cgutils.alloca_once(builder, a.vt) for _ in range(nvec)]
                    for _ in range(rows)]
            keep = builder.icmp_signed("==", init, ir.Constant(init.type, 0))
            with builder.if_else(keep) as (accumulate, fresh):
                with accumulate:
                    for r in range(rows):
                        for q in range(nvec):
                            builder.store(vload(builder, a, out[r], q), regs[r][q])
                with fresh:
                    one = builder.icmp_signed("==", init, ir.Constant(init.type, 1))
                    for r in range(rows):
                        s = cgutils.alloca_once(builder, a.vt.element)
                        builder.store(ir.Constant(a.vt.element, 0.0), s)
                        with builder.if_then(one):
                            b = builder.load(builder.gep(a.ptr["bias"], [first[r]]))
                            builder.store(cast(builder, b, a.vt.element), s)
                        start = splat(builder, builder.load(s), a.vt)
                        for q in range(nvec):
                            builder.store(start, regs[r][q])

            def add_entry(r: int, e) -> None:  # noqa: ANN001
                xr = gathered(builder, a, e, v["ld"], a.const(0), nvec)
                w = splat(builder, load_value(builder, builder.gep(a.ptr["data"], [e])), a.vt)
                for q in range(nvec):
                    builder.store(fma(builder, a.vt, w, xr[q], builder.load(regs[r][q])),
                                  regs[r][q])

            common = builder.sub(hi[0], lo[0])
            for r in range(1, rows):
                n = builder.sub(hi[r], lo[r])
                common = builder.select(builder.icmp_signed("<", n, common), n, common)
            common = builder.select(builder.icmp_signed("<", common, a.const(0)), a.const(0),
                                    common)
            with cgutils.for_range(builder, common) as loop:  # entry j of every row in turn
                for r in range(rows):
                    add_entry(r, builder.add(lo[r], loop.index))
            for r in range(rows):  # then each row's own remaining entries
                tail = builder.add(lo[r], common)
                with cgutils.for_range_slice(builder, tail, hi[r], a.const(1)) as (e, _):
                    add_entry(r, e)
            z = [[builder.load(regs[r][q]) for q in range(nvec)] for r in range(rows)]
            for r in range(rows):
                for q in range(nvec):
                    _store(builder, a, z[r][q], out[r], k[r], q, v["limit_o"])
            on = builder.icmp_signed("!=", v["activate"], ir.Constant(v["activate"].type, 0))
            with builder.if_then(on):
                _activate(builder, a, v, z, first, nvec)
            return context.get_dummy_value()
        return sig, codegen
    return narrow


def _activate(builder, a, v: dict, z: list, first: list, nvec: int) -> None:  # noqa: ANN001
    """act rows = h(z), and the group's live columns ORed in registers, then into alive."""
    flags = ir.VectorType(ir.IntType(32), a.lanes)
    zero = ir.Constant(a.vt, [0.0] * a.lanes)
    live = [ir.Constant(flags, [0] * a.lanes) for _ in range(nvec)]
    for r, row in enumerate(first):
        ka = builder.mul(row, v["ka"])
        act = builder.gep(a.ptr["act"], [ka])
        for q in range(nvec):
            h = relu_cap(builder, a, v, z[r][q])
            _store(builder, a, h, act, ka, q, v["limit_a"])
            live[q] = builder.or_(live[q], builder.zext(builder.fcmp_unordered("!=", h, zero),
                                                        flags))
    with builder.if_then(builder.icmp_signed(">", a.len["alive"], a.const(0))):
        alive = a.ptr["alive"]
        for q in range(nvec):
            vstore(builder, a, builder.or_(vload(builder, a, alive, q, flags), live[q]), alive,
                   q)


NARROW = {nvec: (_make_narrow(nvec, 1), _make_narrow(nvec, rows)) for nvec, rows in GROUP.items()}
