"""numba kernels of the optimizers' updates: elementwise, split over the kernel threads (in
numpy they are serial passes, the one part of a training step that a second thread would not
share). Each has the roundings of its optimizer's numpy form (spdnn.model.optim)."""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels.cache_loads import lean_cache_loads


@nb.njit(parallel=True, cache=True, nogil=True)
def sgd(p, g, buf, lr, momentum, weight_decay, first, nesterov):
    """torch.optim.SGD's update of p in place, one pass, the same roundings as its numpy form:
    d = g (+ p * weight_decay); buf = d on the ``first`` step, else buf * momentum + d (when
    momentum is not 0); p -= lr * (d + buf * momentum if ``nesterov`` else buf, or d). lr,
    momentum and weight_decay arrive in p's type, so float32 parameters are computed in
    float32 as numpy does."""
    for i in nb.prange(len(p)):
        d = g[i]
        if weight_decay != 0:
            d = p[i] * weight_decay + d
        if momentum != 0:
            b = d if first else buf[i] * momentum + d
            buf[i] = b
            d = d + b * momentum if nesterov else b
        p[i] -= d * lr


@nb.njit(inline="always")
def _update(p, buf, i, d, lr, momentum, weight_decay, nesterov):
    """Entry i of ``sgd``'s update after its first step, gradient d, in place."""
    if weight_decay != 0:
        d = p[i] * weight_decay + d
    if momentum != 0:
        b = buf[i] * momentum + d
        buf[i] = b
        d = d + b * momentum if nesterov else b
    p[i] -= d * lr


@nb.njit(parallel=True, cache=True, nogil=True)
def sgd_rows(p, positions, values, buf, lr, momentum, weight_decay, nesterov):
    """``sgd`` on the entries p[positions[k]] (distinct) with gradients values[k]: the same
    roundings as the numpy form of a row update, whose momentum buffer starts at zero."""
    for k in nb.prange(len(positions)):
        _update(p, buf, positions[k], values[k], lr, momentum, weight_decay, nesterov)


@nb.njit(parallel=True, cache=True, nogil=True)
def sgd_runs(p, starts, offsets, values, buf, lr, momentum, weight_decay, nesterov):
    """``sgd_rows`` on runs of entries: run r is p[starts[r]:starts[r] + n] with gradients
    values[offsets[r]:offsets[r + 1]] (n = their count); the same roundings. Slices per run:
    contiguous loops LLVM vectorizes, and no position array (8 bytes an entry) to build."""
    for r in nb.prange(len(starts)):
        n = offsets[r + 1] - offsets[r]
        pr, br = p[starts[r]:starts[r] + n], buf[starts[r]:starts[r] + n]
        g = values[offsets[r]:offsets[r + 1]]
        for j in range(n):
            _update(pr, br, j, g[j], lr, momentum, weight_decay, nesterov)


@nb.njit(parallel=True, cache=True, nogil=True)
def adam(p, g, m, v, shrink, weight_decay, w, rest, low, beta2, rest2, step, root, eps,
         decoupled):
    """torch.optim.Adam's update (AdamW's with ``decoupled``) of p, m and v in place, one pass,
    the roundings of its numpy form: p *= shrink (1 - lr wd) when decoupled, else
    g += wd p; m = lerp(m, g, w) (``low``: w below 0.5; rest = 1 - w); v = v beta2 + rest2 g g;
    p += step m / (sqrt(v) / root + eps), step = -lr / c1. Scalars arrive in p's type."""
    for i in nb.prange(len(p)):
        d = g[i]
        if weight_decay != 0:
            if decoupled:
                p[i] = p[i] * shrink
            else:
                d = p[i] * weight_decay + d
        mi = m[i]
        if low:
            mi = mi + (d - mi) * w
        else:
            mi = d - (d - mi) * rest
        m[i] = mi
        vi = v[i] * beta2 + rest2 * d * d
        v[i] = vi
        p[i] = p[i] + step * mi / (np.sqrt(vi) / root + eps)


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
