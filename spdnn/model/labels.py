"""Multi-label targets (extreme classification): each sample's label set, stored row by row as
in CSR (``indptr``, ``indices``), with the operations training and evaluation need.

The loss is SLIDE's: softmax cross-entropy with the target mass split evenly over the sample's
labels, t_j = 1 / |labels| (a sample with no labels contributes no loss and no gradient).
Precision at k (P@k) is the share of the k highest outputs that are labels of the sample,
averaged over the samples (a sample with no labels scores 0), as the field reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def is_targets(y: object) -> bool:
    """Real-valued targets (samples x outputs, the mse loss's), not class labels (one per
    sample) or label sets."""
    return isinstance(y, np.ndarray) and y.ndim == 2


@dataclass(frozen=True)
class MultiLabels:
    """Label sets of n samples: sample i's labels are ``indices[indptr[i]:indptr[i + 1]]``
    (ascending, distinct, each below ``n_labels``)."""

    indptr: np.ndarray  # int64, n + 1
    indices: np.ndarray  # int64
    n_labels: int

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.indptr)

    def max(self, initial: int = 0) -> int:
        return int(self.indices.max(initial=initial))

    def __getitem__(self, rows: np.ndarray | slice) -> MultiLabels:
        """The label sets of these samples, in this order."""
        rows = np.arange(len(self))[rows]
        starts, counts = self.indptr[rows], self.counts[rows]
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        # position of every kept label in ``indices``: its row's start plus its rank in the row
        offsets = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], counts)
        return MultiLabels(indptr, self.indices[np.repeat(starts, counts) + offsets],
                           self.n_labels)

    def samples(self) -> np.ndarray:
        """The sample (0..n-1) of each entry of ``indices``."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts)

    def weights(self, dtype: np.dtype) -> np.ndarray:
        """The target mass of each entry of ``indices``: 1 / (its sample's label count)."""
        c = self.counts
        return np.repeat((1.0 / np.maximum(c, 1)).astype(dtype), c)

    def hits(self, top: np.ndarray) -> np.ndarray:
        """For predictions ``top`` (n x k label ids, -1: none), how many of each row are
        labels."""
        n, k = top.shape
        if len(self.indices) == 0:
            return np.zeros(n, dtype=np.int64)
        # (sample, label) as one key: ascending over the whole set, since rows are in order
        # and labels ascend within a row
        width = np.int64(max(self.n_labels, 1))
        keys = self.samples() * width + self.indices
        asked = np.arange(n, dtype=np.int64)[:, None] * width + top.astype(np.int64)
        pos = np.minimum(np.searchsorted(keys, asked), len(keys) - 1)
        # a negative id (no prediction) must not reach into the previous sample's keys
        return np.count_nonzero((keys[pos] == asked) & (top >= 0), axis=1).astype(np.int64)

    def contains(self, labels: np.ndarray) -> np.ndarray:
        """Whether ``labels[i]`` is one of sample i's labels."""
        return self.hits(np.asarray(labels).reshape(-1, 1)) > 0


def as_labels(y: np.ndarray | MultiLabels, n_labels: int) -> MultiLabels:
    """Integer labels as one-label sets (label sets unchanged)."""
    if isinstance(y, MultiLabels):
        return y
    return MultiLabels(np.arange(len(y) + 1, dtype=np.int64), np.asarray(y, np.int64), n_labels)


def precision_at(labels: MultiLabels, top: np.ndarray, k: int) -> float:
    """Mean P@k of the predictions ``top`` (samples x at least k, best first)."""
    if len(labels) == 0:
        return float("nan")
    return float(labels.hits(top[:, :k]).sum()) / (k * len(labels))
