"""A first layer over a sparse input block (features x batch, as extreme classification's
inputs are: about 40 of 20,000 features a sample, some 3,000 of the 20,000 rows nonzero in a
batch of 128). The numba backend reads only W's columns on the rows of the block that hold a
nonzero, through W's transpose (8 bytes an entry, built on first use, as the backward
products of the other layers build theirs); the results are the full kernels' (their other
terms are zeros). Elsewhere, and for blocks with more than ``LIVE_AT_MOST`` of their rows
nonzero, the full kernels run."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from spdnn.kernels import products
from spdnn.kernels.transposed import Transposed

# The full kernels take the same time at any density; with a small share of the rows live, a
# scan of W's rows that skips the dead entries cuts it by more than half, and a walk over the
# live columns (these kernels) is an order of magnitude faster; they are taken up to a quarter
# of the rows live.
LIVE_AT_MOST = 0.25


def live_rows(x: np.ndarray, known: np.ndarray | None = None) -> np.ndarray | None:
    """The rows of ``x`` holding a nonzero (ascending), when the skipping kernels apply;
    ``known``: rows that hold every nonzero, ascending (a sparse block's), taken unscanned."""
    if products.active().compiled("sparse_inputs") is None or not x.flags.c_contiguous \
            or x.size == 0:
        return None
    from spdnn.kernels import _numba_sparse_inputs

    if known is not None:  # int64, as a scan's: one compiled signature per value type
        live = np.asarray(known, dtype=np.int64)
    else:
        mask = np.empty(len(x), np.uint8)
        _numba_sparse_inputs.live_rows(x, mask)
        live = np.flatnonzero(mask)
    return live if len(live) <= LIVE_AT_MOST * len(x) else None


def spmm_act(wt: Transposed, data: np.ndarray, x: np.ndarray, live: np.ndarray,
             bias: np.ndarray, cap: float | None, z: np.ndarray, h: np.ndarray | None) -> None:
    """``products.spmm_act(W, x, bias, cap, z, h)`` for W with values ``data`` and transpose
    ``wt`` (``products.transpose``), ``live`` from ``live_rows(x)``."""
    from spdnn.kernels import _numba_sparse_inputs

    _numba_sparse_inputs.spmm_cols(wt.indptr, wt.indices, wt.order, data, x, live, bias, z,
                            z if h is None else h, -1.0 if cap is None else float(cap),
                            h is not None)


def sddmm(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray, live: np.ndarray | None,
          out: np.ndarray, bias_grad: np.ndarray,
          wt: Callable[[], Transposed] | None = None) -> None:
    """``products.sddmm(w, d, x, out, bias_grad=bias_grad)``, skipping the rows of x not in
    ``live`` (from ``live_rows(x)``; None: none skipped, and ``wt``, which gives W's
    transpose, is not called)."""
    if live is None or wt is None:
        products.sddmm(w, d, x, out=out, bias_grad=bias_grad)
        return
    from spdnn.kernels import _numba_sparse_inputs

    t = wt()
    _numba_sparse_inputs.sddmm_cols(t.indptr, t.indices, t.order, d, x, live, out, bias_grad)
