"""Layers with every entry stored (a dense head): their CSR values are the row-major dense
matrix, and BLAS does their products in either backend (but the backward of a head of few rows
in the numba backend, and bfloat16's products, which BLAS does not have: the forward on a
kernel of its own, the backward on the gathers)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

_ready: set[str] = set()
# A dense W's backward goes to the numba backend's one pass (products.backward_products) when W
# has at most this many rows: against BLAS's two products and the slope (float32, one thread),
# the pass won on ten rows (and splits over threads), lost on a few tens, and lost many-fold on
# the tens of thousands of rows of an extreme classifier's head.
ONE_PASS_DENSE_ROWS = 16
# A bfloat16 dense W's forward product runs the kernel that reads each row of X once for all
# rows of W (products.spmm_act) from this batch width up: against the gathers (one thread,
# 10 x 16384 and 4,096 x 1,024 heads) it took 0.6x their time at 256 columns, 0.9x at 128, as
# long at 64, and up to 1.5x below 32, where the gathers' narrow kernels run.
DENSE_ROWS_MIN_BATCH = 128


def dense_values(w: sp.csr_matrix) -> np.ndarray | None:
    """W's values as a dense (rows x cols) view when every entry is stored in order (a dense
    layer), else None."""
    rows, cols = w.shape
    if w.nnz != rows * cols or w.nnz == 0 or not w.has_sorted_indices:
        return None
    return w.data.reshape(rows, cols)


def dense_view(w: sp.csr_matrix) -> np.ndarray | None:
    """``dense_values`` for BLAS: never for bfloat16 values (BLAS has no bfloat16)."""
    if w.dtype == np.uint16 or (view := dense_values(w)) is None:
        return None
    blas_ready(w.dtype)
    return view


def blas_ready(dtype: np.dtype) -> None:
    """One small product per dtype before a process's first dense-layer product: with
    numpy's OpenBLAS (one thread), W^T G of a wide float32 head ran several times slower in
    every call of a process whose first products had other shapes, and at full speed after
    one 128 x 128 by 128 x 2,048 product (a square one did not help; the forward and
    weight-gradient products and float64 were not affected)."""
    if dtype.char not in _ready:
        _ready.add(dtype.char)
        np.ones((128, 128), dtype) @ np.ones((128, 2048), dtype)
