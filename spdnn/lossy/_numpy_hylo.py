"""The 2-bit gradient sum's passes in numpy (spdnn.lossy.hylo), for the scipy backend: what
spdnn.lossy._numba_hylo computes, with the same arguments and the same bits (its sums are
sequential, as cumsum's)."""

from __future__ import annotations

import numpy as np


def above_stats(x: np.ndarray, t: float) -> tuple[float, int]:
    """Sum of |x| over the nonzero values with |x| >= t, and their count (float64, summed in
    order)."""
    m = np.abs(x.astype(np.float64))
    m = m[(m >= t) & (m > 0.0)]
    return (float(np.cumsum(m)[-1]) if len(m) else 0.0), len(m)


def quantize_pack(x: np.ndarray, t: np.floating, s: np.floating, out: np.ndarray) -> int:
    """Codes of x against t into ``out`` (uint8, four to a byte, the first in the lowest
    bits); each sent value, +-s, is taken out of x. Returns the count of nonzero codes."""
    up = (x != 0) & (x >= t)
    down = (x != 0) & ~up & (-x >= t)
    x[up] -= s
    x[down] += s
    codes = np.zeros(4 * len(out), dtype=np.uint8)
    codes[:len(x)] = up.astype(np.uint8) | (down.astype(np.uint8) << 1)
    quads = codes.reshape(-1, 4)
    out[:] = quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)
    return int(up.sum() + down.sum())


def unpack_add(packed: np.ndarray, s: np.floating, total: np.ndarray) -> None:
    """total[i] += s x (the sign of code i) for the len(total) codes in ``packed``."""
    codes = ((packed[:, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).ravel()[:len(total)]
    total[codes == 1] += s
    total[codes == 2] -= s


def warm_up() -> None:
    """Nothing to compile."""
