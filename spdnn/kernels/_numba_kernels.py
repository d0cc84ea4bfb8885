"""numba CSR kernels (the ``numba`` backend of spdnn.kernels). Rows of dense blocks are
contiguous (neurons x batch), so the inner loops run over the batch with unit stride and SIMD.

Every product is a gather: output row i reads the rows of the right-hand block named by row i of
a CSR matrix (W^T G runs on a stored transpose), so rows are independent and split over threads.
Eight nonzeros per sweep over the batch: the output row (in L1) is loaded and stored once per
eight gathered rows, which measured 1.5x faster than four at n = 16384 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(parallel=True, cache=True, nogil=True)
def spmm_rows(indptr, indices, data, x, bias, out, r0, r1, init, cap, activate, act_out,
              alive):
    """For rows i in [r0, r1): out[i] = W[i] x + (bias[i] if ``init`` == 1, 0 if 2, out[i] if
    0); with ``activate`` also act_out[i] = min(max(out[i], 0), cap) (cap < 0: no cap) and
    alive[b] = 1 for every column b with a nonzero activation (when ``alive`` is not empty)."""
    track = len(alive) > 0
    batch = x.shape[1]
    for i in nb.prange(r0, r1):
        acc = out[i]
        if init != 0:
            b0 = bias[i] if init == 1 else 0
            for b in range(batch):
                acc[b] = b0
        start, stop = indptr[i], indptr[i + 1]
        e = start
        while e + 8 <= stop:
            v0, v1, v2, v3 = data[e], data[e + 1], data[e + 2], data[e + 3]
            v4, v5, v6, v7 = data[e + 4], data[e + 5], data[e + 6], data[e + 7]
            x0, x1 = x[indices[e]], x[indices[e + 1]]
            x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
            x4, x5 = x[indices[e + 4]], x[indices[e + 5]]
            x6, x7 = x[indices[e + 6]], x[indices[e + 7]]
            for b in range(batch):
                acc[b] += ((v0 * x0[b] + v1 * x1[b]) + (v2 * x2[b] + v3 * x3[b])) + \
                          ((v4 * x4[b] + v5 * x5[b]) + (v6 * x6[b] + v7 * x7[b]))
            e += 8
        if e + 4 <= stop:  # rows of uneven length (a transpose's) end in up to 7 entries
            v0, v1, v2, v3 = data[e], data[e + 1], data[e + 2], data[e + 3]
            x0, x1 = x[indices[e]], x[indices[e + 1]]
            x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
            for b in range(batch):
                acc[b] += (v0 * x0[b] + v1 * x1[b]) + (v2 * x2[b] + v3 * x3[b])
            e += 4
        while e < stop:
            v = data[e]
            xr = x[indices[e]]
            for b in range(batch):
                acc[b] += v * xr[b]
            e += 1
        if activate:
            a = act_out[i]
            for b in range(batch):
                z = acc[b]
                if z < 0:
                    z = 0
                if cap >= 0 and z > cap:
                    z = cap
                a[b] = z
                if track and z != 0:
                    alive[b] = 1


@nb.njit(parallel=True, cache=True, nogil=True, fastmath=True)
def sddmm(indptr, indices, d, x, out, bias_grad, with_bias):
    """out[e] = d[i_e] . x[j_e] for every stored entry e = (i_e, j_e); with ``with_bias``
    also bias_grad[i] = sum_b d[i, b] (d[i] is in L1 by then). fastmath lets the dot products
    vectorize (partial sums in SIMD lanes, as BLAS does)."""
    batch = d.shape[1]
    zero = np.zeros(1, d.dtype)[0]  # accumulators in d's type (SIMD lanes of float32)
    for i in nb.prange(len(indptr) - 1):
        di = d[i]
        e, stop = indptr[i], indptr[i + 1]
        # Eight entries of row i per sweep: d[i] is read once for eight dot products.
        while e + 8 <= stop:
            x0, x1 = x[indices[e]], x[indices[e + 1]]
            x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
            x4, x5 = x[indices[e + 4]], x[indices[e + 5]]
            x6, x7 = x[indices[e + 6]], x[indices[e + 7]]
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
            for b in range(batch):
                v = di[b]
                a0 += v * x0[b]
                a1 += v * x1[b]
                a2 += v * x2[b]
                a3 += v * x3[b]
                a4 += v * x4[b]
                a5 += v * x5[b]
                a6 += v * x6[b]
                a7 += v * x7[b]
            out[e], out[e + 1], out[e + 2], out[e + 3] = a0, a1, a2, a3
            out[e + 4], out[e + 5], out[e + 6], out[e + 7] = a4, a5, a6, a7
            e += 8
        while e < stop:
            xj = x[indices[e]]
            acc = zero
            for b in range(batch):
                acc += di[b] * xj[b]
            out[e] = acc
            e += 1
        if with_bias:
            s = zero
            for b in range(batch):
                s += di[b]
            bias_grad[i] = s


@nb.njit(parallel=True, cache=True, nogil=True, fastmath=True)
def backward_rows(indptr, indices, data, order, d, x, out, base, grad_w, r0, r1, z, cap, mask):
    """Both backward products of a layer in one pass over W^T (CSR: indptr, indices, data):
    for rows j in [r0, r1), out[j - base] = sum_e data[e] d[indices[e]] (W^T d), times h'(z[j])
    when ``mask``, and grad_w[order[e]] = d[indices[e]] . x[j] (the weight gradient in W's
    order). Each gathered row of d serves both, so the pass gathers half as much as the two
    products apart."""
    batch = d.shape[1]
    zero = np.zeros(1, d.dtype)[0]  # accumulators in d's type (SIMD lanes of float32)
    for j in nb.prange(r0, r1):
        xj = x[j]
        acc = out[j - base]
        for b in range(batch):
            acc[b] = 0
        e, stop = indptr[j], indptr[j + 1]
        while e + 8 <= stop:
            d0, d1, d2, d3 = d[indices[e]], d[indices[e + 1]], d[indices[e + 2]], \
                d[indices[e + 3]]
            d4, d5, d6, d7 = d[indices[e + 4]], d[indices[e + 5]], d[indices[e + 6]], \
                d[indices[e + 7]]
            v0, v1, v2, v3 = data[e], data[e + 1], data[e + 2], data[e + 3]
            v4, v5, v6, v7 = data[e + 4], data[e + 5], data[e + 6], data[e + 7]
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
            for b in range(batch):
                xb = xj[b]
                p0, p1, p2, p3 = d0[b], d1[b], d2[b], d3[b]
                p4, p5, p6, p7 = d4[b], d5[b], d6[b], d7[b]
                a0 += p0 * xb
                a1 += p1 * xb
                a2 += p2 * xb
                a3 += p3 * xb
                a4 += p4 * xb
                a5 += p5 * xb
                a6 += p6 * xb
                a7 += p7 * xb
                acc[b] += ((v0 * p0 + v1 * p1) + (v2 * p2 + v3 * p3)) + \
                    ((v4 * p4 + v5 * p5) + (v6 * p6 + v7 * p7))
            grad_w[order[e]], grad_w[order[e + 1]] = a0, a1
            grad_w[order[e + 2]], grad_w[order[e + 3]] = a2, a3
            grad_w[order[e + 4]], grad_w[order[e + 5]] = a4, a5
            grad_w[order[e + 6]], grad_w[order[e + 7]] = a6, a7
            e += 8
        while e < stop:
            dr = d[indices[e]]
            v = data[e]
            a = zero
            for b in range(batch):
                a += dr[b] * xj[b]
                acc[b] += v * dr[b]
            grad_w[order[e]] = a
            e += 1
        if mask:
            zj = z[j]
            for b in range(batch):
                v = zj[b]
                if not (v > 0 and (cap < 0 or v < cap)):
                    acc[b] = acc[b] * 0


@nb.njit(parallel=True, cache=True, nogil=True)
def apply_slope(g, z, cap):
    """g *= h'(z) in place: 1 where 0 < z (< cap when cap >= 0), else 0."""
    batch = g.shape[1]
    for i in nb.prange(g.shape[0]):
        gi, zi = g[i], z[i]
        for b in range(batch):
            v = zi[b]
            if not (v > 0 and (cap < 0 or v < cap)):
                gi[b] = gi[b] * 0  # as g * mask does: NaN stays NaN, -x gives -0.0


def warm_up() -> None:
    """Compile (or load from cache) for float32 and float64."""
    for dt in (np.float32, np.float64):
        indptr = np.array([0, 1], dtype=np.int32)
        indices = np.array([0], dtype=np.int32)
        data = np.ones(1, dt)
        x = np.ones((1, 2), dt)
        out = np.empty((1, 2), dt)
        for alive in (np.zeros(0, np.int32), np.zeros(2, np.int32)):
            spmm_rows(indptr, indices, data, x, np.zeros(1, dt), out, 0, 1, 1, -1.0, True,
                      out, alive)
        grads = np.empty(1, dt)
        sddmm(indptr, indices, x, x, grads, grads, True)
        for mask in (False, True):
            backward_rows(indptr, indices, data, indptr.astype(np.int64), x, x, out, 0, grads,
                          0, 1, x, -1.0, mask)
        apply_slope(out, x, -1.0)
