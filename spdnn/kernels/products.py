"""Local sparse kernels behind one interface with interchangeable backends; no MPI here.

Activations are (neurons x batch) C-contiguous: a neuron's row (what is exchanged) is contiguous.

- ``spmm(W, X, bias, out, rows, accumulate)``: Z = W X + b 1^T on a row range, or Z += W X.
  W^T G is ``spmm`` on a stored transpose (``transpose``): a gather, not a scatter.
- ``spmm_act(...)``: the same, fused with X' = min(max(Z, 0), cap) for the next layer.
- ``sddmm(W, D, X, out, bias_grad)``: out[e] = D[i_e, :] . X[j_e, :] for every stored
  (i_e, j_e) of W (the weight gradient) without an nnz x B temporary, and the row sums of D.
- ``apply_slope(G, Z, cap)``: ``G *= h'(Z)`` in place.
- ``activate(act, Z, out)``, ``activation_backward(act, G, Z, H)``: the same two for the other
  activations (spdnn.model.activations), which the products do not fuse.

Backends (spdnn.backends): ``scipy`` (the oracle) and ``numba`` (faster; see
docs/BENCHMARKS.md): each operation's scipy form is here, its numba form beside it, registered
with ``@form``. A matrix with every entry stored (a dense head) goes to BLAS, but for the
backward of one of few rows in the numba backend. ``set_threads`` sets the numba kernels'
threads (default 1).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from spdnn.backends import (  # noqa: F401 (the choice, re-exported: spdnn.kernels)
    BACKENDS,
    active,
    available_backends,
    backend,
    form,
    set_backend,
)
from spdnn.backends import forget as forget_backend  # noqa: F401
from spdnn.comm.threads import default_threads
from spdnn.kernels import dense as _dense
from spdnn.kernels.bfloat16 import is_bfloat16
from spdnn.kernels.dense import ONE_PASS_DENSE_ROWS, blas_ready, dense_values, dense_view
from spdnn.kernels.ranges import concat_ranges
from spdnn.kernels.transposed import Transposed, transpose  # noqa: F401 (kernels.transpose)

if TYPE_CHECKING:
    from spdnn.model.activations import Activation

# Output elements below which a product runs on one thread (Graph Challenge inference, whose
# blocks shrink to the live inputs: with the register-blocked kernels 2^15 measured best of
# 2^13-2^20 for two threads against one, where 2^20, right for the kernels before, left most
# of the second thread's gain unused).
SMALL_PRODUCT = 1 << 15
# Elements of the chunk temporary in the scipy sddmm (about 32 MB in float64).
SDDMM_CHUNK = 1 << 22
_NO_ALIVE = np.zeros(0, dtype=np.int32)
_NO_SUMS = np.zeros(0, dtype=np.float32)
_NO_BIAS = {np.dtype(t).char: np.zeros(0, dtype=t) for t in (np.float32, np.float64)}
_state: dict = {"threads": default_threads(), "numba_ready": False}


def max_threads() -> int:
    """The most threads the numba kernels can use in this process (its pool size, fixed when
    numba loads: ``NUMBA_NUM_THREADS``; see spdnn.comm.threads; 1 without numba)."""
    if "numba" not in available_backends():
        return 1
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def set_threads(n: int) -> None:
    """Threads of the numba kernels in this rank (scipy's: one). Loads numba only to check a
    count above 1 against its pool; else the first kernel applies the count (``_nb``)."""
    if n < 1 or (n > 1 and n > max_threads()):
        raise ValueError(f"threads must be between 1 and {max_threads()} (this process's "
                         f"pool, NUMBA_NUM_THREADS), not {n}")
    _state["threads"] = n
    if "numba" in sys.modules:
        import numba

        numba.set_num_threads(n)


def threads() -> int:
    return int(_state["threads"])


@contextlib.contextmanager
def callers_threads_kept() -> Iterator[None]:
    """Run spdnn's kernels inside, then give numba back the thread count the caller had (its
    pool's size when numba was not loaded before): a library call leaves the caller's thread
    settings as they were."""
    import sys

    before = None
    if "numba" in sys.modules:
        import numba

        before = numba.get_num_threads()
    try:
        yield
    finally:
        if "numba" in sys.modules:
            import numba

            numba.set_num_threads(before or int(numba.config.NUMBA_NUM_THREADS))
            # The next kernel called outside such a call sets this rank's count again: the
            # caller's count must not become spdnn's (2 threads a rank on 2 cores made the
            # MPI tests after an API test many times slower).
            _state["numba_ready"] = False


@contextlib.contextmanager
def _threads_for(elements: int) -> Iterator[None]:
    """One thread for a product of fewer than SMALL_PRODUCT output elements: waking the other
    threads costs more than they save there (the Graph Challenge's late layers, a few live
    samples wide, ran slower on two threads than on one)."""
    if _state["threads"] == 1 or elements >= SMALL_PRODUCT:
        yield
        return
    import numba

    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(_state["threads"])


def _nb():  # noqa: ANN202
    from spdnn.kernels import _numba_products

    if not _state["numba_ready"]:  # numba's own default (or a caller's) is not this rank's
        _state["numba_ready"] = True
        set_threads(min(_state["threads"], max_threads()))
    return _numba_products


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Load (or compile) the active backend's kernels for ``dtypes`` now, outside any timed
    loop."""
    active().warm_up(dtypes)


@form("scipy", "warm_up")
def _nothing_to_load(dtypes: tuple) -> None:
    pass


@form("numba", "warm_up")
def _load_numba(dtypes: tuple) -> None:
    from spdnn.kernels import _numba_softmax, _numba_sparse_inputs

    for module in (_nb(), _numba_softmax, _numba_sparse_inputs):
        module.warm_up(dtypes)


def warm_up_bfloat16() -> None:
    """Load (or compile) the products of bfloat16 blocks and the conversions."""
    active().warm_up_bfloat16()


@form("scipy", "warm_up_bfloat16")
def _nothing_to_load_bfloat16() -> None:
    pass


@form("numba", "warm_up_bfloat16")
def _load_numba_bfloat16() -> None:
    _nb().warm_up((np.uint16,))
    active().compiled("bfloat16").warm_up()


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


Span = tuple[np.ndarray, np.ndarray]


def spmm_act(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None, cap: float | None,
             out_z: np.ndarray, out_x: np.ndarray | None, rows: Rows | None = None,
             accumulate: bool = False, alive: np.ndarray | None = None,
             span: Span | None = None) -> None:
    """As spmm into out_z, and h(Z) rows into out_x when it is given (fused in the numba
    backend); ``alive`` (int32 per column), if given, is set to 1 where h(Z) is nonzero.
    ``span`` = (starts, ends): row i uses W's entries [starts[i], ends[i]) only (a block of
    its columns, read in place: no copy of the block)."""
    active().spmm_act(w, x, bias, cap, out_z, out_x, rows, accumulate, alive, span)


@form("numba", "spmm_act")
def _spmm_act_numba(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None,
                    cap: float | None, out_z: np.ndarray, out_x: np.ndarray | None,
                    rows: Rows | None, accumulate: bool, alive: np.ndarray | None,
                    span: Span | None) -> None:
    if dense_view(w) is not None:  # BLAS
        _spmm_act(w, x, bias, cap, out_z, out_x, rows, accumulate, alive, span)
        return
    r0, r1 = _range(w, rows)
    starts, ends = span if span is not None else (w.indptr[:-1], w.indptr[1:])
    init, nb = 0 if accumulate else (1 if bias is not None else 2), _nb()
    values = dense_values(w) if out_x is None and alive is None and r1 > r0 and \
        x.shape[1] >= _dense.DENSE_ROWS_MIN_BATCH else None
    if values is not None:  # bfloat16's dense head: each row of x read once, not once a row
        lo, hi = int(starts[r0] - w.indptr[r0]), int(ends[r0] - w.indptr[r0])
        with _threads_for((r1 - r0) * x.shape[1]):
            nb.dense_rows(values, x, lo, hi, _NO_BIAS[out_z.dtype.char] if bias is None
                          else bias, out_z, r0, r1, init, min(nb.threads(), r1 - r0))
        return
    with _threads_for((r1 - r0) * x.shape[1]):
        nb.spmm_rows(starts, ends, w.indices, w.data, x, _NO_BIAS[out_z.dtype.char]
                     if bias is None else bias, out_z, r0, r1, init,
                     -1.0 if cap is None else float(cap), out_x is not None,
                     out_z if out_x is None else out_x, _NO_ALIVE if alive is None else alive,
                     nb.threads())


@form("scipy", "spmm_act")
def _spmm_act(w: sp.csr_matrix, x: np.ndarray, bias: np.ndarray | None, cap: float | None,
              out_z: np.ndarray, out_x: np.ndarray | None, rows: Rows | None,
              accumulate: bool, alive: np.ndarray | None, span: Span | None) -> None:
    r0, r1 = _range(w, rows)
    dense = dense_view(w)
    starts, ends = span if span is not None else (w.indptr[:-1], w.indptr[1:])
    if dense is not None and span is not None:  # a block of a dense W's columns: BLAS on it
        lo, hi = int(starts[0] - w.indptr[0]), int(ends[0] - w.indptr[0])
        dense, x = dense[:, lo:hi], x[lo:hi]
    zr = out_z[r0:r1]
    if dense is not None and not accumulate:
        np.matmul(dense[r0:r1], x, out=zr)
    elif dense is not None:
        zr += dense[r0:r1] @ x
    else:
        part = _block(w, starts, ends, r0, r1) @ x
        if accumulate:
            zr += part
        else:
            zr[...] = part
    if bias is not None and not accumulate:
        zr += bias[r0:r1, None]
    if out_x is not None:
        h = np.maximum(out_z[r0:r1], 0)
        if cap is not None:
            np.minimum(h, cap, out=h)
        out_x[r0:r1] = h
        if alive is not None and h.size:
            alive |= np.any(h != 0, axis=0)


def _block(w: sp.csr_matrix, starts: np.ndarray, ends: np.ndarray, r0: int,
           r1: int) -> sp.csr_matrix:
    """Rows [r0, r1) of W restricted to the entries [starts[i], ends[i]) of each row."""
    counts = ends[r0:r1] - starts[r0:r1]
    picked = concat_ranges(starts[r0:r1], counts)
    indptr = np.zeros(r1 - r0 + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_matrix((w.data[picked], w.indices[picked], indptr),
                         shape=(r1 - r0, w.shape[1]))


def sddmm(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray, out: np.ndarray | None = None,
          rows: np.ndarray | None = None, bias_grad: np.ndarray | None = None) -> np.ndarray:
    """Sampled dense-dense product on W's pattern (``rows``: W's ``row_of_entries``, for the
    scipy backend); with ``bias_grad``, also its row sums of d."""
    if out is None:
        out = np.empty(w.nnz, dtype=np.result_type(d, x))
    active().sddmm(w, d, x, out, rows, bias_grad)
    return out


@form("numba", "sddmm")
def _sddmm_numba(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray, out: np.ndarray,
                 rows: np.ndarray | None, bias_grad: np.ndarray | None) -> None:
    if dense_view(w) is not None:  # BLAS
        _sddmm(w, d, x, out, rows, bias_grad)
        return
    _nb().sddmm(w.indptr, w.indices, d, x, out, out if bias_grad is None else bias_grad,
                bias_grad is not None)


@form("scipy", "sddmm")
def _sddmm(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray, out: np.ndarray,
           rows: np.ndarray | None, bias_grad: np.ndarray | None) -> None:
    dense = dense_view(w)
    if bias_grad is not None:
        np.sum(d, axis=1, out=bias_grad)
    if dense is not None:
        np.matmul(d, x.T, out=out.reshape(dense.shape))
        return
    _sampled(d, x, row_of_entries(w) if rows is None else rows, w.indices, out)


def _sampled(d: np.ndarray, x: np.ndarray, i: np.ndarray, j: np.ndarray,
             out: np.ndarray) -> None:
    """out[e] = d[i[e]] . x[j[e]], in chunks that bound the temporaries (scipy backend)."""
    step = max(1, SDDMM_CHUNK // max(1, d.shape[1]))
    for start in range(0, len(out), step):
        stop = min(len(out), start + step)
        np.einsum("ij,ij->i", d[i[start:stop]], x[j[start:stop]], out=out[start:stop])


def backward_products(wt: Transposed, data: np.ndarray, d: np.ndarray, x: np.ndarray,
                      out: np.ndarray, grad_w: np.ndarray, rows: Rows | None = None,
                      base: int = 0, z: np.ndarray | None = None,
                      cap: float | None = None, sums: np.ndarray | None = None) -> None:
    """A layer's two backward products on the rows [r0, r1) of its transpose W^T (from
    ``transpose(W)``; ``data`` is W.data): out[r - base] = (W^T d)[r], times h'(z[r]) when
    ``z`` is given, and grad_w[order[e]] = d[i_e] . x[r] for the entries of those rows (the
    weight gradient, in W's order). One pass in the numba backend; a dense W's too when it
    has at most ``ONE_PASS_DENSE_ROWS`` rows, else BLAS. A bfloat16 ``out`` (numba) is the
    rounded result and ``sums`` its rows' sums (the bias gradient of the layer below)."""
    active().backward_products(wt, data, d, x, out, grad_w, rows, base, z, cap, sums)


@form("numba", "backward_products")
def _backward_numba(wt: Transposed, data: np.ndarray, d: np.ndarray, x: np.ndarray,
                    out: np.ndarray, grad_w: np.ndarray, rows: Rows | None, base: int,
                    z: np.ndarray | None, cap: float | None,
                    sums: np.ndarray | None = None) -> None:
    if wt.dense and wt.shape[1] > ONE_PASS_DENSE_ROWS and data.dtype != np.uint16:  # BLAS
        _backward(wt, data, d, x, out, grad_w, rows, base, z, cap, sums)
        return
    r0, r1 = rows if rows is not None else (0, wt.shape[0])
    mask = z is not None
    _nb().backward_rows(wt.indptr, wt.indices, data, wt.order, d, x, out, base, grad_w,
                        r0, r1, z if mask else out, -1.0 if cap is None else float(cap), mask,
                        _NO_SUMS if sums is None else sums)


@form("scipy", "backward_products")
def _backward(wt: Transposed, data: np.ndarray, d: np.ndarray, x: np.ndarray,
              out: np.ndarray, grad_w: np.ndarray, rows: Rows | None, base: int,
              z: np.ndarray | None, cap: float | None, sums: np.ndarray | None = None) -> None:
    if sums is not None:
        raise ValueError("the scipy backend's backward products give no row sums (bfloat16 "
                         "needs the numba kernels)")
    r0, r1 = rows if rows is not None else (0, wt.shape[0])
    sub = out[r0 - base:r1 - base]
    if wt.dense:  # W dense: grad_w is W's row-major layout, rows of W^T its columns
        blas_ready(data.dtype)
        dense = data.reshape(wt.shape[1], wt.shape[0])
        np.matmul(dense[:, r0:r1].T, d, out=sub)
        gw = grad_w.reshape(wt.shape[1], wt.shape[0])
        if r1 - r0 == wt.shape[0]:  # every column: straight into the gradient
            np.matmul(d, x.T, out=gw)
        elif r1 > r0:
            gw[:, r0:r1] = d @ x[r0:r1].T
    else:
        lo, hi = wt.indptr[r0], wt.indptr[r1]
        order = wt.order[lo:hi]
        block = sp.csr_matrix((data[order], wt.indices[lo:hi], wt.indptr[r0:r1 + 1] - lo),
                              shape=(r1 - r0, wt.shape[1]))
        sub[...] = block @ d
        part = np.empty(hi - lo, dtype=grad_w.dtype)
        own_rows = np.repeat(np.arange(r0, r1), np.diff(wt.indptr[r0:r1 + 1]))
        _sampled(d, x, wt.indices[lo:hi], own_rows, part)
        grad_w[order] = part
    if z is not None:
        apply_slope(sub, z[r0:r1], cap)


def apply_slope(g: np.ndarray, z: np.ndarray, cap: float | None) -> None:
    """``g *= h'(z)`` in place (ReLU, capped when ``cap`` is given: 0 at and beyond the cap)."""
    active().apply_slope(g, z, cap)


@form("numba", "apply_slope")
def _apply_slope_numba(g: np.ndarray, z: np.ndarray, cap: float | None) -> None:
    if not (g.flags.c_contiguous and z.flags.c_contiguous):
        _apply_slope(g, z, cap)
        return
    _nb().apply_slope(g, z, -1.0 if cap is None else float(cap))


@form("scipy", "apply_slope")
def _apply_slope(g: np.ndarray, z: np.ndarray, cap: float | None) -> None:
    keep = z > 0
    if cap is not None:
        keep &= z < cap
    np.multiply(g, keep, out=g)


def _contiguous(*blocks: np.ndarray | None) -> bool:
    return all(b is None or (b.ndim == 2 and b.flags.c_contiguous) for b in blocks)


def activate(act: Activation, z: np.ndarray, out: np.ndarray) -> None:
    """``out = h(z)`` for an activation other than ReLU (which ``spmm_act`` fuses): the numba
    backend's form where it has one, else the definition's numpy form."""
    active().activate(act, z, out)


@form("scipy", "activate")
def _activate(act: Activation, z: np.ndarray, out: np.ndarray) -> None:
    act.apply(z, out)


@form("numba", "activate")
def _activate_numba(act: Activation, z: np.ndarray, out: np.ndarray) -> None:
    if _contiguous(z, out):
        from spdnn.kernels import _numba_activations as nba

        _nb()
        with _threads_for(z.size):
            if act.compiled_value(nba, z, out):
                return
    act.apply(z, out)


def activation_backward(act: Activation, g: np.ndarray, z: np.ndarray,
                        h: np.ndarray | None = None) -> None:
    """``g *= h'(z)`` in place for an activation other than ReLU (``apply_slope``); ``h``, the
    outputs h(z) when at hand (the slopes are read from them where a formula allows; computed
    here when not given). Bfloat16 outputs ``h`` (numba; ``Activation.BFLOAT16``) are read
    widened, and ``z`` is not read."""
    active().activation_backward(act, g, z, h)


def _half(h: np.ndarray | None) -> bool:
    return h is not None and is_bfloat16(h)


@form("scipy", "activation_backward")
def _activation_backward(act: Activation, g: np.ndarray, z: np.ndarray,
                         h: np.ndarray | None) -> None:
    if _half(h):
        raise ValueError("the scipy backend's slopes read no bfloat16 outputs")
    act.backward(g, z, h)


@form("numba", "activation_backward")
def _activation_backward_numba(act: Activation, g: np.ndarray, z: np.ndarray,
                               h: np.ndarray | None) -> None:
    if not _contiguous(g, z, h) and not _half(h):
        act.backward(g, z, h)
        return
    from spdnn.kernels import _numba_activations as nba

    if h is None and act.FROM_OUTPUT:
        h = np.empty_like(z)
        _activate_numba(act, z, h)
    _nb()
    with _threads_for(g.size):
        if act.compiled_slope(nba, g, z, h):
            return
    if _half(h):
        raise ValueError(f"{act.spec}'s slope has no form that reads bfloat16 outputs")
    act.backward(g, z, h)
