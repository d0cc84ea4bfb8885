"""Index arithmetic shared by the file readers, the runtime and the partitioner."""

from __future__ import annotations

import numpy as np


def concat_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The ranges [start, start + count) one after the other as one index array (e.g. the
    entries of some CSR rows: starts = indptr[rows], counts = row lengths)."""
    counts = np.asarray(counts, dtype=np.int64)
    shift = np.asarray(starts, dtype=np.int64) - np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.repeat(shift, counts) + np.arange(int(counts.sum()))


def segment_ids(ptr: np.ndarray) -> np.ndarray:
    """The segment of every entry of a CSR-like ``ptr`` (e.g. the sample of each active pair)."""
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
