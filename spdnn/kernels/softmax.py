"""The passes of a softmax over the rows of a block (neurons x batch), for the fused loss of
``spdnn.runtime.outputs``: column maxima, the shifted exponentials in place with their column
sums and the first row of each maximum, a scaling of the columns. Between the passes the
runtime agrees the per-column vectors over the ranks that share the block's columns; no MPI
here.

The numba backend runs the last two passes as kernels (spdnn.kernels._numba_softmax); the
scipy backend, and blocks that are not C-contiguous, numpy's passes."""

from __future__ import annotations

import numpy as np

from spdnn.backends import active


def _numba(*blocks: np.ndarray) -> object:
    """The numba half where the backend runs it and the blocks are C-contiguous, else None."""
    nbs = active().compiled("softmax")
    return nbs if nbs is not None and all(b.flags.c_contiguous for b in blocks) else None


def column_max(z: np.ndarray) -> np.ndarray:
    """Each column's maximum (an empty block: -inf; NaN where a column holds one)."""
    if len(z) == 0:
        return np.full(z.shape[1], -np.inf, z.dtype)
    return z.max(axis=0)


def exp_columns(z: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """z = exp(z - shift[None, :]) in place (shift: at least each column's maximum); returns
    the column sums (added in float64 whatever the dtype) and each column's first row whose
    value equalled its shift (-1: none)."""
    total, first = np.zeros(z.shape[1], z.dtype), np.full(z.shape[1], -1, np.int32)
    if len(z) == 0:
        return total, first
    shift = shift.astype(z.dtype, copy=False)
    if (nbs := _numba(z)) is not None:
        nbs.exp_columns(z, shift, total, first, z.dtype == np.float32)  # type: ignore[attr-defined]
        return total, first
    hit = z == shift[None, :]
    first = np.where(hit.any(axis=0), hit.argmax(axis=0), -1).astype(np.int32)
    np.subtract(z, shift[None, :], out=z)
    np.exp(z, out=z)
    return z.sum(axis=0, dtype=np.float64).astype(z.dtype), first


def scale_columns(g: np.ndarray, factor: np.ndarray) -> None:
    """g *= factor[None, :], in place, with results under ``flush_below(g.dtype)`` in magnitude
    set to 0 (NaN stays NaN)."""
    floor = flush_below(g.dtype)
    if len(g) and (nbs := _numba(g)) is not None:
        nbs.scale_columns(g, factor.astype(g.dtype, copy=False), floor)  # type: ignore[attr-defined]
        return
    g *= factor[None, :].astype(g.dtype, copy=False)
    g[np.abs(g) < floor] = 0


def flush_below(dtype: np.dtype) -> np.floating:
    """The smallest normal over the epsilon (float32 9.9e-32, float64 1.0e-292): the
    probabilities of far-off classes, divided by the sum and the batch, fell below the
    smallest normal as a network's logits spread, and so did their products with weights of
    1e-3 just above it; on Intel CPUs every operation on a subnormal takes a microcode assist
    (a small head's backward grew many-fold on a Xeon; AMD's did not).
    Under this floor a value times any factor of epsilon or more stays normal; a column's
    largest entry is at least 1 / (classes x batch), so what is dropped is far below its
    rounding."""
    info = np.finfo(dtype)
    return info.dtype.type(info.tiny / info.eps)
