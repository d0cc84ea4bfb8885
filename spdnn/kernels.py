"""Local sparse kernels behind one interface; they know nothing of MPI.

Column convention: activations are (neurons x batch) C-contiguous arrays, so one neuron's row
is contiguous (the unit the runtime exchanges).

- ``spmm(W, X, bias, out)``: Z = W X + b 1^T (forward).
- ``spmm_t(W, D, out)``: W^T D (backward, partial sums over the rows W holds).
- ``sddmm(W, D, X, out)``: out[e] = D[i_e, :] . X[j_e, :] for every stored (i_e, j_e) of W
  (the weight gradient), computed in bounded chunks: never an nnz x B temporary.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

# Elements of the chunk temporary in sddmm (about 32 MB in float64).
SDDMM_CHUNK = 1 << 22


def spmm(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None = None,
         out: np.ndarray | None = None) -> np.ndarray:
    z = w @ x
    if bias is not None:
        z += bias[:, None]
    if out is not None:
        out[...] = z
        return out
    return z


def spmm_t(w: sp.csr_matrix, d: np.ndarray) -> np.ndarray:
    return np.asarray(w.T @ d)


def row_of_entries(w: sp.csr_matrix) -> np.ndarray:
    """The row index of every stored entry of a CSR matrix."""
    return np.repeat(np.arange(w.shape[0], dtype=w.indices.dtype), np.diff(w.indptr))


def sddmm(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray, out: np.ndarray | None = None,
          rows: np.ndarray | None = None) -> np.ndarray:
    """Sampled dense-dense product on W's pattern, in chunks of at most SDDMM_CHUNK elements."""
    nnz = w.nnz
    if out is None:
        out = np.empty(nnz, dtype=np.result_type(d, x))
    if rows is None:
        rows = row_of_entries(w)
    batch = max(1, d.shape[1])
    step = max(1, SDDMM_CHUNK // batch)
    for start in range(0, nnz, step):
        stop = min(nnz, start + step)
        np.einsum("ij,ij->i", d[rows[start:stop]], x[w.indices[start:stop]],
                  out=out[start:stop])
    return out
