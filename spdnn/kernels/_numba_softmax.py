"""numba kernels of the softmax over a block's rows (neurons x batch, C-contiguous): the
exponentials with their column sums and the rows of the maxima in one pass, then a scaling of
the columns (the maxima themselves are numpy's, several times faster than a kernel that also
kept their rows). One thread: parallel kernels took far longer to compile.

float32 exponentials use ``exp32``, a polynomial that LLVM vectorizes (libm's expf is one call
per value, a large share of an extreme-classification step); float64 keeps libm's exp."""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from spdnn.kernels.cache_loads import lean_cache_loads

SUM_ROWS = 256  # rows summed in the block's type before a float64 sum
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # ln 2 in two parts (Cephes): n * _LN2_HI is exact
_LN2_LO = np.float32(-2.12194440e-4)
_C = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                   4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
_LOWEST = np.float32(-87.0)  # exp below it is under float32's smallest normal: clamped there


@intrinsic
def _pow2(typingctx, n):  # noqa: ANN001, ANN201
    """2.0 ** n as float32 for an int32 n in [-126, 127]: the exponent bits, no call."""
    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        bits = builder.shl(builder.add(args[0], ir.Constant(ir.IntType(32), 127)),
                           ir.Constant(ir.IntType(32), 23))
        return builder.bitcast(bits, ir.FloatType())
    return types.float32(types.int32), codegen


@nb.njit(inline="always")
def exp32(x):  # noqa: ANN001, ANN201
    """exp(x) in float32 for x <= 0 (Cephes' expf: range reduction by ln 2, a degree-7
    polynomial; within 2 ulp of a correctly rounded exp above -87, exp(-87) below)."""
    x = max(x, _LOWEST)
    n = np.floor(x * _LOG2E + np.float32(0.5))  # a float: math.floor gives an int64
    r = x - n * _LN2_HI - n * _LN2_LO
    p = ((((_C[0] * r + _C[1]) * r + _C[2]) * r + _C[3]) * r + _C[4]) * r + _C[5]
    return (p * r * r + r + np.float32(1.0)) * _pow2(np.int32(n))


@nb.njit(cache=True, nogil=True, fastmath={"contract"})
def exp_columns(z, shift, total, first, single):
    """z[r, j] = exp(z[r, j] - shift[j]) in place (shift[j] >= every z[r, j]: the column
    maxima), total[j] = the sum of column j, first[j] = the first row r whose z[r, j] equals
    shift[j] before the pass (-1: none), ``single``: z is float32 (exp32, else libm's exp).
    The sums run in z's type over ``SUM_ROWS`` rows, then in float64. In place, not into a
    second array: LLVM's overlap check of two arguments that are the same array sent every
    value down its scalar path, several times slower."""
    n, b = z.shape
    acc = np.zeros(b, z.dtype)
    sums = np.zeros(b, np.float64)
    first[:] = -1
    for r0 in range(0, n, SUM_ROWS):
        acc[:] = 0
        for r in range(r0, min(n, r0 + SUM_ROWS)):
            row = z[r]
            rr = np.int32(r)
            for j in range(b):
                v = row[j]
                hit = (v == shift[j]) & (first[j] < 0)
                first[j] = rr if hit else first[j]
                e = exp32(v - shift[j]) if single else math.exp(v - shift[j])
                row[j] = e
                acc[j] += e
        for j in range(b):
            sums[j] += acc[j]
    for j in range(b):
        total[j] = sums[j]


@nb.njit(cache=True, nogil=True)
def scale_columns(g, factor, floor):
    """g[r, j] *= factor[j], in place; products under ``floor`` in magnitude become 0 (NaN
    stays NaN)."""
    n, b = g.shape
    zero = g.dtype.type(0)
    for r in range(n):
        row = g[r]
        for j in range(b):
            v = row[j] * factor[j]
            row[j] = zero if abs(v) < floor else v


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Compile (or load from cache) for ``dtypes``."""
    for dt in dtypes:
        z = np.zeros((1, 2), dt)
        total, first = np.zeros(2, dt), np.zeros(2, np.int32)
        exp_columns(z, total, total, first, dt == np.float32)
        scale_columns(z, total, dt(1e-30))


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
