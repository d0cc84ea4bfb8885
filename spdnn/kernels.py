"""Local sparse kernels behind one interface with interchangeable backends; no MPI here.

Activations are (neurons x batch) C-contiguous arrays, so one neuron's row is contiguous (the
unit the runtime exchanges).

- ``spmm(W, X, bias, out, rows, accumulate)``: Z = W X + b 1^T on a row range, or Z += W X.
- ``spmm_act(...)``: the same, fused with X' = min(max(Z, 0), cap) for the next layer.
- ``spmm_t(W, D, out, rows, accumulate)``: W^T D (backward partial sums over the rows W holds).
  Row ranges let the runtime compute in chunks and progress messages between them.
- ``sddmm(W, D, X, out)``: out[e] = D[i_e, :] . X[j_e, :] for every stored (i_e, j_e) of W
  (the weight gradient) without an nnz x B temporary.

Backends: ``scipy`` (reference) and ``numba`` (faster; see docs/BENCHMARKS.md). The default is
numba when it is installed, else scipy; ``SPDNN_KERNELS=scipy|numba`` or ``set_backend`` choose.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from .errors import SpdnnError

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
        try:
            set_backend(wanted)
        except ValueError as exc:
            raise SpdnnError(f"SPDNN_KERNELS={wanted!r}: {exc}") from None
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


Rows = tuple[int, int]


def _range(w: sp.csr_matrix, rows: Rows | None) -> Rows:
    return (0, w.shape[0]) if rows is None else rows


def spmm(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None = None,
         out: np.ndarray | None = None, rows: Rows | None = None,
         accumulate: bool = False) -> np.ndarray:
    """out[r0:r1] = W[r0:r1] x + bias[r0:r1] (or + out[r0:r1] when ``accumulate``)."""
    if out is None:
        out = np.empty((w.shape[0], x.shape[1]), dtype=x.dtype)
    spmm_act(w, x, bias, None, out, None, rows, accumulate)
    return out


def spmm_act(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None, cap: float | None,
             out_z: np.ndarray, out_x: np.ndarray | None, rows: Rows | None = None,
             accumulate: bool = False, alive: np.ndarray | None = None) -> None:
    """As spmm into out_z, and h(Z) rows into out_x when it is given (fused in the numba
    backend); ``alive`` (int32 per column), if given, is set to 1 where h(Z) is nonzero."""
    r0, r1 = _range(w, rows)
    if backend() == "numba":
        b = bias if bias is not None else np.zeros(w.shape[0], dtype=x.dtype)
        _nb().spmm_rows(w.indptr, w.indices, w.data, x, b, out_z, r0, r1, accumulate,
                        -1.0 if cap is None else float(cap), out_x is not None,
                        out_z if out_x is None else out_x,
                        _NO_ALIVE if alive is None else alive)
        return
    part = w[r0:r1] @ x if (r0, r1) != (0, w.shape[0]) else w @ x
    if accumulate:
        out_z[r0:r1] += part
    else:
        out_z[r0:r1] = part
        if bias is not None:
            out_z[r0:r1] += bias[r0:r1, None]
    if out_x is not None:
        h = np.maximum(out_z[r0:r1], 0)
        if cap is not None:
            np.minimum(h, cap, out=h)
        out_x[r0:r1] = h
        if alive is not None and h.size:
            alive |= np.any(h != 0, axis=0)


def spmm_t(w: sp.csr_matrix, d: np.ndarray, out: np.ndarray | None = None,
           rows: Rows | None = None, accumulate: bool = False) -> np.ndarray:
    """out = W[r0:r1]^T d[r0:r1] (or out += ... when ``accumulate``)."""
    if out is None:
        out = np.empty((w.shape[1], d.shape[1]), dtype=d.dtype)
    r0, r1 = _range(w, rows)
    if not accumulate:
        out[...] = 0
    if backend() == "numba":
        _nb().spmm_t(w.indptr, w.indices, w.data, d, out, r0, r1)
        return out
    part = w[r0:r1] if (r0, r1) != (0, w.shape[0]) else w
    out += part.T @ d[r0:r1]
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
