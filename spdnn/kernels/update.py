"""The optimizers' fused updates for the numba backend (the hook
``spdnn.model.optim.Optimizer(fused=fused_update)``), each one pass over a parameter split over
the kernel threads, with the roundings of the optimizer's numpy form. The scipy backend, and
any array below ``PARALLEL_MIN`` values (where starting threads costs more than it saves), keep
numpy's passes: the same bits."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from spdnn.kernels import products
from spdnn.model.optim import Optimizer, RowGrad

PARALLEL_MIN = 1 << 15


def _numba(*arrays: np.ndarray) -> bool:
    first = arrays[0]
    return (len(first) >= PARALLEL_MIN and products.backend() == "numba"
            and all(a.flags.c_contiguous and a.ndim == 1 for a in arrays))


def fused_update(opt: Optimizer, i: int, p: np.ndarray, g: np.ndarray | RowGrad) -> bool:
    """Parameter i's update of ``opt`` in one pass when its optimizer has a kernel and the
    numba backend applies; False otherwise (the optimizer then runs its numpy form)."""
    kernel = _KERNELS.get(opt.name)
    return kernel is not None and kernel(opt, i, p, g)


def _sgd(opt: Optimizer, i: int, p: np.ndarray, g: np.ndarray | RowGrad) -> bool:
    c, state = opt.config, opt.state[i]
    if isinstance(g, RowGrad):
        if c.momentum and "momentum_buffer" not in state:
            state["momentum_buffer"] = np.zeros_like(p)
        return sgd_rows(p, g, state.get("momentum_buffer", p), opt.lr, c.momentum,
                        c.weight_decay, c.nesterov)
    buf = state.get("momentum_buffer")
    first = bool(c.momentum) and buf is None
    if first:
        buf = np.empty_like(p)
    done = sgd_step(p, g, p if buf is None else buf, opt.lr, c.momentum, c.weight_decay, first,
                    c.nesterov)
    if done and first:
        state["momentum_buffer"] = buf
    return done


def sgd_step(p: np.ndarray, g: np.ndarray, buf: np.ndarray, lr: float, momentum: float,
             weight_decay: float, first: bool, nesterov: bool = False) -> bool:
    """torch.optim.SGD's update of ``p`` in place in one pass (no dampening; ``buf`` the
    momentum buffer, set to the gradient on the ``first`` step), when the numba backend
    applies; False otherwise (the caller keeps numpy's passes: same bits)."""
    if g.dtype != p.dtype or not _numba(p, g, buf):
        return False
    from spdnn.kernels import _numba_update

    products._nb()  # the thread count set for this rank
    t = p.dtype.type
    _numba_update.sgd(p, g, buf, t(lr), t(momentum), t(weight_decay), first, nesterov)
    return True


def sgd_rows(p: np.ndarray, grad: RowGrad, buf: np.ndarray, lr: float, momentum: float,
             weight_decay: float, nesterov: bool = False) -> bool:
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
                               t(weight_decay), nesterov)
        return True
    offsets = np.zeros(len(grad.counts) + 1, dtype=np.int64)
    np.cumsum(grad.counts, out=offsets[1:])
    _numba_update.sgd_runs(p, grad.positions, offsets, values, buf, t(lr), t(momentum),
                           t(weight_decay), nesterov)
    return True


def _adam(opt: Optimizer, i: int, p: np.ndarray, g: np.ndarray | RowGrad) -> bool:
    """Adam and AdamW on a dense gradient (a RowGrad keeps numpy's lazy form)."""
    if isinstance(g, RowGrad) or g.dtype != p.dtype or not _numba(p, g):
        return False
    from spdnn.kernels import _numba_update

    c = opt.config
    b1, b2 = c.betas
    m, v = opt.moments(i)  # type: ignore[attr-defined]
    step, root = opt.scalars()  # type: ignore[attr-defined]
    decoupled = bool(getattr(opt, "decoupled", False))
    products._nb()
    t = p.dtype.type
    _numba_update.adam(p, g, m, v, t(1 - opt.lr * c.weight_decay), t(c.weight_decay),
                       t(1 - b1), t(1 - (1 - b1)), abs(1 - b1) < 0.5, t(b2), t(1 - b2),
                       t(step), t(root), t(c.eps), decoupled)
    return True


_KERNELS: dict[str, Callable[..., bool]] = {"sgd": _sgd, "adam": _adam, "adamw": _adam}


def warm_up(dtypes: tuple = (np.float32, np.float64), *, rows: bool = False,
            optimizers: tuple[str, ...] = ("sgd",)) -> None:
    """Load (or compile) the numba backend's update kernels of ``optimizers`` for ``dtypes``
    now (with ``rows``, also those of row gradients): a job loads them with its others, not
    inside its first timed step."""
    if products.backend() != "numba":
        return
    from spdnn.kernels import _numba_update

    for dt in dtypes:
        t = np.dtype(dt).type
        p, g, buf, v = (np.zeros(1, dt) for _ in range(4))
        if "sgd" in optimizers or rows:
            for nesterov in (False, True):
                _numba_update.sgd(p, g, buf, t(0), t(0), t(0), True, nesterov)
        if any(_KERNELS.get(name) is _adam for name in optimizers):
            z = t(0)
            _numba_update.adam(p, g, buf, v, z, z, z, z, True, z, z, z, t(1), t(1),
                               False)
        if rows:  # entries by int64 position; runs by row start (a layer's indptr's type)
            at, offsets = np.zeros(1, np.int64), np.array([0, 1], np.int64)
            _numba_update.sgd_rows(p, at, g, buf, t(0), t(0), t(0), False)
            for index in (np.int32, np.int64):
                _numba_update.sgd_runs(p, at.astype(index), offsets, g, buf, t(0), t(0), t(0),
                                       False)
