"""Each row's largest entries of a block of scores (RigL's growth: the columns of largest
|dL/dw| a row does not hold), ties the lower column; no MPI here.

The numba backend selects in one pass over each row (spdnn.kernels._numba_selection); the
scipy backend, and blocks that are not C-contiguous, numpy's partition of each row: the same
columns."""

from __future__ import annotations

import numpy as np

from spdnn.backends import active


def largest_per_row(score: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``counts[r]`` columns of largest ``score[r]`` of every row r (ties: the lower
    column; a count at or above the row's length: every column) as (rows, columns), by row and
    then column. Scores are finite or -inf."""
    counts = np.minimum(np.asarray(counts, dtype=np.int64), score.shape[1]).clip(0)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    cols = np.empty(int(starts[-1]), dtype=np.int64)
    if not len(cols):
        return rows, cols
    nbs = active().compiled("selection")
    if nbs is not None and score.flags.c_contiguous:
        nbs.largest_per_row(score, counts, starts, cols)
        return rows, cols
    for r in np.flatnonzero(counts):
        cols[starts[r]:starts[r + 1]] = _largest(score[r], int(counts[r]))
    return rows, cols


def _largest(score: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` columns of largest ``score`` (ties: the lower column), ascending: a
    partition, not a sort of the row."""
    if count >= len(score):
        return np.arange(len(score), dtype=np.int64)
    threshold = np.partition(score, len(score) - count)[len(score) - count]
    above = np.flatnonzero(score > threshold)
    tied = np.flatnonzero(score == threshold)[:count - len(above)]
    return np.sort(np.concatenate([above, tied])).astype(np.int64)


def warm_up(dtypes: tuple[type, ...] = (np.float32, np.float64)) -> None:
    """Compile (or load) the numba kernel for each value type, where the backend runs it."""
    nbs = active().compiled("selection")
    if nbs is None:
        return
    for dtype in dtypes:
        cols = np.empty(1, np.int64)
        nbs.largest_per_row(np.zeros((1, 2), dtype), np.ones(1, np.int64),
                            np.zeros(2, np.int64), cols)
