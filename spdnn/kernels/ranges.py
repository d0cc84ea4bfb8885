"""Index arithmetic shared by the file readers, the runtime and the partitioner."""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=1024)
def row_chunks(n: int, parts: int) -> tuple[tuple[int, int], ...]:
    """[start, end) of ``parts`` near-equal chunks of ``n`` rows (fewer when n < parts; one
    when n = 0); cached: the runtime asks per layer and step."""
    bounds = np.linspace(0, n, max(1, min(parts, n)) + 1).astype(int)
    return tuple((int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))


def concat_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The ranges [start, start + count) one after the other as one index array (e.g. the
    entries of some CSR rows: starts = indptr[rows], counts = row lengths)."""
    counts = np.asarray(counts, dtype=np.int64)
    shift = np.asarray(starts, dtype=np.int64) - np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.repeat(shift, counts) + np.arange(int(counts.sum()))


def segment_ids(ptr: np.ndarray) -> np.ndarray:
    """The segment of every entry of a CSR-like ``ptr`` (e.g. the sample of each active pair)."""
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
