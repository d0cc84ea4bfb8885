"""numba kernels of a first layer over a sparse input block (features x batch): entries whose
input row is zero in every column of the batch are skipped. Their products are zeros, so the
results are those of the full kernels (spdnn.kernels.sparse_inputs). One thread: they take
1-8 ms where the full kernels took 17, and parallel ones compiled 3x slower."""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def live_rows(x, live):
    """live[f] = 1 where row f of x holds a nonzero (NaN included), else 0."""
    for f in range(x.shape[0]):
        row, v = x[f], False
        for j in range(x.shape[1]):
            v |= row[j] != 0
        live[f] = v


@nb.njit(cache=True, nogil=True, fastmath={"contract"})
def spmm_live(indptr, indices, data, x, live, bias, z, h, cap, activate):
    """z[r] = bias[r] + the sum over row r's entries e with live[indices[e]] of data[e] *
    x[indices[e]], in entry order and as fused multiply-adds (spmm_rows' order and roundings:
    its other terms add zeros); with ``activate`` h[r] = min(max(z[r], 0), cap) (cap < 0: no
    cap; NaN and -0.0 pass, as in spmm_rows)."""
    batch = z.shape[1]
    for r in range(z.shape[0]):
        zr = z[r]
        for j in range(batch):
            zr[j] = bias[r]
        for e in range(indptr[r], indptr[r + 1]):
            f = indices[e]
            if live[f]:
                w, xf = data[e], x[f]
                for j in range(batch):
                    zr[j] += w * xf[j]
        if activate:
            hr = h[r]
            for j in range(batch):
                v = zr[j]
                v = 0 if v < 0 else v
                hr[j] = cap if 0 <= cap < v else v


@nb.njit(cache=True, nogil=True, fastmath=True)
def sddmm_live(indptr, indices, d, x, live, out, bias_grad):
    """out[e] = d[i_e] . x[j_e] for the entries e = (i_e, j_e) with live[j_e], 0 for the
    others, and bias_grad[i] = the sum of d[i] (fastmath: the sums in SIMD lanes, as
    spmm's sddmm)."""
    batch = d.shape[1]
    zero = np.zeros(1, d.dtype)[0]
    for i in range(d.shape[0]):
        di = d[i]
        for e in range(indptr[i], indptr[i + 1]):
            f = indices[e]
            s = zero
            if live[f]:
                xf = x[f]
                for j in range(batch):
                    s += di[j] * xf[j]
            out[e] = s
        s = zero
        for j in range(batch):
            s += di[j]
        bias_grad[i] = s


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Compile (or load from cache) for ``dtypes``."""
    indptr, indices = np.array([0, 1], np.int32), np.array([0], np.int32)
    live = np.ones(1, np.uint8)
    for dt in dtypes:
        x, z, g = np.ones((1, 2), dt), np.empty((1, 2), dt), np.empty(1, dt)
        live_rows(x, live)
        spmm_live(indptr, indices, np.ones(1, dt), x, live, np.zeros(1, dt), z, z, -1.0, True)
        sddmm_live(indptr, indices, x, x, live, g, g)
