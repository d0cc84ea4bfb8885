"""numba kernel of ``spdnn.kernels.selection``: each row's largest entries in one pass over
the row, kept in a small buffer ordered by value (descending) and column (ascending). One
thread: it runs once per topology update, on blocks of a few hundred rows."""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels.cache_loads import lean_cache_loads


@nb.njit(cache=True, nogil=True)
def largest_per_row(score, counts, starts, cols):
    """For each row r, the ``counts[r]`` columns of largest ``score[r]`` (ties: the lower
    column) into ``cols[starts[r]:starts[r] + counts[r]]``, ascending. A count at or above the
    row's length takes every column."""
    n = score.shape[1]
    size = 0
    for r in range(score.shape[0]):
        size = max(size, counts[r])
    values = np.empty(max(size, 1), score.dtype)
    places = np.empty(max(size, 1), np.int64)
    for r in range(score.shape[0]):
        c = counts[r]
        out = starts[r]
        if c <= 0:
            continue
        if c >= n:
            for j in range(n):
                cols[out + j] = j
            continue
        row = score[r]
        filled = 0
        for j in range(n):
            v = row[j]
            if filled < c:
                at = filled
                filled += 1
            elif v > values[c - 1]:
                at = c - 1  # the last place's entry leaves
            else:
                continue  # not larger: an equal value at a later column loses the tie
            while at > 0 and values[at - 1] < v:
                values[at] = values[at - 1]
                places[at] = places[at - 1]
                at -= 1
            values[at] = v
            places[at] = j
        chosen = np.sort(places[:c])
        for k in range(c):
            cols[out + k] = chosen[k]


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
