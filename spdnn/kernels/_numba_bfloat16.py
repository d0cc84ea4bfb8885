"""bfloat16 in numba kernels: the bits widened to float32 as they are read (``value``), float32
rounded to nearest even as it is stored (``narrow_value``), and the block conversions of the
passes (spdnn.kernels.bfloat16 says the format)."""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from spdnn.kernels.bfloat16 import QUIET_NAN
from spdnn.kernels.cache_loads import lean_cache_loads


@intrinsic
def _float_of_bits(typingctx, bits):  # noqa: ANN001, ANN202
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@intrinsic
def _bits_of_float(typingctx, value):  # noqa: ANN001, ANN202
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], ir.IntType(32))
    return sig, codegen


@nb.njit(inline="always")
def widen_bits(u):  # noqa: ANN001, ANN201
    return _float_of_bits(np.uint32(u) << np.uint32(16))


@nb.njit(inline="always")
def narrow_value(v):  # noqa: ANN001, ANN201
    f = np.float32(v)
    if f != f:
        return np.uint16(QUIET_NAN)
    bits = _bits_of_float(f)
    return np.uint16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
                     >> np.uint32(16))


def value(v):  # noqa: ANN001, ANN201
    """A stored element as a number: bfloat16 bits widened, a float as it is (numba only)."""
    raise NotImplementedError("numba only")


def stored(v, like):  # noqa: ANN001, ANN201
    """``v`` as an element of an array of ``like``'s type: rounded to bfloat16 bits when
    ``like`` holds them (numba only)."""
    raise NotImplementedError("numba only")


def zero_of(a):  # noqa: ANN001, ANN201
    """The zero that sums of ``a``'s elements start from: float32 for bfloat16 (numba only)."""
    raise NotImplementedError("numba only")


@overload(value, inline="always")
def _value(v):  # noqa: ANN001, ANN202
    if v == types.uint16:
        return lambda v: widen_bits(v)
    return lambda v: v


@overload(stored, inline="always")
def _stored(v, like):  # noqa: ANN001, ANN202
    if isinstance(like, types.Array) and like.dtype == types.uint16:
        return lambda v, like: narrow_value(v)
    return lambda v, like: v


@overload(zero_of, inline="always")
def _zero_of(a):  # noqa: ANN001, ANN202
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        return lambda a: np.float32(0)
    return lambda a: np.zeros(1, a.dtype)[0]


@nb.njit(parallel=True, cache=True, nogil=True)
def narrow_rows(src, dst, sums):
    """dst[i, b] = bfloat16(src[i, b]) for the rows of a block (an error block before it is
    gathered) and, when ``sums`` is not empty, sums[i] = the row's sum of what was stored (the
    bias gradient)."""
    with_sums = len(sums) > 0
    for i in nb.prange(src.shape[0]):
        s, d = src[i], dst[i]
        total = np.float32(0)
        for b in range(src.shape[1]):
            u = narrow_value(s[b])
            d[b] = u
            total += widen_bits(u)
        if with_sums:
            sums[i] = total


@nb.njit(parallel=True, cache=True, nogil=True)
def narrow_flat(src, dst):
    """dst[e] = bfloat16(src[e]) (the weights' copy after an update)."""
    for e in nb.prange(len(src)):
        dst[e] = narrow_value(src[e])


def warm_up() -> None:
    """Compile (or load from cache) the block conversions."""
    a = np.ones((1, 2), np.float32)
    narrow_rows(a, np.empty((1, 2), np.uint16), np.empty(1, np.float32))
    narrow_flat(a[0], np.empty(2, np.uint16))


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
