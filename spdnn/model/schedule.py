"""Learning-rate schedules, stepped once per optimizer step t = 0, 1, ..., T - 1 (T: the job's
planned steps, epochs x steps per epoch), as ``torch.optim.lr_scheduler.LambdaLR`` steps them:
the rate of step t is lr x factor(t). Both engines use them; a resumed job continues from its
step count, so it ends exactly as one that ran through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from spdnn.errors import OptionError

Kind = Literal["constant", "step", "cosine"]
SCHEDULES: tuple[str, ...] = get_args(Kind)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Warm-up multiplies the rate by (t + 1) / W for t < W; then ``constant`` keeps it,
    ``step`` multiplies it by gamma every ``step_size`` steps (counted from the end of the
    warm-up), ``cosine`` decays it to ``min_lr``:
    m + (1 - m) (1 + cos(pi (t - W) / (T - W))) / 2, m = min_lr / lr."""

    kind: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    step_size: int | None = None
    gamma: float = 0.1
    total: int = 0  # T, the job's planned steps (0: not known yet)

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise OptionError("lr_schedule", f"must be one of {', '.join(SCHEDULES)}, not "
                                             f"{self.kind!r}")
        for name, least in (("warmup_steps", 0), ("total", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise OptionError(name, f"must be an integer >= {least}, not {v!r}")
        if self.kind == "step":
            s = self.step_size
            if isinstance(s, bool) or not isinstance(s, int) or s < 1:
                raise OptionError("step_size", f"must be an integer >= 1 with --lr-schedule "
                                               f"step, not {s!r}")
        elif self.step_size is not None:
            raise OptionError("step_size", "applies to --lr-schedule step only")
        g = self.gamma
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 < g < math.inf:
            raise OptionError("gamma", f"must be a finite number > 0, not {g!r}")
        if g != 0.1 and self.kind != "step":
            raise OptionError("gamma", "applies to --lr-schedule step only")
        m = self.min_lr
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < math.inf:
            raise OptionError("min_lr", f"must be a finite number >= 0, not {m!r}")
        if m and self.kind != "cosine":
            raise OptionError("min_lr", "applies to --lr-schedule cosine only")
        if self.total and self.warmup_steps > self.total:
            raise OptionError("warmup_steps", f"{self.warmup_steps} is longer than the job's "
                                              f"{self.total} steps")

    @property
    def constant(self) -> bool:
        return self.kind == "constant" and self.warmup_steps == 0

    def check_rate(self, lr: float) -> None:
        if self.min_lr > lr:
            raise OptionError("min_lr", f"{self.min_lr:g} is above the rate {lr:g}")

    def factor(self, t: int, lr: float) -> float:
        """The multiplier of step t's rate."""
        w = self.warmup_steps
        if t < w:
            return (t + 1) / w
        if self.kind == "step":
            return self.gamma ** ((t - w) // self.step_size)  # type: ignore[operator]
        if self.kind == "cosine":
            low = self.min_lr / lr if lr else 0.0
            return low + (1 - low) * (1 + math.cos(math.pi * (t - w) / (self.total - w))) / 2
        return 1.0

    def rate(self, t: int, lr: float) -> float:
        """Step t's rate (lr x factor, as LambdaLR computes it)."""
        return lr if self.constant else lr * self.factor(t, lr)

    def settings(self) -> dict[str, object]:
        """What a checkpoint records to refuse a resume on another schedule (T too, unless the
        rate is constant: a constant job may be resumed for more epochs)."""
        if self.constant:
            return {"lr_schedule": "constant", "warmup_steps": 0}
        return {"lr_schedule": self.kind, "warmup_steps": self.warmup_steps,
                "min_lr": self.min_lr, "step_size": self.step_size, "gamma": self.gamma,
                "planned_steps": self.total}

    def describe(self) -> str:  # for a job's first line
        if self.constant:
            return ""
        warm = f", {self.warmup_steps} warm-up steps" if self.warmup_steps else ""
        body = {"constant": "constant", "step": f"step x{self.gamma:g} every "
                f"{self.step_size} steps", "cosine": f"cosine to {self.min_lr:g}"}[self.kind]
        return f"; lr schedule {body}{warm} over {self.total} steps"


def planned(schedule: Schedule, epochs: int, n_samples: int, batch_size: int,
            lr: float) -> Schedule:
    """``schedule`` with its T: ``epochs`` x the steps of an epoch of ``n_samples``; checked
    against the job (a warm-up longer than it, a floor above the rate)."""
    from dataclasses import replace

    out = replace(schedule, total=epochs * -(-n_samples // batch_size))
    out.check_rate(lr)
    return out
