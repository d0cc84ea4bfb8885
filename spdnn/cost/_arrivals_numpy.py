"""The replay's message arrivals in numpy (spdnn.cost._replay), for the scipy backend: what
spdnn.cost._workload_kernels.arrivals computes, with the same arguments (its sums in another
order: equal within their rounding)."""

from __future__ import annotations

import numpy as np


def arrivals(src: np.ndarray, dst: np.ndarray, latency: np.ndarray, transfer: np.ndarray,
             t_post: np.ndarray, nparts: int) -> np.ndarray:
    """Each rank's last incoming message's arrival (or -inf), the messages given sorted by
    (src, dst) as the runtime posts them (for the fold, (dst, src): a stable sort by sender
    keeps each sender's destinations in order): a sender's leave one after another through
    its link, a receiver's bytes come in through its own."""
    ready = np.full(nparts, -np.inf)
    if len(src) == 0:
        return ready
    order = np.argsort(src, kind="stable")
    s, d, la, tt = src[order], dst[order], latency[order], transfer[order]
    cum = np.cumsum(tt)
    first = np.searchsorted(s, s, side="left")
    before = np.where(first > 0, cum[first - 1], 0.0)
    np.maximum.at(ready, d, t_post[s] + la + (cum - before))
    into = np.bincount(d, weights=tt, minlength=nparts)
    start = np.full(nparts, np.inf)
    np.minimum.at(start, d, t_post[s] + la)
    has = np.isfinite(start)
    ready[has] = np.maximum(ready[has], start[has] + into[has])
    return ready
