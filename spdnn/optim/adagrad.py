"""``torch.optim.Adagrad``: settings, state and the numpy update, with torch's roundings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from spdnn.optim.optimizer import Optimizer
from spdnn.schema import Number, check, declare, option


@declare
@dataclass(frozen=True)
class AdagradConfig:
    """``torch.optim.Adagrad``'s settings and defaults."""

    lr: float = option(1e-2, "learning rate", Number(), record="same")
    lr_decay: float = option(0.0, "Adagrad: step t runs at lr / (1 + (t - 1) lr_decay)",
                             Number(), record="same")
    weight_decay: float = option(0.0, "weight decay on every parameter, biases included",
                                 Number(), record="same")
    initial_accumulator_value: float = option(
        0.0, "Adagrad: the value its sum of squared gradients starts at (a grown weight's "
             "too)", Number(), record="same")
    eps: float = option(1e-10, "term added to the denominator", Number(open="low"),
                        record="same")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class Adagrad(Optimizer):
    """``torch.optim.Adagrad``: g += wd p; s += g^2; p -= clr g / (sqrt(s) + eps), with
    clr = lr / (1 + (t - 1) lr_decay) at step t; s starts at initial_accumulator_value."""

    name: ClassVar[str] = "adagrad"
    STATE: ClassVar[tuple[str, ...]] = ("sum",)
    Config: ClassVar[type] = AdagradConfig
    TORCH: ClassVar[str] = "Adagrad"

    def fresh(self, name: str) -> float:
        return self.config.initial_accumulator_value

    def _dense(self, i: int, p: np.ndarray, g: np.ndarray) -> None:
        c = self.config
        if c.weight_decay:
            g = g + p * c.weight_decay
        s = self.state[i].get("sum")
        if s is None:
            s = self.state[i]["sum"] = np.full_like(p, c.initial_accumulator_value)
        s += g * g
        std = np.sqrt(s)
        std += c.eps
        clr = self.lr / (1 + (self.steps - 1) * c.lr_decay)
        p += -clr * g / std  # torch's addcdiv: value * t1 / t2, left to right
