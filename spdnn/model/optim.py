"""SGD with ``torch.optim.SGD`` semantics, on a flat list of parameter arrays.

Momentum without dampening or Nesterov; weight decay on every parameter, biases included.
Both engines use it: the serial reference on whole layers, the runtime on each rank's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SGDConfig:
    """The optimizer's hyper-parameters (internal: the API takes them in ``TrainOptions``,
    whose defaults these are)."""

    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0


def parameters(layers: Iterable[Any]) -> list[np.ndarray]:
    """W_1.data, b_1, W_2.data, b_2, ... of anything with ``weight`` (CSR) and ``bias``
    (views: updating them updates the layers)."""
    out: list[np.ndarray] = []
    for layer in layers:
        out += [layer.weight.data, layer.bias]
    return out


def interleave(weights: list[np.ndarray], biases: list[np.ndarray]) -> list[np.ndarray]:
    """Gradients in the order of ``parameters``."""
    return [a for pair in zip(weights, biases) for a in pair]


@dataclass(frozen=True)
class RowGrad:
    """The gradient of some entries of a parameter only (LSH-selected rows): the others are
    not updated at all this step (no weight decay, no momentum), as SLIDE trains. The
    entries are ``positions``, or with ``counts`` runs of them: positions[k], positions[k] +
    1, ..., counts[k] entries (a row's weights), the runs' values one after the other."""

    positions: np.ndarray
    values: np.ndarray
    counts: np.ndarray | None = None

    def entries(self) -> np.ndarray:
        """Every entry's position, runs spelled out."""
        if self.counts is None:
            return self.positions
        counts = np.asarray(self.counts, dtype=np.int64)
        shift = np.asarray(self.positions, dtype=np.int64) - (np.cumsum(counts) - counts)
        return np.repeat(shift, counts) + np.arange(int(counts.sum()))


@dataclass
class SGD:
    """Updates ``params`` in place with one scratch array per parameter (no allocation per
    step); ``buffers`` are the momentum buffers (None until the first step, as in torch).
    ``fused(p, g, buf, lr, momentum, weight_decay, first) -> bool``, when given, may do a
    parameter's update in one pass instead (spdnn.kernels.update.sgd_step, the runtime's);
    ``fused_rows(p, grad, buf, lr, momentum, weight_decay) -> bool`` the same for a RowGrad
    (spdnn.kernels.update.sgd_rows)."""

    config: SGDConfig
    params: list[np.ndarray]
    buffers: list[np.ndarray | None] = field(default_factory=list)
    fused: Callable[..., bool] | None = None
    fused_rows: Callable[..., bool] | None = None

    def __post_init__(self) -> None:
        if not self.buffers:
            self.buffers = [None] * len(self.params)
        self._scratch = [np.empty_like(p) for p in self.params]

    def step(self, grads: list[np.ndarray | RowGrad]) -> None:
        c = self.config
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if isinstance(g, RowGrad):
                self._step_rows(i, g)
                continue
            if self.fused is not None and self._fused(i, g):
                continue
            d = self._scratch[i]
            if c.weight_decay:
                np.multiply(p, c.weight_decay, out=d)
                d += g
            else:
                np.copyto(d, g)
            if c.momentum:
                buf = self.buffers[i]
                if buf is None:
                    self.buffers[i] = d.copy()  # torch: the first buffer is the gradient
                else:
                    buf *= c.momentum
                    buf += d
                np.multiply(self.buffers[i], c.lr, out=d)
            else:
                d *= c.lr
            p -= d

    def _fused(self, i: int, g: np.ndarray) -> bool:
        c, p, buf = self.config, self.params[i], self.buffers[i]
        first = bool(c.momentum) and buf is None
        if first:
            buf = np.empty_like(p)
        done = self.fused(p, g, p if buf is None else buf, c.lr, c.momentum, c.weight_decay,
                          first)
        if done and c.momentum:
            self.buffers[i] = buf
        return done

    def _step_rows(self, i: int, g: RowGrad) -> None:
        """The update of ``step`` on the entries ``g.positions`` alone; a momentum buffer
        starts at zero, so an entry's first update uses its gradient as torch's first step."""
        c, p = self.config, self.params[i]
        if c.momentum and self.buffers[i] is None:
            self.buffers[i] = np.zeros_like(p)
        if self.fused_rows is not None and self.fused_rows(
                p, g, self.buffers[i] if c.momentum else p, c.lr, c.momentum, c.weight_decay):
            return
        idx = g.entries()
        d = g.values.astype(p.dtype, copy=True)
        if c.weight_decay:
            d = p[idx] * c.weight_decay + d
        if c.momentum:
            buf = self.buffers[i]
            b = buf[idx] * c.momentum + d
            buf[idx] = b
            d = b * c.lr
        else:
            d *= c.lr
        p[idx] -= d
