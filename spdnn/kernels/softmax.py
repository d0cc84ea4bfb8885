"""The passes of a softmax over the rows of a block (neurons x batch), for the fused loss of
``spdnn.runtime.outputs``: column maxima with their first row, the shifted exponentials with
their column sums (in place), a scaling of the columns. Between the passes the runtime agrees
the per-column vectors over the ranks that share the block's columns; no MPI here.

The numba backend runs each pass as one kernel over blocks of rows (spdnn.kernels._numba_softmax);
the scipy backend, and blocks that are not C-contiguous, numpy's passes."""

from __future__ import annotations

import numpy as np

from spdnn.kernels import products


def _numba(*blocks: np.ndarray) -> bool:
    return products.backend() == "numba" and all(b.flags.c_contiguous for b in blocks)


def column_max(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column's maximum and its first row (an empty block: -inf and -1)."""
    n, b = z.shape
    best, arg = np.full(b, -np.inf, z.dtype), np.full(b, -1, np.int64)
    if n == 0:
        return best, arg
    if _numba(z):
        from spdnn.kernels import _numba_softmax

        products._nb()  # this rank's thread count
        _numba_softmax.column_max(z, best, arg)
        return best, arg
    return z.max(axis=0), z.argmax(axis=0).astype(np.int64)


def exp_columns(z: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """z = exp(z - shift[None, :]) in place (shift: at least each column's maximum); returns
    the column sums (added in float64 whatever the dtype: 50,000 terms a column)."""
    total = np.zeros(z.shape[1], z.dtype)
    if len(z) == 0:
        return total
    if _numba(z):
        from spdnn.kernels import _numba_softmax

        products._nb()
        _numba_softmax.exp_columns(z, shift.astype(z.dtype, copy=False), total,
                                   z.dtype == np.float32)
        return total
    np.subtract(z, shift[None, :], out=z)
    np.exp(z, out=z)
    return z.sum(axis=0, dtype=np.float64).astype(z.dtype)  # as the numba kernel sums


def scale_columns(g: np.ndarray, factor: np.ndarray) -> None:
    """g *= factor[None, :], in place."""
    if len(g) and _numba(g):
        from spdnn.kernels import _numba_softmax

        products._nb()
        _numba_softmax.scale_columns(g, factor.astype(g.dtype, copy=False))
        return
    g *= factor[None, :].astype(g.dtype, copy=False)
