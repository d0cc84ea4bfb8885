"""Local sparse kernels behind one interface with interchangeable backends; no MPI here.

Activations are (neurons x batch) C-contiguous arrays, so one neuron's row is contiguous (the
unit the runtime exchanges).

- ``spmm(W, X, bias, out, out_rows)``: Z = W X + b 1^T (row i of W written to out[out_rows[i]]).
- ``spmm_act(W, X, bias, cap, out_z, out_x, out_rows)``: the same, fused with
  X' = min(max(Z, 0), cap) for the next layer.
- ``spmm_t(W, D, out)``: W^T D (backward partial sums over the rows W holds).
- ``sddmm(W, D, X, out)``: out[e] = D[i_e, :] . X[j_e, :] for every stored (i_e, j_e) of W
  (the weight gradient) without an nnz x B temporary.

Backends: ``scipy`` (reference) and ``numba`` (faster; see docs/BENCHMARKS.md). The default is
numba when it is installed, else scipy; ``SPDNN_KERNELS=scipy|numba`` or ``set_backend`` choose.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

# Elements of the chunk temporary in the scipy sddmm (about 32 MB in float64).
SDDMM_CHUNK = 1 << 22
BACKENDS = ("scipy", "numba")
_NO_ALIVE = np.zeros(0, dtype=np.int32)
_state = {"backend": None}


def available_backends() -> list[str]:
    try:
        import numba  # noqa: F401
    except ImportError:
        return ["scipy"]
    return ["scipy", "numba"]


def set_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose from {BACKENDS}")
    if name not in available_backends():
        raise ValueError(f"kernel backend {name!r} is not installed (pip install {name})")
    _state["backend"] = name


def backend() -> str:
    if _state["backend"] is None:
        wanted = os.environ.get("SPDNN_KERNELS", "auto")
        if wanted == "auto":
            wanted = "numba" if "numba" in available_backends() else "scipy"
        set_backend(wanted)
    return str(_state["backend"])


def _nb():  # noqa: ANN202
    from . import _numba_kernels

    return _numba_kernels


def warm_up() -> None:
    """Load (or compile) the active backend's kernels now, outside any timed loop."""
    if backend() == "numba":
        _nb().warm_up()


def row_of_entries(w: sp.csr_matrix) -> np.ndarray:
    """The row index of every stored entry of a CSR matrix."""
    return np.repeat(np.arange(w.shape[0], dtype=w.indices.dtype), np.diff(w.indptr))


def _zeros_bias(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None,
                out_rows: np.ndarray | None, out: np.ndarray) -> np.ndarray:
    if bias is not None:
        return bias
    return np.zeros(out.shape[0] if out_rows is not None else w.shape[0], dtype=x.dtype)


def spmm(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None = None,
         out: np.ndarray | None = None, out_rows: np.ndarray | None = None) -> np.ndarray:
    if out is None:
        out = np.empty((w.shape[0], x.shape[1]), dtype=x.dtype)
    if backend() == "numba" and w.nnz:
        rows = np.arange(w.shape[0]) if out_rows is None else out_rows
        b = _zeros_bias(w, x, bias, out_rows, out)
        _nb().spmm_rows(w.indptr, w.indices, w.data, x, b, out, rows, -1.0, False, out,
                        _NO_ALIVE)
        return out
    z = w @ x
    rows = slice(None) if out_rows is None else out_rows
    if bias is not None:
        z += bias[rows, None]
    out[rows] = z
    return out


def spmm_act(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray, cap: float | None,
             out_z: np.ndarray, out_x: np.ndarray, out_rows: np.ndarray | None = None,
             alive: np.ndarray | None = None) -> None:
    """Z rows into out_z and h(Z) rows into out_x (fused in the numba backend); ``alive``
    (int32 per column), if given, is set to 1 where a written h(Z) row is nonzero."""
    if backend() == "numba" and w.nnz:
        rows = np.arange(w.shape[0]) if out_rows is None else out_rows
        _nb().spmm_rows(w.indptr, w.indices, w.data, x, bias, out_z, rows,
                        -1.0 if cap is None else float(cap), True, out_x,
                        _NO_ALIVE if alive is None else alive)
        return
    spmm(w, x, bias, out_z, out_rows)
    rows = slice(None) if out_rows is None else out_rows
    h = np.maximum(out_z[rows], 0)
    if cap is not None:
        np.minimum(h, cap, out=h)
    out_x[rows] = h
    if alive is not None and h.size:
        alive |= np.any(h != 0, axis=0)


def spmm_t(w: sp.csr_matrix, d: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if out is None:
        out = np.empty((w.shape[1], d.shape[1]), dtype=d.dtype)
    if backend() == "numba":
        _nb().spmm_t(w.indptr, w.indices, w.data, d, out)
        return out
    out[...] = w.T @ d
    return out


def sddmm(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray, out: np.ndarray | None = None,
          rows: np.ndarray | None = None) -> np.ndarray:
    """Sampled dense-dense product on W's pattern."""
    nnz = w.nnz
    if out is None:
        out = np.empty(nnz, dtype=np.result_type(d, x))
    if backend() == "numba":
        _nb().sddmm(w.indptr, w.indices, d, x, out)
        return out
    if rows is None:
        rows = row_of_entries(w)
    step = max(1, SDDMM_CHUNK // max(1, d.shape[1]))
    for start in range(0, nnz, step):
        stop = min(nnz, start + step)
        np.einsum("ij,ij->i", d[rows[start:stop]], x[w.indices[start:stop]],
                  out=out[start:stop])
    return out
