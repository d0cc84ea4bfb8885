"""``torch.optim.RMSprop``: settings, state and the numpy update, with torch's roundings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from spdnn.optim.optimizer import Optimizer
from spdnn.schema import Boolean, Number, check, declare, option


@declare
@dataclass(frozen=True)
class RMSpropConfig:
    """``torch.optim.RMSprop``'s settings and defaults."""

    lr: float = option(1e-2, "learning rate", Number(), record="same")
    alpha: float = option(0.99, "RMSprop's smoothing constant of the squared gradients",
                          Number(0, 1), record="same")
    eps: float = option(1e-8, "term added to the denominator", Number(open="low"),
                        record="same")
    weight_decay: float = option(0.0, "weight decay on every parameter, biases included",
                                 Number(), record="same")
    momentum: float = option(0.0, "momentum factor", Number(), record="same")
    centered: bool = option(False, "RMSprop: divide by an estimate of the gradient's "
                                   "variance, not of its second moment", Boolean(),
                            record="same")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class RMSprop(Optimizer):
    """``torch.optim.RMSprop``: g += wd p; v = alpha v + (1 - alpha) g^2; centered: m =
    lerp(m, g, 1 - alpha), a = sqrt(v - m^2) + eps, else a = sqrt(v) + eps; with momentum
    buf = momentum buf + g / a, p -= lr buf, else p -= lr g / a."""

    name: ClassVar[str] = "rmsprop"
    STATE: ClassVar[tuple[str, ...]] = ("square_avg", "momentum_buffer", "grad_avg")
    Config: ClassVar[type] = RMSpropConfig
    TORCH: ClassVar[str] = "RMSprop"

    @classmethod
    def state_arrays(cls, config: Any) -> int:  # noqa: ANN401
        return 1 + bool(config.momentum) + bool(config.centered)

    @classmethod
    def kept_state(cls, settings: dict[str, Any]) -> set[str]:
        return {"square_avg"} | ({"momentum_buffer"} if settings.get("momentum") else set()) \
            | ({"grad_avg"} if settings.get("centered") else set())

    def _state(self, i: int, name: str) -> np.ndarray:
        s = self.state[i]
        if name not in s:
            s[name] = np.zeros_like(self.params[i])
        return s[name]

    def _dense(self, i: int, p: np.ndarray, g: np.ndarray) -> None:
        c = self.config
        if c.weight_decay:
            g = g + p * c.weight_decay
        v = self._state(i, "square_avg")
        v *= c.alpha
        v += (1 - c.alpha) * g * g  # torch's addcmul: value * t1 * t2, left to right
        if c.centered:
            m = self._state(i, "grad_avg")
            w = 1 - c.alpha  # torch's lerp, as Adam's moment
            if abs(w) < 0.5:
                m += w * (g - m)
            else:
                m[:] = g - (g - m) * (1 - w)
            avg = np.sqrt(v - m * m)
        else:
            avg = np.sqrt(v)
        avg += c.eps
        if c.momentum:
            buf = self._state(i, "momentum_buffer")
            buf *= c.momentum
            buf += g / avg
            p += -self.lr * buf
        else:
            p += -self.lr * g / avg
