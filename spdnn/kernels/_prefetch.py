"""A software prefetch for the numba kernels: rows visited in ascending order but far apart
(the sampled rows of an LSH layer, their updates) defeat the hardware's prefetchers.

numba's cache does not follow imports: after changing this file, touch the kernels' modules
that use it (_numba_lsh.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, arr, idx):  # noqa: ANN001, ANN202 (a numba intrinsic)
    """Ask for the cache line holding arr[idx] (a 1-D array), to be read soon."""
    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        at = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]],
                                      wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(at, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(arr, idx), codegen
