"""Sample order and minibatches, the same for every engine and every number of ranks.

Minibatches are B consecutive samples of the epoch's order (file order, or a permutation fixed
by (seed, epoch)); the last one is smaller.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp


def batch_order(n_samples: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """One epoch's sample order."""
    if not shuffle:
        return np.arange(n_samples)
    return np.random.default_rng([seed, epoch]).permutation(n_samples)


def batches(order: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def n_batches(n_samples: int, batch_size: int) -> int:
    return (n_samples + batch_size - 1) // batch_size


def columns(x: np.ndarray | sp.csr_matrix, idx: np.ndarray | slice) -> np.ndarray:
    """Samples ``idx`` of a (samples x features) array, dense or CSR, as a contiguous
    (features x B) block."""
    if sp.issparse(x):  # scattered straight into the block: no dense copy to transpose
        sub = sp.csr_matrix(x[idx])
        sub.sum_duplicates()
        out = np.zeros((x.shape[1], sub.shape[0]), dtype=x.dtype)
        out[sub.indices, np.repeat(np.arange(sub.shape[0]), np.diff(sub.indptr))] = sub.data
        return out
    return np.ascontiguousarray(x[idx].T)
