"""numba kernels of the 2-bit gradient sum (spdnn.lossy.hylo): one pass each over the vector.

A value's code is 0 (below the threshold), 1 (+scale) or 2 (-scale), four codes to a byte,
the first value in the lowest two bits.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels.cache_loads import lean_cache_loads


@nb.njit(cache=True, nogil=True)
def above_stats(x, t):
    """Sum of |x| over the nonzero values with |x| >= t, and their count (float64 sums)."""
    s = 0.0
    c = 0
    for i in range(len(x)):
        m = abs(np.float64(x[i]))
        if m >= t and m > 0.0:
            s += m
            c += 1
    return s, c


@nb.njit(cache=True, nogil=True)
def quantize_pack(x, t, s, out):
    """Codes of x against threshold t (of x's type) into ``out`` (uint8, ceil(n / 4)); each
    sent value, +-s, is taken out of x (error feedback). Returns the count of nonzero codes."""
    n = len(x)
    nz = 0
    for j in range(len(out)):
        b = 0
        for q in range(4):
            i = 4 * j + q
            if i < n:
                v = x[i]
                if v != 0 and v >= t:
                    x[i] = v - s
                    b |= 1 << (2 * q)
                    nz += 1
                elif v != 0 and -v >= t:
                    x[i] = v + s
                    b |= 2 << (2 * q)
                    nz += 1
        out[j] = b
    return nz


@nb.njit(cache=True, nogil=True)
def unpack_add(packed, s, total):
    """total[i] += s x (the sign of code i) for the len(total) codes in ``packed``."""
    n = len(total)
    for j in range(len(packed)):
        b = packed[j]
        for q in range(4):
            i = 4 * j + q
            if i < n:
                code = (b >> (2 * q)) & 3
                if code == 1:
                    total[i] += s
                elif code == 2:
                    total[i] -= s


def warm_up() -> None:
    for dt in (np.float32, np.float64):
        x = np.linspace(-1, 1, 21).astype(dt)
        out = np.empty(6, dtype=np.uint8)
        above_stats(x, 0.5)
        quantize_pack(x, dt(0.5), dt(0.75), out)
        unpack_add(out, dt(0.75), np.zeros(21, dtype=dt))


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
