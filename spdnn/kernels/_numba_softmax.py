"""numba kernels of the softmax over a block's rows (neurons x batch, C-contiguous), in blocks
of ``BLOCK`` rows, each with its own per-column partials combined in block order afterwards.
One thread: the three passes take 20 of a 231 ms step at 50,000 labels, and parallel kernels
took 2.7x as long to compile (6.7 s against 2.5 for both value types).

float32 exponentials use ``exp32``, a polynomial that LLVM vectorizes (libm's expf is one call
per value: 44 of a 286 ms extreme-classification step went to it); float64 keeps libm's exp."""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

BLOCK = 2048
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


@nb.njit(cache=True, nogil=True)
def column_max(z, best, arg):
    """best[j] = max_r z[r, j] and arg[j] = its first row (-1 where no value exceeds -inf:
    NaN never wins a comparison, and a NaN column's loss is NaN all the same)."""
    n, b = z.shape
    blocks = (n + BLOCK - 1) // BLOCK
    part = np.full((blocks, b), -np.inf, z.dtype)
    where = np.full((blocks, b), -1, np.int64)
    for k in range(blocks):
        pm, pa = part[k], where[k]
        for r in range(k * BLOCK, min(n, (k + 1) * BLOCK)):
            row = z[r]
            for j in range(b):
                if row[j] > pm[j]:
                    pm[j] = row[j]
                    pa[j] = r
    for j in range(b):
        best[j] = -np.inf
        arg[j] = -1
    for k in range(blocks):  # in block order: the first row among equal maxima
        for j in range(b):
            if part[k, j] > best[j]:
                best[j] = part[k, j]
                arg[j] = where[k, j]


@nb.njit(cache=True, nogil=True)
def exp_columns(z, shift, total, single):
    """z[r, j] = exp(z[r, j] - shift[j]) in place (shift[j] >= every z[r, j]: the column
    maxima) and total[j] = the sum of column j; ``single``: z is float32 (exp32, else libm's
    exp). In place, not into a second array: LLVM's overlap check of two arguments that are
    the same array sent every value down its scalar path (63 ms against 11 on 50,000 x 128)."""
    n, b = z.shape
    blocks = (n + BLOCK - 1) // BLOCK
    part = np.zeros((blocks, b), np.float64)  # float32's sums too: 50,000 terms a column
    for k in range(blocks):
        acc = part[k]
        for r in range(k * BLOCK, min(n, (k + 1) * BLOCK)):
            row = z[r]
            if single:
                for j in range(b):
                    e = exp32(row[j] - shift[j])
                    row[j] = e
                    acc[j] += e
            else:
                for j in range(b):
                    e = math.exp(row[j] - shift[j])
                    row[j] = e
                    acc[j] += e
    for j in range(b):
        t = 0.0
        for k in range(blocks):
            t += part[k, j]
        total[j] = t


@nb.njit(cache=True, nogil=True)
def scale_columns(g, factor):
    """g[r, j] *= factor[j], in place."""
    n, b = g.shape
    for r in range(n):
        row = g[r]
        for j in range(b):
            row[j] *= factor[j]


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Compile (or load from cache) for ``dtypes``."""
    for dt in dtypes:
        z = np.zeros((1, 2), dt)
        best, arg, total = np.zeros(2, dt), np.zeros(2, np.int64), np.zeros(2, dt)
        column_max(z, best, arg)
        exp_columns(z, best, total, dt == np.float32)
        scale_columns(z, best)
