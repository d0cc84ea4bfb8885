"""A synthetic extreme-classification task of the repository's shape (``spdnn generate
xc-data``): sparse inputs, power-law (Zipf) label frequencies as in the real sets, and labels
that a network can learn.

The hidden teacher: every label has a signature of ``SIGNATURE`` features (drawn from a
power law over the features, as word frequencies are). A sample draws 1 + Poisson(m - 1)
distinct labels (m = ``labels_per_sample``) with Zipf probabilities over a seeded
permutation of the label ids, then each signature feature of each of its labels with
probability ``KEEP``, plus noise features (power law as well) up to about
``features_per_sample``; values are positive (signal heavier than noise) and each sample is
scaled to unit L2 norm, as tf-idf inputs are. Samples are independent draws, so files come
shuffled. Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.model.labels import MultiLabels

SIGNATURE = 12
KEEP = 0.6
MAX_LABELS_PER_SAMPLE = 32


@dataclass(frozen=True, kw_only=True)
class XCTask:
    """Sizes of a synthetic task."""

    train_samples: int = 20_000
    test_samples: int = 4_000
    features: int = 10_000
    labels: int = 5_000
    features_per_sample: float = 40.0
    labels_per_sample: float = 3.0
    label_exponent: float = 1.0  # Zipf: label of frequency rank r drawn with p ~ r^-a
    feature_exponent: float = 0.8

    def check(self) -> None:
        for name in ("train_samples", "test_samples", "features", "labels"):
            v = getattr(self, name)
            if not 1 <= v <= 2**31 - 1:
                raise ValueError(f"{name.replace('_', ' ')} must lie in [1, 2^31), not {v}")
        if not 1 <= self.labels_per_sample <= min(MAX_LABELS_PER_SAMPLE, self.labels):
            raise ValueError("labels per sample must lie in [1, min(32, labels)], not "
                             f"{self.labels_per_sample}")
        if not 1 <= self.features_per_sample <= self.features:
            raise ValueError("features per sample must lie in [1, features], not "
                             f"{self.features_per_sample}")
        for name in ("label_exponent", "feature_exponent"):
            if not 0 <= getattr(self, name) <= 4:
                raise ValueError(f"{name.replace('_', ' ')} must lie in [0, 4]")


def _power_law(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities ~ rank^-exponent over n items, ranks given to the items at random."""
    p = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    p /= p.sum()
    return p[rng.permutation(n)]


def _draw(task: XCTask, n: int, signatures: np.ndarray, label_p: np.ndarray,
          feature_cdf: np.ndarray, rng: np.random.Generator
          ) -> tuple[sp.csr_matrix, MultiLabels]:
    counts = np.minimum(1 + rng.poisson(task.labels_per_sample - 1, n), MAX_LABELS_PER_SAMPLE)
    counts = np.minimum(counts, task.labels)
    rows = np.repeat(np.arange(n), counts)
    drawn = rng.choice(task.labels, size=len(rows), p=label_p)
    # distinct labels per sample, ascending
    key = np.unique(rows.astype(np.int64) * task.labels + drawn)
    rows, labels = key // task.labels, key % task.labels
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    y = MultiLabels(indptr, labels.astype(np.int64), task.labels)
    # signal: each signature feature of each label, kept with probability KEEP
    sig = signatures[labels]
    kept = rng.random(sig.shape) < KEEP
    sig_rows = np.repeat(rows, SIGNATURE).reshape(sig.shape)[kept]
    sig_cols = sig[kept]
    sig_vals = rng.uniform(1.0, 2.0, len(sig_cols))
    # noise, power law over the features
    per = np.maximum(task.features_per_sample - KEEP * SIGNATURE * counts, 1.0)
    noise_n = rng.poisson(per)
    noise_rows = np.repeat(np.arange(n), noise_n)
    noise_cols = np.minimum(np.searchsorted(feature_cdf, rng.random(len(noise_rows))),
                            task.features - 1)
    noise_vals = rng.uniform(0.0, 1.0, len(noise_rows))
    x = sp.coo_matrix((np.concatenate([sig_vals, noise_vals]),
                       (np.concatenate([sig_rows, noise_rows]),
                        np.concatenate([sig_cols, noise_cols]))),
                      shape=(n, task.features)).tocsr()  # repeats are summed
    x.sum_duplicates()
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    x = sp.diags(1.0 / np.maximum(norms, 1e-12)) @ x
    x.data = np.round(x.data, 6)  # what the text file keeps
    x.eliminate_zeros()
    return sp.csr_matrix(x), y


def synthetic_xc(task: XCTask, seed: int = 0
                 ) -> tuple[sp.csr_matrix, MultiLabels, sp.csr_matrix, MultiLabels]:
    """Training features and labels, then test features and labels."""
    task.check()
    rng = np.random.default_rng([seed, 0x5C])
    label_p = _power_law(task.labels, task.label_exponent, rng)
    feature_cdf = np.cumsum(_power_law(task.features, task.feature_exponent, rng))
    signatures = np.minimum(np.searchsorted(feature_cdf, rng.random((task.labels, SIGNATURE))),
                            task.features - 1).astype(np.int64)
    x, y = _draw(task, task.train_samples, signatures, label_p, feature_cdf, rng)
    xt, yt = _draw(task, task.test_samples, signatures, label_p, feature_cdf, rng)
    return x, y, xt, yt
