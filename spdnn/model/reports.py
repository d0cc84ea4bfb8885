"""Result records shared by the serial reference and the MPI runtime."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True)
class EpochReport:
    """One epoch (or the part of it that ran): mean loss and accuracy over the samples seen."""

    epoch: int
    steps: int  # optimizer steps completed so far, over the whole run
    loss: float  # the mean of the steps' losses during the epoch (as the weights moved)
    train_accuracy: float | None  # running: the steps' predictions (None: real targets)
    test_accuracy: float | None
    seconds: float
    samples_per_second: float
    megabytes_sent: float = 0.0  # by the training steps (evaluation passes not included)
    epoch_steps: int = 0  # steps run in this report
    epoch_batches: int = 0  # batches of a whole epoch (epoch_steps is fewer when resumed or cut)
    samples: int = 0  # processed by this report's steps
    model_values: float = 0.0  # carried by the exchange between parts (all ranks)
    gradient_values: float = 0.0  # put into the gradient sums over replicas (all ranks)
    gradient_megabytes: float = 0.0
    compression_ratio: float | None = None  # achieved: values sent / values (with --compress)
    select_seconds: float = 0.0  # compressors' selection time, slowest rank
    # label sets (extreme classification): on the test split; test_accuracy is P@1 then
    precision_at_1: float | None = None
    precision_at_5: float | None = None
    active_outputs: float | None = None  # --lsh: mean active output neurons per sample
    # --clip-grad-norm: the mean norm of the gradient before clipping, the steps it scaled
    gradient_norm: float | None = None
    clipped_steps: int | None = None
    # --validation-split: the held-out samples' mean loss and accuracy after the epoch
    validation_loss: float | None = None
    validation_accuracy: float | None = None

    @property
    def partial(self) -> bool:
        return self.epoch_steps < self.epoch_batches

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The epoch's line in the run's output."""
        test = f", test accuracy {self.test_accuracy:.4f}" if self.test_accuracy is not None \
            else ""
        if self.precision_at_5 is not None:
            test = f", test P@1 {self.precision_at_1:.4f}, P@5 {self.precision_at_5:.4f}"
        part = f" ({self.epoch_steps} of {self.epoch_batches} steps)" if self.partial else ""
        sums = f", gradient sums {self.gradient_megabytes:,.1f} MB" \
            if self.gradient_values else ""
        if self.active_outputs is not None:
            sums += f", {self.active_outputs:,.0f} active LSH neurons per sample"
        if self.compression_ratio is not None:
            sums += f" (ratio {self.compression_ratio:.4f}, selection {self.select_seconds:.2f} s)"
        if self.clipped_steps is not None:
            norm = f"{self.gradient_norm:.4g}" if self.gradient_norm is not None else "-"
            sums += f", gradient norm {norm} (clipped {self.clipped_steps} steps)"
        if self.validation_loss is not None:
            accuracy = "" if self.validation_accuracy is None else \
                f", validation accuracy {self.validation_accuracy:.4f}"
            test = f", validation loss {self.validation_loss:.4f}{accuracy}{test}"
        running = "" if self.train_accuracy is None else \
            f", running train accuracy {self.train_accuracy:.4f}"
        return (f"epoch {self.epoch:3d}{part}: loss {self.loss:.4f}{running}"
                f"{test}, {self.samples:,} samples, "
                f"{self.samples_per_second:,.0f} samples/s, "
                f"{self.megabytes_sent:,.1f} MB exchanged by its steps{sums}")


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


def short_sizes(sizes: Sequence[int]) -> str:
    """Layer sizes as ``64x256x10``, or first and last with the layer count when long."""
    if len(sizes) <= 6:
        return "x".join(map(str, sizes))
    return f"{sizes[0]}x...x{sizes[-1]} ({len(sizes) - 1} layers)"
