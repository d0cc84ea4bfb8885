"""A first layer over a sparse input block (features x batch, as extreme classification's
inputs are: about 40 of 20,000 features a sample, some 3,000 of the 20,000 rows nonzero in a
batch of 128). The numba backend skips the entries whose input row is zero in every column;
the results are the full kernels' (their other terms are zeros). Elsewhere, and for blocks
with more than ``LIVE_AT_MOST`` of their rows nonzero, the full kernels run."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from spdnn.kernels import products

# Measured on 20,000 -> 128 (4,096 entries a row), batch 128, one thread: the full kernels
# took 10 ms (forward) and 20 ms (gradient) at any density; with 15% of the rows live the
# skipping ones 1-3 ms, plus 1 ms for finding the live rows.
LIVE_AT_MOST = 0.25


def live_rows(x: np.ndarray) -> np.ndarray | None:
    """A mask of the rows of ``x`` holding a nonzero, when the skipping kernels apply."""
    if products.backend() != "numba" or not x.flags.c_contiguous or x.size == 0:
        return None
    from spdnn.kernels import _numba_inputs

    products._nb()  # this rank's thread count
    live = np.empty(len(x), np.uint8)
    _numba_inputs.live_rows(x, live)
    return live if np.count_nonzero(live) <= LIVE_AT_MOST * len(x) else None


def spmm_act(w: sp.csr_matrix, x: np.ndarray, live: np.ndarray, bias: np.ndarray,
             cap: float | None, z: np.ndarray, h: np.ndarray | None) -> None:
    """``products.spmm_act(w, x, bias, cap, z, h)`` with ``live`` from ``live_rows(x)``."""
    from spdnn.kernels import _numba_inputs

    _numba_inputs.spmm_live(w.indptr, w.indices, w.data, x, live, bias, z,
                            z if h is None else h, -1.0 if cap is None else float(cap),
                            h is not None)


def sddmm(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray, live: np.ndarray | None,
          out: np.ndarray, bias_grad: np.ndarray) -> None:
    """``products.sddmm(w, d, x, out, bias_grad=bias_grad)``, skipping the rows of x that
    ``live`` (from ``live_rows(x)``; None: none skipped) marks as zero."""
    if live is None:
        products.sddmm(w, d, x, out=out, bias_grad=bias_grad)
        return
    from spdnn.kernels import _numba_inputs

    _numba_inputs.sddmm_live(w.indptr, w.indices, d, x, live, out, bias_grad)

