"""numba kernels of SGD's update (spdnn.optim.sgd): elementwise, split over the kernel threads
(in numpy they are serial passes, the one part of a training step that a second thread would
not share), with the roundings of its numpy form."""

from __future__ import annotations

import numba as nb

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


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
