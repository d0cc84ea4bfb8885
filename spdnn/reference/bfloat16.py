"""bfloat16 for the reference, written apart from the kernels' bit arithmetic
(spdnn.kernels.bfloat16): a value keeps 8 significant bits, rounded half to even by numpy's
``round`` on its mantissa from ``frexp`` (bfloat16 has float32's exponent range, so below
2^-126 it keeps a fixed step of 2^-133, and past its largest finite value it is infinite)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

_SMALLEST_NORMAL = 2.0 ** -126
_SUBNORMAL_STEP = 2.0 ** -133
_LARGEST = (2 - 2.0 ** -7) * 2.0 ** 127  # the largest finite bfloat16
_HALFWAY = (2 - 2.0 ** -8) * 2.0 ** 127  # from here (to even: up) the value is infinite


def rounded(a: np.ndarray) -> np.ndarray:
    """``a``'s values rounded to the nearest bfloat16 (ties to even), as float32."""
    x = np.asarray(a, dtype=np.float32).astype(np.float64)
    mantissa, exponent = np.frexp(x)  # x = mantissa * 2^exponent, 0.5 <= |mantissa| < 1
    out = np.ldexp(np.round(mantissa * 256.0) / 256.0, exponent)
    small = np.abs(x) < _SMALLEST_NORMAL
    out[small] = np.round(x[small] / _SUBNORMAL_STEP) * _SUBNORMAL_STEP
    big = np.abs(x) >= _HALFWAY
    out[big] = np.copysign(np.inf, x[big])
    out = np.where(np.abs(out) > _LARGEST, np.copysign(np.inf, out), out)
    return out.astype(np.float32)


def rounded_weight(w: sp.csr_matrix) -> sp.csr_matrix:
    """W with its values rounded (the same pattern)."""
    return sp.csr_matrix((rounded(w.data), w.indices, w.indptr), shape=w.shape)
