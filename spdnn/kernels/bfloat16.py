"""bfloat16 values stored as their bits in uint16: the upper half of a float32.

Widening is a 16-bit shift; narrowing rounds to nearest, ties to even (add 0x7FFF plus the lowest
kept bit, shift), as torch converts finite values and infinities; a NaN stays a (quiet) NaN.
numba has no bfloat16 type: its kernels read the bits and widen them in registers
(spdnn.kernels._numba_bfloat16), and round what they store; no kernel converts a whole array to
float32 to compute on it. The array forms here (``narrow``, ``widen``) are for what enters and
leaves: data, weights as they are read, files.
"""

from __future__ import annotations

import numpy as np

BITS = np.dtype(np.uint16)  # how a bfloat16 array is stored
QUIET_NAN = 0x7FC0


def is_bfloat16(a: np.ndarray | np.dtype) -> bool:
    """Whether an array (or dtype) holds bfloat16 bits (spdnn's only 16-bit value type)."""
    return np.dtype(getattr(a, "dtype", a)) == BITS


def narrow(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 (or float64, through float32) values rounded to bfloat16 bits."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16)
    rounded = rounded.astype(np.uint16)
    rounded[np.isnan(bits.view(np.float32))] = QUIET_NAN
    if out is None:
        return rounded
    out[...] = rounded
    return out


def widen(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bfloat16 bits as float32 values (exact)."""
    wide = (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    if out is None:
        return wide
    out[...] = wide
    return out


def rounded(a: np.ndarray) -> np.ndarray:
    """The float32 values of ``a`` rounded to bfloat16 (a float32 array)."""
    return widen(narrow(a))
