"""numba: the last layers of an inference pass in one call, once the batch is narrow and the
layers exchange nothing (one rank per model: P = 1, or replicas). Each layer is spmm_rows'
narrow kernel with the activation and the live flags, then the dead columns are dropped as
DistributedNetwork.forward drops them; the numbers are the same, bit for bit. One call instead
of a Python round per layer: a narrow layer's kernel is so short that the Python around it
cost as much again.

numba's cache does not follow imports: after changing _numba_products.py (whose _narrow_rows
this file's cache holds a copy of), _narrow.py or _vectors.py, touch this file too.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.extending import intrinsic

from spdnn.kernels._numba_products import _narrow_rows
from spdnn.kernels.cache_loads import lean_cache_loads


@intrinsic
def _pointer(typingctx, address, like):  # noqa: ANN001, ANN202
    """The address as a pointer to ``like``'s element type."""
    sig = types.CPointer(like.dtype)(types.int64, like)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


@nb.njit(inline="always")
def _array(where, k, which, like):  # noqa: ANN001, ANN202
    """Array ``which`` (0 indptr, 1 indices, 2 data, 3 bias) of layer k."""
    return nb.carray(_pointer(where[0, which, k], like), (where[1, which, k],))


@nb.njit(cache=True, nogil=True)
def narrow_layers(where, in_rows, first, cap, compact_below, xa, xb, cur, zbuf, width, ids,
                  work, index_like, value_like, bias_like):
    """Layers first.. (where[0, a, k] the address of array a of layer k, where[1, a, k] its
    length: indptr and indices of ``index_like``'s type, data of ``value_like``'s, bias of
    ``bias_like``'s: bfloat16's bits beside float32 biases and Z);
    in_rows[k] = rows of X_k) on X_first
    held (in_rows[first] x width, C order) at the start of ``(xa, xb)[cur]``. Hidden layers
    write h(Z) to the other buffer and drop the columns that died when at most
    ``compact_below`` of them live (``ids`` keeps the survivors' first entries in order);
    the last layer writes Z alone to ``zbuf`` (rows x width). Returns the final width, 0
    when every column died (the remaining layers do not run); work[k] = nnz x width of each
    layer that ran, for the timers."""
    bufs = (xa, xb)
    no_flags, flags = np.zeros(0, np.int32), np.zeros(width, np.int32)  # one array, reused
    last = where.shape[2] - 1
    for k in range(first, last + 1):
        indptr, indices = _array(where, k, 0, index_like), _array(where, k, 1, index_like)
        data, bias = _array(where, k, 2, value_like), _array(where, k, 3, bias_like)
        n, w = len(indptr) - 1, width
        x = bufs[cur][: in_rows[k] * w].reshape(in_rows[k], w)
        z = zbuf[: n * w]
        work[k] = (indptr[n] - indptr[0]) * w
        if k == last:
            _narrow_rows(0, n, indptr[:-1], indptr[1:], indices, data, x, bias, z, w, 1, cap,
                         False, z, w, no_flags)
            return w
        nxt = bufs[1 - cur][: n * w]
        alive = flags[:w]
        alive[:] = 0
        _narrow_rows(0, n, indptr[:-1], indptr[1:], indices, data, x, bias, z, w, 1, cap,
                     True, nxt, w, alive)
        kept = 0
        for c in range(w):
            kept += alive[c] != 0
        if kept == 0:
            return 0
        if kept > compact_below * w:
            cur = 1 - cur
            continue
        dst = bufs[cur]  # X_k is no longer needed: the live columns of X_k+1 go there
        for r in range(n):
            j = 0
            for c in range(w):
                if alive[c] != 0:
                    dst[r * kept + j] = nxt[r * w + c]
                    j += 1
        j = 0
        for c in range(w):
            if alive[c] != 0:
                ids[j] = ids[c]
                j += 1
        width = kept
    return width


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
