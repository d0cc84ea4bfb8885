"""The entries of least value over every rank of a communicator, without gathering them: a
search over the values' bit patterns, one all-reduce of a count per bit, the entries tied at
the threshold gathered and ordered by key (layer scope's drops and RigL's growth agree on
them so)."""

from __future__ import annotations

import numpy as np

from spdnn.comm.mpi import Communicator


def float_bits(values: np.ndarray) -> np.ndarray:
    """Non-negative floats as integers of the same order (float64's bit pattern)."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)


def select_least(comm: Communicator, bits: np.ndarray, keys: np.ndarray, count: int
                 ) -> np.ndarray:
    """Which of this rank's entries are among the ``count`` of least (bits, key) over every
    rank of ``comm`` (keys unique over the ranks): a search over the bit patterns, one
    all-reduce of a count per bit, then the entries tied at the threshold gathered and ordered
    by key. Collective."""
    total = int(comm.allreduce_scalar(float(len(bits))))
    if count <= 0:
        return np.zeros(len(bits), dtype=bool)
    if count >= total:
        return np.ones(len(bits), dtype=bool)
    lo, hi = 0, 2**64 - 1  # the least threshold T with count(bits <= T) >= count
    while lo < hi:
        mid = (lo + hi) // 2
        at_most = comm.allreduce_scalar(float(np.count_nonzero(bits <= np.uint64(mid))))
        lo, hi = (lo, mid) if at_most >= count else (mid + 1, hi)
    t = np.uint64(lo)
    below = bits < t
    need = count - int(comm.allreduce_scalar(float(np.count_nonzero(below))))
    tied = bits == t
    ties = np.sort(comm.allgather_rows(keys[tied].astype(np.int64)[:, None])[:, 0])
    return below | (tied & in_sorted(ties[:need], keys))


def in_sorted(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each of ``keys`` is in ``sorted_keys`` (ascending)."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys
