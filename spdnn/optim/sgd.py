"""``torch.optim.SGD`` (no dampening): settings, state, the numpy update and its fused kernel
(spdnn.optim._numba_sgd)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from spdnn.errors import OptionError
from spdnn.optim.optimizer import Optimizer, Parallel, RowGrad
from spdnn.schema import Boolean, Number, check, declare, option


@declare
@dataclass(frozen=True)
class SGDConfig:
    """``torch.optim.SGD``'s settings. torch has no default rate; spdnn's is 0.05."""

    lr: float = option(0.05, "learning rate", Number(), record="same")
    momentum: float = option(0.9, "momentum factor (SGD: no dampening)", Number(),
                             record="same")
    weight_decay: float = option(0.0, "weight decay on every parameter, biases included "
                                      "(AdamW's decoupled)", Number(), record="same")
    nesterov: bool = option(False, "SGD: Nesterov momentum", Boolean(), record="same")

    def __post_init__(self) -> None:
        check(self)
        if self.nesterov and self.momentum == 0:
            raise OptionError("nesterov", "needs a momentum above 0 (as torch.optim.SGD)")


@dataclass
class SGD(Optimizer):
    """``torch.optim.SGD``: d = g + wd p; buf = d at the first step, else m buf + d;
    Nesterov takes d + m buf, plain momentum buf; p -= lr d."""

    name: ClassVar[str] = "sgd"
    STATE: ClassVar[tuple[str, ...]] = ("momentum_buffer",)
    Config: ClassVar[type] = SGDConfig
    TORCH: ClassVar[str] = "SGD"

    @classmethod
    def state_arrays(cls, config: Any) -> int:  # noqa: ANN401
        return 1 if config.momentum else 0

    @classmethod
    def kept_state(cls, settings: dict[str, Any]) -> set[str]:
        return set(cls.STATE) if settings.get("momentum") else set()

    @classmethod
    def rows_refusal(cls, config: Any) -> str | None:  # noqa: ANN401
        return None

    @classmethod
    def warm_up(cls, dtype: type, rows: bool = False) -> None:
        from spdnn.optim import _numba_sgd

        t = np.dtype(dtype).type
        p, g, buf = (np.zeros(1, dtype) for _ in range(3))
        for nesterov in (False, True):
            _numba_sgd.sgd(p, g, buf, t(0), t(0), t(0), True, nesterov)
        if rows:  # entries by int64 position; runs by row start (a layer's indptr's type)
            at, offsets = np.zeros(1, np.int64), np.array([0, 1], np.int64)
            _numba_sgd.sgd_rows(p, at, g, buf, t(0), t(0), t(0), False)
            for index in (np.int32, np.int64):
                _numba_sgd.sgd_runs(p, at.astype(index), offsets, g, buf, t(0), t(0), t(0),
                                    False)

    def _dense(self, i: int, p: np.ndarray, g: np.ndarray) -> None:
        c = self.config
        d = self.scratch(i)
        if c.weight_decay:
            np.multiply(p, c.weight_decay, out=d)
            d += g
        else:
            np.copyto(d, g)
        if c.momentum:
            buf = self.state[i].get("momentum_buffer")
            if buf is None:
                buf = self.state[i]["momentum_buffer"] = d.copy()  # torch: the gradient
            else:
                buf *= c.momentum
                buf += d
            if c.nesterov:
                d += buf * c.momentum
            else:
                np.copyto(d, buf)
        d *= self.lr
        p -= d

    def _rows(self, i: int, p: np.ndarray, g: RowGrad) -> None:
        """The update on the entries of ``g`` alone; a buffer starts at zero, so an entry's
        first update uses its gradient as torch's first step does."""
        c = self.config
        idx = g.entries()
        d = g.values.astype(p.dtype, copy=True)
        if c.weight_decay:
            d = p[idx] * c.weight_decay + d
        if c.momentum:
            buf = self.state[i].get("momentum_buffer")
            if buf is None:
                buf = self.state[i]["momentum_buffer"] = np.zeros_like(p)
            b = buf[idx] * c.momentum + d
            buf[idx] = b
            d = d + b * c.momentum if c.nesterov else b
        p[idx] -= d * self.lr

    def fused(self, i: int, p: np.ndarray, g: np.ndarray | RowGrad) -> bool:
        c, state, par = self.config, self.state[i], self.parallel
        assert par is not None
        if isinstance(g, RowGrad):
            if c.momentum and "momentum_buffer" not in state:
                state["momentum_buffer"] = np.zeros_like(p)
            return step_rows(par, p, g, state.get("momentum_buffer", p), self.lr, c.momentum,
                             c.weight_decay, c.nesterov)
        buf = state.get("momentum_buffer")
        first = bool(c.momentum) and buf is None
        if first:
            buf = np.empty_like(p)
        done = step(par, p, g, p if buf is None else buf, self.lr, c.momentum, c.weight_decay,
                    first, c.nesterov)
        if done and first:
            state["momentum_buffer"] = buf
        return done


def step(par: Parallel, p: np.ndarray, g: np.ndarray, buf: np.ndarray, lr: float,
         momentum: float, weight_decay: float, first: bool, nesterov: bool = False) -> bool:
    """SGD's update of ``p`` in place in one pass (``buf`` the momentum buffer, set to the
    gradient on the ``first`` step), where ``par`` applies; False otherwise (the caller keeps
    numpy's passes: the same bits)."""
    if g.dtype != p.dtype or not par.applies(p, g, buf):
        return False
    from spdnn.optim import _numba_sgd

    par.ready()
    t = p.dtype.type
    _numba_sgd.sgd(p, g, buf, t(lr), t(momentum), t(weight_decay), first, nesterov)
    return True


def step_rows(par: Parallel, p: np.ndarray, grad: RowGrad, buf: np.ndarray, lr: float,
              momentum: float, weight_decay: float, nesterov: bool = False) -> bool:
    """``step`` on the entries of ``grad`` alone (distinct; runs of entries one pass a run),
    the momentum buffer ``buf`` (zeros where never updated; ignored without momentum); False
    where ``par`` does not apply."""
    values = grad.values
    if values.dtype != p.dtype or not par.applies(values, grad.positions) \
            or not par.applies(p, buf):
        return False
    from spdnn.optim import _numba_sgd

    par.ready()
    t = p.dtype.type
    if grad.counts is None:
        _numba_sgd.sgd_rows(p, grad.positions, values, buf, t(lr), t(momentum),
                            t(weight_decay), nesterov)
        return True
    offsets = np.zeros(len(grad.counts) + 1, dtype=np.int64)
    np.cumsum(grad.counts, out=offsets[1:])
    _numba_sgd.sgd_runs(p, grad.positions, offsets, values, buf, t(lr), t(momentum),
                        t(weight_decay), nesterov)
    return True
