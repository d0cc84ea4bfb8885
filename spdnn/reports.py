"""Result records shared by the serial reference and the MPI runtime."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class EpochReport:
    """One epoch (or the part of it that ran): mean loss and accuracy over the samples seen."""

    epoch: int
    steps: int  # SGD steps completed so far, over the whole run
    loss: float
    train_accuracy: float
    test_accuracy: float | None
    seconds: float
    samples_per_second: float
    megabytes_sent: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChallengeResult:
    """Graph Challenge inference: the categories and the official rate."""

    categories: np.ndarray  # 1-based indices of inputs whose last activation row is nonzero
    seconds: float  # the inference loop alone
    n_inputs: int
    edges: int  # sum of nnz over layers

    @property
    def rate(self) -> float:
        """inputs x edges / seconds."""
        return self.n_inputs * self.edges / max(self.seconds, 1e-12)
