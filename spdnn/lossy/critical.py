"""Critical-set training (ClipDL, "Accelerating deep learning systems via critical set
identification and model compression"): a full pass over the training samples every
``refresh`` epochs measures each sample's loss; the epochs between train only on the
``fraction`` of samples with the highest loss in the last full pass.

The set is the same on every rank and every grid: each replica records the losses of the
samples it trained, the pass's losses are summed over the replicas, and ties are broken by
sample index.
"""

from __future__ import annotations

import math

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.model.batching import batch_order


class CriticalSet:
    def __init__(self, n_samples: int, fraction: float, refresh: int) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"--critical-set must lie in (0, 1], not {fraction}")
        if refresh < 1:
            raise ValueError(f"--refresh must be at least 1, not {refresh}")
        self.n, self.fraction, self.refresh = n_samples, fraction, refresh
        self.losses: np.ndarray | None = None  # of the last complete full pass
        self.pending = np.zeros(n_samples)  # this full pass's, for my replica's samples

    def full(self, epoch: int) -> bool:
        """A full pass (which measures the losses): every ``refresh`` epochs, and whenever no
        full pass has measured them yet."""
        return self.losses is None or epoch % self.refresh == 0

    def chosen(self) -> np.ndarray:
        """The samples of the critical set, ascending."""
        assert self.losses is not None
        m = max(1, math.ceil(self.fraction * self.n))
        top = np.argsort(-self.losses, kind="stable")[:m]  # ties: the lower index first
        return np.sort(top)

    def order(self, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
        """The epoch's sample order: all samples, or the critical set shuffled like an epoch
        of that many samples."""
        if self.full(epoch):
            return batch_order(self.n, epoch, seed, shuffle)
        chosen = self.chosen()
        return chosen[batch_order(len(chosen), epoch, seed, shuffle)]

    def record(self, samples: np.ndarray, losses: np.ndarray) -> None:
        self.pending[samples] = losses

    def gathered(self, data: Communicator) -> np.ndarray:
        """This pass's losses so far, of every replica's samples (collective over ``data``)."""
        return data.allreduce(self.pending) if data.size > 1 else self.pending.copy()

    def end_pass(self, data: Communicator) -> None:
        """A full pass ended: its losses become the ones the next epochs choose by."""
        self.losses = self.gathered(data)
        self.pending[:] = 0
