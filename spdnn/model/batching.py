"""Sample order and minibatches, the same for every engine and every number of ranks.

Minibatches are B consecutive samples of the epoch's order (file order, or a permutation fixed
by (seed, epoch)); the last one is smaller.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

# A replica that holds only its share of the samples fetches the rows of a segment of batches
# at a time (spdnn.runtime.sample_shares): at most about this many bytes over all replicas (one
# batch at least), held beside the share with its send and receive copies.
SEGMENT_BYTES = 4 << 20
# A dense block of samples is gathered this many samples at a time, each group transposed into
# place: the whole gather (B x features) and its transposed copy held the block twice, and took
# 4.5x as long (2,048 x 4,096 float32 samples, B = 1,024; 16 was the fastest of 8 to 256).
COLUMN_GROUP = 16


def batch_order(n_samples: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """One epoch's sample order."""
    if not shuffle:
        return np.arange(n_samples)
    return np.random.default_rng([seed, epoch]).permutation(n_samples)


def batches(order: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def share_of(n: int, part: int, parts: int) -> slice:
    """Share ``part`` of n items cut into ``parts`` contiguous shares whose sizes differ by at
    most one (the first n mod parts one larger); a share is empty when n < parts. Replicas
    cut batches, evaluation sets and held samples by it."""
    q, extra = divmod(n, parts)
    start = part * q + min(part, extra)
    return slice(start, start + q + (part < extra))


def n_batches(n_samples: int, batch_size: int) -> int:
    return (n_samples + batch_size - 1) // batch_size


@dataclass(frozen=True)
class SparseColumns:
    """A (features x B) block held as its B samples' CSR (``samples``, duplicates summed):
    its nonzero rows are known without a scan, and filling a buffer writes only them."""

    samples: sp.csr_matrix

    @property
    def shape(self) -> tuple[int, int]:
        return self.samples.shape[1], self.samples.shape[0]

    def live(self) -> np.ndarray:
        """The block's rows that hold a stored value, ascending."""
        return np.unique(self.samples.indices)

    def scatter(self, out: np.ndarray, values: np.ndarray | None = None) -> None:
        """Write the stored values (or ``values`` in their place: the same, rounded) into
        ``out`` (features x B), whose other entries stay."""
        s = self.samples
        out[s.indices, np.repeat(np.arange(s.shape[0]), np.diff(s.indptr))] = \
            s.data if values is None else values


def sample_block(x: np.ndarray | sp.csr_matrix, idx: np.ndarray | slice
                 ) -> np.ndarray | SparseColumns:
    """Samples ``idx`` as ``columns`` gives them, but CSR data as ``SparseColumns``."""
    if sp.issparse(x):
        sub = sp.csr_matrix(x[idx])
        sub.sum_duplicates()
        return SparseColumns(sub)
    return columns(x, idx)


def columns(x: np.ndarray | sp.csr_matrix, idx: np.ndarray | slice) -> np.ndarray:
    """Samples ``idx`` of a (samples x features) array, dense or CSR, as a contiguous
    (features x B) block."""
    if sp.issparse(x):  # scattered straight into the block: no dense copy to transpose
        block = sample_block(x, idx)
        out = np.zeros(block.shape, dtype=x.dtype)
        block.scatter(out)
        return out
    if isinstance(idx, slice):  # a view: one copy
        return np.ascontiguousarray(x[idx].T)
    out = np.empty((x.shape[1], len(idx)), x.dtype)
    for s in range(0, len(idx), COLUMN_GROUP):
        out[:, s:s + COLUMN_GROUP] = x[idx[s:s + COLUMN_GROUP]].T
    return out
