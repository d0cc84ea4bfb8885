"""The SGD update of a training step for the numba backend (the hook
``spdnn.model.optim.SGD(fused=...)``), in one pass split over the kernel threads. The scipy
backend, and any array below ``PARALLEL_MIN`` values (where starting threads costs more than
it saves), keep numpy's passes: the same bits."""

from __future__ import annotations

import numpy as np

from spdnn.kernels import products
from spdnn.model.optim import RowGrad

PARALLEL_MIN = 1 << 15


def _numba(*arrays: np.ndarray) -> bool:
    first = arrays[0]
    return (len(first) >= PARALLEL_MIN and products.backend() == "numba"
            and all(a.flags.c_contiguous and a.ndim == 1 for a in arrays))


def sgd_step(p: np.ndarray, g: np.ndarray, buf: np.ndarray, lr: float, momentum: float,
             weight_decay: float, first: bool) -> bool:
    """torch.optim.SGD's update of ``p`` in place in one pass (momentum without dampening or
    Nesterov; ``buf`` the momentum buffer, set to the gradient on the ``first`` step), when
    the numba backend applies; False otherwise (the caller keeps numpy's passes: same bits)."""
    if g.dtype != p.dtype or not _numba(p, g, buf):
        return False
    from spdnn.kernels import _numba_update

    products._nb()  # the thread count set for this rank
    t = p.dtype.type
    _numba_update.sgd(p, g, buf, t(lr), t(momentum), t(weight_decay), first)
    return True


def sgd_rows(p: np.ndarray, grad: RowGrad, buf: np.ndarray, lr: float, momentum: float,
             weight_decay: float) -> bool:
    """``sgd_step`` on the entries of ``grad`` alone (distinct; runs of entries one pass a
    run), the momentum buffer ``buf`` (zeros where never updated; ignored without
    momentum); False where the numba backend does not apply."""
    values = grad.values
    if values.dtype != p.dtype or not _numba(values, grad.positions) or not _numba(p, buf):
        return False
    from spdnn.kernels import _numba_update

    products._nb()
    t = p.dtype.type
    if grad.counts is None:
        _numba_update.sgd_rows(p, grad.positions, values, buf, t(lr), t(momentum),
                               t(weight_decay))
        return True
    offsets = np.zeros(len(grad.counts) + 1, dtype=np.int64)
    np.cumsum(grad.counts, out=offsets[1:])
    _numba_update.sgd_runs(p, grad.positions, offsets, values, buf, t(lr), t(momentum),
                           t(weight_decay))
    return True


def warm_up(dtypes: tuple = (np.float32, np.float64), *, rows: bool = False) -> None:
    """Load (or compile) the numba backend's update kernels for ``dtypes`` now (with
    ``rows``, also those of row gradients): a job loads them with its others, before it
    gives back the compiler's pages, not in its first step on top of its layers (that
    brought LLVM's ~66 MB back: tests/test_residency.py)."""
    if products.backend() != "numba":
        return
    from spdnn.kernels import _numba_update

    for dt in dtypes:
        t = np.dtype(dt).type
        p, g, buf = (np.zeros(1, dt) for _ in range(3))
        _numba_update.sgd(p, g, buf, t(0), t(0), t(0), True)
        if rows:  # entries by int64 position; runs by row start (a layer's indptr's type)
            at, offsets = np.zeros(1, np.int64), np.array([0, 1], np.int64)
            _numba_update.sgd_rows(p, at, g, buf, t(0), t(0), t(0))
            for index in (np.int32, np.int64):
                _numba_update.sgd_runs(p, at.astype(index), offsets, g, buf, t(0), t(0), t(0))
