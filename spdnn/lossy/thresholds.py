"""A compressor's threshold in the values' own type, the one rule both halves of the
compressors (spdnn.lossy._numba_compress, spdnn.lossy._numpy_compress) compare by."""

from __future__ import annotations

import numpy as np


def below(t: float, dtype: np.dtype) -> np.floating:
    """The largest value of ``dtype`` not above t: for x of that type, |x| > t exactly when
    |x| > below(t), so the kernels compare in the values' own type."""
    v = np.asarray(t, dtype=dtype)[()]
    return np.nextafter(v, dtype.type(-np.inf)) if v > t else v
