"""numba kernel of Adam's and AdamW's update (spdnn.optim.adam): elementwise, split over the
kernel threads, with the roundings of its numpy form."""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels.cache_loads import lean_cache_loads


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
