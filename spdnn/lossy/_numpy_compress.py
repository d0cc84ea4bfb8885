"""The gradient compressors' passes in numpy (spdnn.lossy.compress), for the scipy backend:
what spdnn.lossy._numba_compress computes, with the same arguments and results (the sums in
float64, in numpy's order: equal to the numba half's within their rounding)."""

from __future__ import annotations

import numpy as np

from spdnn.lossy.thresholds import below  # noqa: F401 (the halves' one rule)


def abs_sum(x: np.ndarray) -> float:
    """Sum of |x|, accumulated in float64."""
    return float(np.abs(x).sum(dtype=np.float64))


def _select(x: np.ndarray, t: np.floating, idx: np.ndarray, val: np.ndarray,
            positions: np.ndarray) -> int:
    keep = np.abs(x) > t
    c = int(np.count_nonzero(keep))
    idx[:c] = positions[keep]
    val[:c] = x[keep]
    return c


def select_above(x: np.ndarray, t: np.floating, idx: np.ndarray, val: np.ndarray) -> int:
    """Positions i with |x[i]| > t into idx[:c] (ascending), x[i] into val[:c]; returns c."""
    return _select(x, t, idx, val, np.arange(len(x), dtype=idx.dtype))


def keep_above(idx: np.ndarray, val: np.ndarray, n: int, t: np.floating) -> int:
    """Compact idx[:n], val[:n] in place to the entries with |val| > t; returns their count."""
    return _select(val[:n].copy(), t, idx, val, idx[:n].copy())


def _moments(d: np.ndarray) -> tuple[float, float]:
    m = max(len(d), 1)
    mean = float(d.sum()) / m
    return mean, max(float((d * d).sum()) / m - mean * mean, 0.0)


def excess_moments(val: np.ndarray, n: int, shift: float) -> tuple[float, float]:
    """Mean and (population) variance of |val[:n]| - shift, in float64."""
    return _moments(np.abs(val[:n].astype(np.float64)) - shift)


def abs_moments(x: np.ndarray) -> tuple[float, float]:
    """Mean and (population) variance of |x|, in float64."""
    return _moments(np.abs(x.astype(np.float64)))


def abs_log_moments(x: np.ndarray) -> tuple[float, float, int]:
    """Mean of |x| and of log|x| over the nonzero entries, and their count."""
    m = np.abs(x.astype(np.float64))
    m = m[m > 0]
    if not len(m):
        return 0.0, 0.0, 0
    return float(m.sum()) / len(m), float(np.log(m).sum()) / len(m), len(m)


def warm_up() -> None:
    """Nothing to compile."""
