"""numba CSR kernels (the ``numba`` backend of spdnn.kernels). Rows of dense blocks are
contiguous (neurons x batch), so the inner loops run over the batch with unit stride and SIMD.

Every product is a gather: output row i reads the rows of the right-hand block named by row i of
a CSR matrix (W^T G runs on a stored transpose), so rows are independent and split over threads.
The gathers themselves are spdnn.kernels._gather's register blocks (accumulators in registers,
rows prefetched ahead, masked ends where the batch is not a multiple of the block).

Blocks of bfloat16 bits (uint16: spdnn.kernels.bfloat16) are read as float32 (a lane of a
register is 4 bytes: ``_lane_bytes``); sums and the Z blocks are float32.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels._gather import AXPY, AXPY_DOT, AXPY_DOT_VECTORS, DOT, PREFETCH_AHEAD
from spdnn.kernels._narrow import GROUP, NARROW
from spdnn.kernels._numba_bfloat16 import value, zero_of
from spdnn.kernels.cache_loads import lean_cache_loads


def _partial(blocks: tuple, nargs: int):  # noqa: ANN202
    """One call for the partial blocks of 1 to 8 vectors, ``call(nvec, *args)``, written out
    (numba's inliner takes no *args, and a call per row was measurably slower at batch width
    1)."""
    args = ", ".join(f"a{i}" for i in range(nargs))
    lines = [f"def call(nvec, {args}):"]
    for n in range(1, len(blocks)):
        lines += [f"    {'if' if n == 1 else 'elif'} nvec == {n}:", f"        b{n}({args})"]
    lines += ["    else:", f"        b{len(blocks)}({args})"]
    scope = {f"b{n + 1}": block for n, block in enumerate(blocks)}
    exec("\n".join(lines), scope)  # noqa: S102 (source built above from constants)
    return nb.njit(inline="always")(scope["call"])


_A, _AP = AXPY[0], _partial(AXPY[1:], 18)
_D, _DP = DOT[0], _partial(DOT[1:], 12)
_B, _BP = AXPY_DOT[0], _partial(AXPY_DOT[1:], 22)


def _dispatch(kernels: dict):  # noqa: ANN202
    """``call(size, single, *args)``: kernels[size][0 if single else 1](*args), written out
    (numba's inliner takes no *args, and no dict of functions)."""
    args = ", ".join(f"a{i}" for i in range(19))
    lines = [f"def call(size, single, {args}):"]
    scope = {}
    for n, size in enumerate(sorted(kernels)):
        lines.append(f"    {'if' if n == 0 else 'elif'} size == {size}:")
        for which, cond in ((0, "if single"), (1, "else")):
            scope[f"k{size}_{which}"] = kernels[size][which]
            lines += [f"        {cond}:", f"            k{size}_{which}({args})"]
    exec("\n".join(lines), scope)  # noqa: S102 (source built above from constants)
    return nb.njit(inline="always")(scope["call"])


_NARROW = _dispatch(NARROW)


@nb.njit(inline="always")
def _lane_bytes(x):  # noqa: ANN001, ANN202
    """Bytes of a register lane for x's values: bfloat16's 2 are read into float32's 4."""
    return 4 if x.itemsize == 2 else x.itemsize
_GROUPS = tuple(GROUP[n] for n in sorted(GROUP))  # rows a call, by vectors a row


@nb.njit(inline="always")
def _axpy(acc, k, x, indices, data, e0, e1, start, fresh, act, ka, cap, activate, alive):
    """acc[k + c] (= start when ``fresh``, else acc[k + c]) += sum_e data[e] x[indices[e], c]
    for every column c: full blocks of 8 vectors, then one partial block of 1 to 8 vectors,
    its last one with masked ends. With ``activate``, act[ka + c] = h(acc[k + c]) and
    alive[c] = 1 where that is nonzero (when alive is not empty)."""
    batch, lanes, pf = x.shape[1], 64 // _lane_bytes(x), PREFETCH_AHEAD
    xf, c, full = x.reshape(-1), 0, 8 * lanes
    while c + full <= batch:
        _A(acc, k + c, xf, batch, c, indices, data, e0, e1, full, pf, start, fresh, act,
           ka + c, cap, activate, alive)
        c += full
    rem = batch - c
    if rem > 0:
        _AP((rem + lanes - 1) // lanes, acc, k + c, xf, batch, c, indices, data, e0, e1, rem,
            pf, start, fresh, act, ka + c, cap, activate, alive)


@nb.njit(inline="always")
def _dot(a, ka, x, indices, out, e0, e1):
    """out[e] = a[ka:] . x[indices[e]] over every column, block by block (0 without
    columns)."""
    batch, lanes, pf = x.shape[1], 64 // _lane_bytes(x), PREFETCH_AHEAD
    xf, c, full = x.reshape(-1), 0, 8 * lanes
    if batch == 0:
        for e in range(e0, e1):
            out[e] = 0
    while c + full <= batch:
        _D(a, ka + c, xf, batch, c, indices, out, e0, e1, c == 0, full, pf)
        c += full
    rem = batch - c
    if rem > 0:
        _DP((rem + lanes - 1) // lanes, a, ka + c, xf, batch, c, indices, out, e0, e1, c == 0,
            rem, pf)


@nb.njit(inline="always")
def _axpy_dot(acc, k, d, indices, data, xj, kx, grad, order, e0, e1, z, kz, cap, slope, sums,
              at_sum):
    """The axpy of d's rows into acc[k:] (times ReLU's slope at z[kz:] when ``slope``; the
    row's sum of what acc received into sums[at_sum] when sums is not empty) and
    grad[order[e]] = d[indices[e]] . xj[kx:] over every column, block by block (0 without
    columns)."""
    batch, lanes, pf = d.shape[1], 64 // _lane_bytes(d), PREFETCH_AHEAD
    df, c, full = d.reshape(-1), 0, AXPY_DOT_VECTORS * lanes
    if batch == 0:
        for e in range(e0, e1):
            grad[order[e]] = 0
        if len(sums) > 0:
            sums[at_sum] = 0
    while c + full <= batch:
        _B(acc, k + c, df, batch, c, indices, data, xj, kx + c, grad, order, e0, e1, c == 0,
           full, pf, z, kz + c, cap, slope, sums, at_sum)
        c += full
    rem = batch - c
    if rem > 0:
        _BP((rem + lanes - 1) // lanes, acc, k + c, df, batch, c, indices, data, xj, kx + c,
            grad, order, e0, e1, c == 0, rem, pf, z, kz + c, cap, slope, sums, at_sum)


@nb.njit(inline="always")
def _spmm_row(i, starts, ends, indices, data, x, bias, flat, ko, init, cap, activate, act, ka,
              alive):
    start = bias[i] if init == 1 else np.zeros(1, flat.dtype)[0]
    _axpy(flat, i * ko, x, indices, data, starts[i], ends[i], start, init != 0, act, i * ka,
          cap, activate, alive)


@nb.njit(cache=True, nogil=True)  # not inlined: spmm_rows calls it in two places
def _narrow_rows(a, b, starts, ends, indices, data, x, bias, flat, ko, init, cap, activate, act,
                 ka, alive):
    """Rows [a, b) of a narrow batch, a group of rows at a time. Stores run whole vectors up
    to row b where rows hold the batch alone (the lanes past it land on later rows, written
    after), except when accumulating: those rows are read after."""
    batch, xf = x.shape[1], x.reshape(-1)
    size = (batch * _lane_bytes(x) + 31) // 32  # vectors of 256 bits
    lim_o = b * ko if ko == batch and init != 0 else 0
    lim_a = b * ka if ka == batch else 0
    group = _GROUPS[size - 1]
    i = a
    while i + group <= b:
        _NARROW(size, False, flat, ko, xf, batch, indices, data, starts, ends, i, batch, bias,
                init, act, ka, cap, activate, alive, lim_o, lim_a)
        i += group
    while i < b:
        _NARROW(size, True, flat, ko, xf, batch, indices, data, starts, ends, i, batch, bias,
                init, act, ka, cap, activate, alive, lim_o, lim_a)
        i += 1


@nb.njit(parallel=True, cache=True, nogil=True)
def spmm_rows(starts, ends, indices, data, x, bias, out, r0, r1, init, cap, activate,
              act_out, alive, threads):
    """For rows i in [r0, r1), on the entries [starts[i], ends[i]) of row i: out[i] = W[i] x
    + (bias[i] if ``init`` == 1, 0 if 2, out[i] if 0); with ``activate`` also act_out[i] =
    min(max(out[i], 0), cap) (cap < 0: no cap) and alive[b] = 1 for every column b with a
    nonzero activation (when ``alive`` is not empty). ``threads``: numba's thread count
    (read outside: numba's call for it would keep this kernel out of the cache)."""
    flat, act, ko, ka = out.reshape(-1), act_out.reshape(-1), out.shape[1], act_out.shape[1]
    narrow = 0 < x.shape[1] * _lane_bytes(x) <= 128  # up to 4 vectors of 256 bits
    # On several threads, the rows in one run per thread (numba's static schedule), each run
    # with live flags of its own, merged below: a row's flags are a read, an OR and a store of
    # the whole vector, and threads sharing one array lost live columns to each other.
    if threads <= 1 and narrow:
        _narrow_rows(r0, r1, starts, ends, indices, data, x, bias, flat, ko, init, cap,
                     activate, act, ka, alive)
        return
    if threads <= 1:  # one array (a range loop here compiled slower than prange)
        for i in nb.prange(r0, r1):
            _spmm_row(i, starts, ends, indices, data, x, bias, flat, ko, init, cap, activate,
                      act, ka, alive)
        return
    rows, width = r1 - r0, alive.shape[0]
    flags = np.zeros((threads, width), np.int32)
    for t in nb.prange(threads):
        a, b = r0 + rows * t // threads, r0 + rows * (t + 1) // threads
        if narrow:
            _narrow_rows(a, b, starts, ends, indices, data, x, bias, flat, ko, init, cap,
                         activate, act, ka, flags[t])
            continue
        for i in range(a, b):
            _spmm_row(i, starts, ends, indices, data, x, bias, flat, ko, init, cap, activate,
                      act, ka, flags[t])
    for t in range(threads):
        for c in range(width):
            alive[c] |= flags[t, c]


# Rows of X a dense kernel widens at once: each Z vector is loaded and stored once for them.
DENSE_ROWS_AHEAD = 8


@nb.njit(parallel=True, cache=True, nogil=True, fastmath={"contract"})
def dense_rows(wd, x, lo, hi, bias, out, r0, r1, init, threads):
    """out[i] = wd[i, lo:hi] x[lo:hi] + (bias[i] if ``init`` == 1, 0 if 2, out[i] if 0) for
    rows i in [r0, r1) of a dense W (rows x columns, every entry stored), reading each row of
    x once for all rows of W (the gathers read it once a row of W). Each sum runs in column
    order with fused multiply-adds from its start, as the gathers' do (the same bits): only
    the loop order differs. ``threads`` take a share of the rows each."""
    batch = x.shape[1]
    rows = r1 - r0
    for t in nb.prange(threads):
        a, b = r0 + rows * t // threads, r0 + rows * (t + 1) // threads
        if init != 0:
            for i in range(a, b):
                start = bias[i] if init == 1 else zero_of(out)
                for c in range(batch):
                    out[i, c] = start
        ahead = np.empty((DENSE_ROWS_AHEAD, batch), out.dtype)  # the rows of x, widened
        k = lo
        while k < hi:
            n = min(DENSE_ROWS_AHEAD, hi - k)
            for j in range(n):
                xr, wide = x[k + j], ahead[j]
                for c in range(batch):
                    wide[c] = value(xr[c])
            for i in range(a, b):
                zi, wi = out[i], wd[i]
                if n == DENSE_ROWS_AHEAD:  # written out: one load and store of zi a block
                    w0, w1, w2, w3 = value(wi[k]), value(wi[k + 1]), value(wi[k + 2]), \
                        value(wi[k + 3])
                    w4, w5, w6, w7 = value(wi[k + 4]), value(wi[k + 5]), value(wi[k + 6]), \
                        value(wi[k + 7])
                    for c in range(batch):
                        s = zi[c] + w0 * ahead[0, c]
                        s = s + w1 * ahead[1, c]
                        s = s + w2 * ahead[2, c]
                        s = s + w3 * ahead[3, c]
                        s = s + w4 * ahead[4, c]
                        s = s + w5 * ahead[5, c]
                        s = s + w6 * ahead[6, c]
                        zi[c] = s + w7 * ahead[7, c]
                else:
                    for j in range(n):
                        wj, xj = value(wi[k + j]), ahead[j]
                        for c in range(batch):
                            zi[c] = zi[c] + wj * xj[c]
            k += n


@nb.njit(parallel=True, cache=True, nogil=True, fastmath=True)
def sddmm(indptr, indices, d, x, out, bias_grad, with_bias):
    """out[e] = d[i_e] . x[j_e] for every stored entry e = (i_e, j_e); with ``with_bias``
    also bias_grad[i] = sum_b d[i, b] (d[i] is in L1 by then). fastmath lets the bias sum
    vectorize (partial sums in SIMD lanes, as BLAS does)."""
    batch = d.shape[1]
    flat = d.reshape(-1)
    zero = zero_of(d)  # accumulators in d's type (SIMD lanes of float32; bfloat16's: float32)
    for i in nb.prange(len(indptr) - 1):
        di = d[i]
        start, stop = indptr[i], indptr[i + 1]
        _dot(flat, i * d.shape[1], x, indices, out, start, stop)
        if with_bias:
            s = zero
            for b in range(batch):
                s += value(di[b])
            bias_grad[i] = s


@nb.njit(parallel=True, cache=True, nogil=True)
def backward_rows(indptr, indices, data, order, d, x, out, base, grad_w, r0, r1, z, cap, mask,
                  sums):
    """Both backward products of a layer in one pass over W^T (its pattern: indptr, indices;
    its values W's own, ``data[order[e]]``, read in place): for rows j in [r0, r1),
    out[j - base] = sum_e data[order[e]] d[indices[e]] (W^T d), times h'(z[j]) when ``mask``,
    and grad_w[order[e]] = d[indices[e]] . x[j] (the weight gradient in W's order). Each
    gathered row of d serves both, so the pass gathers half as much as the two products
    apart. A bfloat16 ``out`` gets the float32 sums rounded (the next layer's error block,
    when nothing is folded into it), and ``sums`` (when not empty) its rows' sums (that
    layer's bias gradient)."""
    batch = d.shape[1]
    flat = out.reshape(-1)
    xflat = x.reshape(-1)
    zflat = z.reshape(-1)
    for j in nb.prange(r0, r1):
        acc = out[j - base]
        for b in range(batch):
            acc[b] = 0
        start, stop = indptr[j], indptr[j + 1]
        _axpy_dot(flat, (j - base) * out.shape[1], d, indices, data, xflat, j * x.shape[1],
                  grad_w, order, start, stop, zflat, j * z.shape[1] if mask else 0, cap,
                  mask, sums, j - base)


@nb.njit(parallel=True, cache=True, nogil=True)
def apply_slope(g, z, cap):
    """g *= h'(z) in place: 1 where 0 < z (< cap when cap >= 0), else 0."""
    batch = g.shape[1]
    for i in nb.prange(g.shape[0]):
        gi, zi = g[i], z[i]
        for b in range(batch):
            v = value(zi[b])
            if not (v > 0 and (cap < 0 or v < cap)):
                gi[b] = gi[b] * 0  # as g * mask does: NaN stays NaN, -x gives -0.0


def threads() -> int:
    """numba's thread count for the next kernel (spdnn.kernels.products sets it)."""
    return nb.get_num_threads()


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Compile (or load from cache) for ``dtypes`` (each loaded type costs resident memory,
    counted in docs/memory.md's process baseline; uint16 is bfloat16: its values and gathered
    blocks in bfloat16, its sums and Z in float32)."""
    for dt in dtypes:
        sums = np.float32 if np.dtype(dt) == np.uint16 else dt
        indptr = np.array([0, 1], dtype=np.int32)
        indices = np.array([0], dtype=np.int32)
        data = np.ones(1, dt)
        x = np.ones((1, 2), dt)
        out = np.empty((1, 2), sums)
        act = np.empty((1, 2), dt)
        for alive in (np.zeros(0, np.int32), np.zeros(2, np.int32)):
            spmm_rows(indptr[:-1], indptr[1:], indices, data, x, np.zeros(1, sums), out, 0, 1,
                      1, -1.0, True, act, alive, 1)
        grads = np.empty(1, sums)
        sddmm(indptr, indices, x, x, grads, grads, True)
        no_sums = np.zeros(0, np.float32)
        for mask in (False, True):
            backward_rows(indptr, indices, data, indices, x, x, out, 0, grads, 0, 1, out,
                          -1.0, mask, no_sums)
        if np.dtype(dt) == np.uint16:  # the next error block straight from the products
            errors = np.empty((1, 2), dt)
            backward_rows(indptr, indices, data, indices, x, x, errors, 0, grads, 0, 1, x,
                          -1.0, True, np.zeros(1, np.float32))
            apply_slope(out, x, -1.0)
        apply_slope(out, out, -1.0)


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
