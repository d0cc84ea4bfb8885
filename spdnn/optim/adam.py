"""``torch.optim.Adam`` and ``torch.optim.AdamW``: settings, state, the numpy update (dense,
and lazy on sampled rows as ``torch.optim.SparseAdam``) and its fused kernel
(spdnn.optim._numba_adam)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from spdnn.optim.optimizer import Optimizer, RowGrad
from spdnn.schema import Number, Numbers, check, declare, option


@declare
@dataclass(frozen=True)
class AdamConfig:
    """``torch.optim.Adam``'s settings and defaults (no amsgrad)."""

    lr: float = option(1e-3, "learning rate", Number(), record="same")
    betas: tuple[float, float] = option(
        (0.9, 0.999), "Adam's and AdamW's moment decays", Numbers(Number(0, 1, open="high"), 2,
                                                        "two numbers in [0, 1)"),
        metavar="B1,B2", record="same")
    eps: float = option(1e-8, "term added to the denominator", Number(open="low"),
                        record="same")
    weight_decay: float = option(0.0, "weight decay on every parameter, biases included "
                                      "(AdamW's decoupled)", Number(), record="same")

    def __post_init__(self) -> None:
        check(self)


@declare
@dataclass(frozen=True)
class AdamWConfig(AdamConfig):
    """``torch.optim.AdamW``'s: Adam's, with its decoupled weight decay of 1e-2."""

    weight_decay: float = option(1e-2, "weight decay on every parameter, biases included "
                                       "(AdamW's decoupled)", Number(), record="same")


@dataclass
class Adam(Optimizer):
    """``torch.optim.Adam`` (its single-tensor form): g += wd p; m = lerp(m, g, 1 - b1);
    v = b2 v + (1 - b2) g^2; p -= (lr / c1) m / (sqrt(v) / sqrt(c2) + eps), with
    c1 = 1 - b1^t, c2 = 1 - b2^t. Rows of a RowGrad (LSH) are updated lazily, as
    ``torch.optim.SparseAdam`` updates a sparse gradient (it has no weight decay)."""

    name: ClassVar[str] = "adam"
    STATE: ClassVar[tuple[str, ...]] = ("exp_avg", "exp_avg_sq")
    Config: ClassVar[type] = AdamConfig
    TORCH: ClassVar[str] = "Adam"
    decoupled: ClassVar[bool] = False  # AdamW: p *= 1 - lr wd, and no g += wd p

    @classmethod
    def rows_refusal(cls, config: Any) -> str | None:  # noqa: ANN401
        if config.weight_decay:
            return ("its sampled rows are updated lazily, as torch.optim.SparseAdam does, "
                    "which has no weight decay (give a weight decay of 0)")
        return None

    @classmethod
    def warm_up(cls, dtype: type, rows: bool = False) -> None:
        from spdnn.optim import _numba_adam

        z = np.dtype(dtype).type(0)
        p, g, m, v = (np.zeros(1, dtype) for _ in range(4))
        _numba_adam.adam(p, g, m, v, z, z, z, z, True, z, z, z, z + 1, z + 1, False)

    def moments(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.state[i]
        if not s:
            s["exp_avg"], s["exp_avg_sq"] = (np.zeros_like(self.params[i]) for _ in range(2))
        return s["exp_avg"], s["exp_avg_sq"]

    def scalars(self) -> tuple[float, float]:
        """This step's -lr / c1 and sqrt(c2), as torch computes them (Python floats)."""
        c = self.config
        b1, b2 = c.betas
        return -(self.lr / (1 - b1 ** self.steps)), (1 - b2 ** self.steps) ** 0.5

    def _dense(self, i: int, p: np.ndarray, g: np.ndarray) -> None:
        c = self.config
        b1, b2 = c.betas
        m, v = self.moments(i)
        d = self.scratch(i)
        if c.weight_decay and self.decoupled:
            p *= 1 - self.lr * c.weight_decay
        if c.weight_decay and not self.decoupled:
            np.multiply(p, c.weight_decay, out=d)
            d += g
            g = d
        # torch's lerp: m + w (g - m) for a weight below 0.5, else g - (g - m) (1 - w)
        w = 1 - b1
        diff = np.subtract(g, m)
        if abs(w) < 0.5:
            diff *= w
            m += diff
        else:
            diff *= 1 - w
            np.subtract(g, diff, out=m)
        v *= b2
        v += (1 - b2) * g * g
        step, root = self.scalars()
        np.sqrt(v, out=d)
        d /= root
        d += c.eps
        np.divide(step * m, d, out=d)
        p += d

    def _rows(self, i: int, p: np.ndarray, g: RowGrad) -> None:
        """``torch.optim.SparseAdam`` on the entries of ``g``: m += (g - m)(1 - b1),
        v += (g^2 - v)(1 - b2), p -= lr sqrt(c2) / c1 * m / (sqrt(v) + eps)."""
        c = self.config
        b1, b2 = c.betas
        m, v = self.moments(i)
        idx = g.entries()
        if not len(idx):
            return
        grad = g.values.astype(p.dtype, copy=False)
        old_m, old_v = m[idx], v[idx]
        dm = (grad - old_m) * (1 - b1)
        dv = (grad ** 2 - old_v) * (1 - b2)
        m[idx] = old_m + dm
        v[idx] = old_v + dv
        numer = dm + old_m
        denom = np.sqrt(dv + old_v) + c.eps
        size = self.lr * math.sqrt(1 - b2 ** self.steps) / (1 - b1 ** self.steps)
        p[idx] += -size * (numer / denom)

    def fused(self, i: int, p: np.ndarray, g: np.ndarray | RowGrad) -> bool:
        """A dense gradient in one pass (a RowGrad keeps numpy's lazy form)."""
        par = self.parallel
        assert par is not None
        if isinstance(g, RowGrad) or g.dtype != p.dtype or not par.applies(p, g):
            return False
        from spdnn.optim import _numba_adam

        c = self.config
        b1, b2 = c.betas
        m, v = self.moments(i)
        step, root = self.scalars()
        par.ready()
        t = p.dtype.type
        _numba_adam.adam(p, g, m, v, t(1 - self.lr * c.weight_decay), t(c.weight_decay),
                         t(1 - b1), t(1 - (1 - b1)), abs(1 - b1) < 0.5, t(b2), t(1 - b2),
                         t(step), t(root), t(c.eps), self.decoupled)
        return True

    @classmethod
    def torch_settings(cls, config: Any) -> dict[str, Any]:  # noqa: ANN401
        return {"lr": config.lr, "betas": config.betas, "eps": config.eps,
                "weight_decay": config.weight_decay}


@dataclass
class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay, p *= 1 - lr wd before the
    step, in place of g += wd p."""

    name: ClassVar[str] = "adamw"
    Config: ClassVar[type] = AdamWConfig
    TORCH: ClassVar[str] = "AdamW"
    decoupled: ClassVar[bool] = True
