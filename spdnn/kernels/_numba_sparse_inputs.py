"""numba kernels of a first layer over a sparse input block (features x batch): only the
columns of W on the rows of the block that hold a nonzero are read. The other products are
zeros, so the results are those of the full kernels (spdnn.kernels.sparse_inputs). One
thread: they are short, and parallel ones compiled several times slower."""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels.cache_loads import lean_cache_loads


@nb.njit(cache=True, nogil=True)
def live_rows(x, live):
    """live[f] = 1 where row f of x holds a nonzero (NaN included), else 0."""
    for f in range(x.shape[0]):
        row, v = x[f], False
        for j in range(x.shape[1]):
            v |= row[j] != 0
        live[f] = v


@nb.njit(cache=True, nogil=True, fastmath={"contract"})
def spmm_cols(t_indptr, t_rows, t_order, data, x, live, bias, z, h, cap, activate):
    """z = bias + W x over the live rows f of x only (ascending), a column of W at a time:
    W's entries (r, f) are t_rows[k] with value data[t_order[k]] for k in
    t_indptr[f]:t_indptr[f + 1] (its transpose's pattern). z[r] still receives its terms in
    ascending f as fused multiply-adds: spmm_rows' order and roundings (its other terms add
    zeros). With ``activate`` h = min(max(z, 0), cap) (cap < 0: no cap; NaN and -0.0 pass,
    as in spmm_rows)."""
    n, batch = z.shape
    for r in range(n):
        z[r, :] = bias[r]
    for f in live:
        xf = x[f]
        for k in range(t_indptr[f], t_indptr[f + 1]):
            zr, w = z[t_rows[k]], data[t_order[k]]
            for j in range(batch):
                zr[j] += w * xf[j]
    if activate:
        for r in range(n):
            zr, hr = z[r], h[r]
            for j in range(batch):
                v = zr[j]
                v = 0 if v < 0 else v
                hr[j] = cap if 0 <= cap < v else v


@nb.njit(cache=True, nogil=True, fastmath=True)
def sddmm_cols(t_indptr, t_rows, t_order, d, x, live, out, bias_grad):
    """out[e] = d[i_e] . x[j_e] for the entries e = (i_e, j_e) of W on the live rows j_e of
    x (a column of W at a time, as spmm_cols), 0 for the others; bias_grad[i] = the sum of
    d[i] (fastmath: the sums in SIMD lanes, as spmm's sddmm)."""
    out[:] = 0
    for f in live:
        xf = x[f]
        for k in range(t_indptr[f], t_indptr[f + 1]):
            dr = d[t_rows[k]]
            s = dr[0] * xf[0]
            for j in range(1, d.shape[1]):
                s += dr[j] * xf[j]
            out[t_order[k]] = s
    for i in range(d.shape[0]):
        di = d[i]
        s = di[0] * 0
        for j in range(d.shape[1]):
            s += di[j]
        bias_grad[i] = s


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Compile (or load from cache) for ``dtypes``."""
    ptr, rows = np.array([0, 1], np.int32), np.array([0], np.int32)
    live = np.zeros(1, np.int64)
    for dt in dtypes:
        x, z, g = np.ones((1, 2), dt), np.empty((1, 2), dt), np.empty(1, dt)
        live_rows(x, np.empty(1, np.uint8))
        spmm_cols(ptr, rows, rows, np.ones(1, dt), x, live, np.zeros(1, dt), z, z, -1.0, True)
        sddmm_cols(ptr, rows, rows, x, x, live, g, g)


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
