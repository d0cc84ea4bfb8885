"""numba CSR kernels (the ``numba`` backend of spdnn.kernels). Rows of dense blocks are
contiguous (neurons x batch), so the inner loops run over the batch with unit stride and SIMD."""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(parallel=True, cache=True, nogil=True)
def spmm_rows(indptr, indices, data, x, bias, out, r0, r1, accumulate, cap, activate, act_out,
              alive):
    """For rows i in [r0, r1): out[i] = W[i] x + (out[i] if ``accumulate`` else bias[i]);
    with ``activate`` also act_out[i] = min(max(out[i], 0), cap) (cap < 0: no cap) and
    alive[b] = 1 for every column b with a nonzero activation (when ``alive`` is not empty)."""
    track = len(alive) > 0
    batch = x.shape[1]
    for i in nb.prange(r0, r1):
        acc = out[i]
        if not accumulate:
            b0 = bias[i]
            for b in range(batch):
                acc[b] = b0
        start, stop = indptr[i], indptr[i + 1]
        e = start
        # Four nonzeros per sweep over the batch: a quarter of the accumulator traffic.
        while e + 4 <= stop:
            v0, v1, v2, v3 = data[e], data[e + 1], data[e + 2], data[e + 3]
            x0, x1 = x[indices[e]], x[indices[e + 1]]
            x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
            for b in range(batch):
                acc[b] += v0 * x0[b] + v1 * x1[b] + v2 * x2[b] + v3 * x3[b]
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


@nb.njit(cache=True, nogil=True)
def spmm_t(indptr, indices, data, d, out, r0, r1):
    """out += W[r0:r1]^T d[r0:r1]; a scatter over rows, so it stays single-threaded."""
    batch = d.shape[1]
    for i in range(r0, r1):
        di = d[i]
        for e in range(indptr[i], indptr[i + 1]):
            v = data[e]
            o = out[indices[e]]
            for b in range(batch):
                o[b] += v * di[b]


@nb.njit(parallel=True, cache=True, nogil=True, fastmath=True)
def sddmm(indptr, indices, d, x, out):
    """out[e] = d[i_e] . x[j_e] for every stored entry e = (i_e, j_e)."""
    batch = d.shape[1]
    for i in nb.prange(len(indptr) - 1):
        di = d[i]
        e, stop = indptr[i], indptr[i + 1]
        # Four entries of row i per sweep: d[i] is read once for four dot products.
        while e + 4 <= stop:
            x0, x1 = x[indices[e]], x[indices[e + 1]]
            x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
            a0 = a1 = a2 = a3 = 0.0
            for b in range(batch):
                v = di[b]
                a0 += v * x0[b]
                a1 += v * x1[b]
                a2 += v * x2[b]
                a3 += v * x3[b]
            out[e], out[e + 1], out[e + 2], out[e + 3] = a0, a1, a2, a3
            e += 4
        while e < stop:
            xj = x[indices[e]]
            acc = 0.0
            for b in range(batch):
                acc += di[b] * xj[b]
            out[e] = acc
            e += 1


def warm_up() -> None:
    """Compile (or load from cache) for float32 and float64."""
    for dt in (np.float32, np.float64):
        indptr = np.array([0, 1], dtype=np.int32)
        indices = np.array([0], dtype=np.int32)
        data = np.ones(1, dt)
        x = np.ones((1, 2), dt)
        out = np.empty((1, 2), dt)
        for alive in (np.zeros(0, np.int32), np.zeros(2, np.int32)):
            spmm_rows(indptr, indices, data, x, np.zeros(1, dt), out, 0, 1, False, -1.0, True,
                      out, alive)
        spmm_t(indptr, indices, data, x, out, 0, 1)
        sddmm(indptr, indices, x, x, np.empty(1, dt))
