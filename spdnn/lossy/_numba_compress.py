"""numba kernels of the gradient compressors (spdnn.lossy.compress): one pass each over the vector.

Compaction is branch-free (every position is written, the count advances only past a kept
one), so its speed does not depend on how many values pass the threshold; the output buffers
need room for all of them.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels._simd import above_lanes, compress_iota, compress_store, popcount
from spdnn.kernels.cache_loads import lean_cache_loads
from spdnn.lossy.thresholds import below  # noqa: F401 (the halves' one rule)


@nb.njit(cache=True, nogil=True, fastmath=True)
def abs_sum(x):
    """Sum of |x| (accumulated in float64; the pass is bound by memory, not the adds)."""
    s = 0.0
    for i in range(len(x)):
        s += abs(np.float64(x[i]))
    return s


@nb.njit(cache=True, nogil=True)
def select_above(x, t, idx, val):
    """Positions i with |x[i]| > t (t of x's type, see ``below``) into idx[:c] (ascending)
    and x[i] into val[:c], one 512-bit vector at a time; returns c. idx and val need one
    vector of room beyond n; idx's integers have x's width (lanes match)."""
    n = len(x)
    lanes = 64 // x.itemsize
    c = k = 0
    while k + lanes <= n:
        m = above_lanes(x, k, t)
        compress_iota(k, idx, c, m)
        compress_store(x, k, val, c, m)
        c += popcount(m)
        k += lanes
    while k < n:
        v = x[k]
        idx[c] = k
        val[c] = v
        c += abs(v) > t
        k += 1
    return c


@nb.njit(cache=True, nogil=True)
def keep_above(idx, val, n, t):
    """Compact idx[:n], val[:n] in place to the entries with |val| > t (t of val's type; a
    vector's packed lanes land at or before the vector itself); returns their count."""
    lanes = 64 // val.itemsize
    c = k = 0
    while k + lanes <= n:
        m = above_lanes(val, k, t)
        compress_store(idx, k, idx, c, m)
        compress_store(val, k, val, c, m)
        c += popcount(m)
        k += lanes
    while k < n:
        v = val[k]
        idx[c] = idx[k]
        val[c] = v
        c += abs(v) > t
        k += 1
    return c


@nb.njit(cache=True, nogil=True, fastmath=True)
def excess_moments(val, n, shift):
    """Mean and (population) variance of |val[:n]| - shift, in float64 (one pass: the
    excesses are of one scale, no cancellation worth a second pass)."""
    s = 0.0
    s2 = 0.0
    for j in range(n):
        d = abs(np.float64(val[j])) - shift
        s += d
        s2 += d * d
    m = max(n, 1)
    mean = s / m
    return mean, max(s2 / m - mean * mean, 0.0)


@nb.njit(cache=True, nogil=True, fastmath=True)
def abs_moments(x):
    """Mean and (population) variance of |x|, in float64."""
    s = 0.0
    s2 = 0.0
    for i in range(len(x)):
        m = abs(np.float64(x[i]))
        s += m
        s2 += m * m
    n = max(len(x), 1)
    mean = s / n
    return mean, max(s2 / n - mean * mean, 0.0)


@nb.njit(cache=True, nogil=True, fastmath=True)
def abs_log_moments(x):
    """Mean of |x| and of log|x| over the nonzero entries, and their count (the gamma fit
    needs log|x|, undefined at 0)."""
    s = 0.0
    sl = 0.0
    nz = 0
    for i in range(len(x)):
        m = abs(np.float64(x[i]))
        if m > 0.0:
            s += m
            sl += np.log(m)
            nz += 1
    if nz == 0:
        return 0.0, 0.0, 0
    return s / nz, sl / nz, nz


def warm_up() -> None:
    for dt, it in ((np.float32, np.int32), (np.float64, np.int64)):
        x = np.ones(20, dtype=dt)
        idx, val = np.empty(40, dtype=it), np.empty(40, dtype=dt)
        abs_sum(x)
        abs_moments(x)
        abs_log_moments(x)
        n = select_above(x, dt(0.5), idx, val)
        n = keep_above(idx, val, n, dt(0.5))
        excess_moments(val, n, 0.0)


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
