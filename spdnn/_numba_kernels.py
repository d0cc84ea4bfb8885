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
    for i in nb.prange(len(indptr) - 1):
        di = d[i]
        e, stop = indptr[i], indptr[i + 1]
        # Eight entries of row i per sweep: d[i] is read once for eight dot products.
        while e + 8 <= stop:
            x0, x1 = x[indices[e]], x[indices[e + 1]]
            x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
            x4, x5 = x[indices[e + 4]], x[indices[e + 5]]
            x6, x7 = x[indices[e + 6]], x[indices[e + 7]]
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = di[0] * 0
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
            acc = di[0] * 0
            for b in range(batch):
                acc += di[b] * xj[b]
            out[e] = acc
            e += 1
        if with_bias:
            s = di[0] * 0
            for b in range(batch):
                s += di[b]
            bias_grad[i] = s


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
        apply_slope(out, x, -1.0)
