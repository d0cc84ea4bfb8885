"""Exact one-layer re-assignment: each layer's vertices re-placed by a small MILP with every
other layer fixed, swept over the layers (``--exact-sweeps``).

The MILP (HiGHS through ``scipy.optimize.milp``): x[v, r] = 1 when vertex v of layer k goes to
rank r; y[s, r] >= x[v, r] for every user v of a set s of nets of layer k-1 that share their
users, cost w * [r != the net's source rank]; the nets of layer k (users fixed) give x a unary
cost; per-layer balance is one row per rank. Meant for the hypergraph of identical-row groups,
where a layer has tens of vertices (what a sweep gains and costs: docs/BENCHMARKS.md,
"Partitioning"). A layer's result is
kept only when the volume falls, so a sweep never makes a plan worse. ``window_milp`` is the
same model over several consecutive layers at once (scripts/bench/exact_layers.py --windows).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from spdnn.kernels.ranges import concat_ranges

from .hypergraph import Hypergraph, km1

# A layer's MILP stops after NODE_LIMIT branch-and-bound nodes (reproducible) or
# SECONDS_PER_LAYER seconds (a safety net; what it stops at depends on the machine, so such a
# result is not used). On the Graph Challenge groups every layer ends within seconds at P = 8
# (64 groups x 8 ranks); at P = 16 some layers reach the node limit after tens of seconds with
# incumbents worse than the start; at P = 64 one layer ran for minutes. Layers with more than
# MAX_VARIABLES vertex x rank variables are therefore skipped.
NODE_LIMIT = 200
SECONDS_PER_LAYER = 30.0
MAX_VARIABLES = 1024


def layer_milp(hg: Hypergraph, parts: np.ndarray, nparts: int, layer: int, limit: float,
               node_limit: int = NODE_LIMIT, seconds: float = SECONDS_PER_LAYER
               ) -> np.ndarray | None:
    """The best ranks of ``layer``'s vertices with every other layer fixed that HiGHS finds in
    ``node_limit`` nodes; None without a solution or when ``seconds`` ran out first."""
    owners, status = window_milp(hg, parts, nparts, layer, layer, [limit], node_limit, seconds)
    return None if status == 1 else owners  # scipy status 1: the time limit stopped HiGHS


def window_milp(hg: Hypergraph, parts: np.ndarray, nparts: int, first: int, last: int,
                limits: Sequence[float], node_limit: int = NODE_LIMIT,
                seconds: float = SECONDS_PER_LAYER) -> tuple[np.ndarray | None, int]:
    """The best ranks HiGHS finds for the vertices of layers first..last together, every other
    layer fixed, with ``limits[j]`` the balance limit of layer first + j; and scipy's status
    (0 optimal, 1 stopped by ``seconds``, 4 stopped by ``node_limit``). The ranks are None
    without a solution."""
    lo, hi = int(hg.offsets[first]), int(hg.offsets[last + 1])
    n = hi - lo
    sizes = np.diff(hg.net_indptr)
    starts = hg.net_indptr[:-1]
    x = np.arange(n * nparts).reshape(n, nparts)
    cost = np.zeros(n * nparts)
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    n_rows = 0

    def add_rows(r: np.ndarray, c: np.ndarray, v: np.ndarray, low: np.ndarray,
                 high: np.ndarray) -> None:
        nonlocal n_rows
        blocks.append((r + n_rows, c, v, low, high))
        n_rows += len(low)

    # Every vertex on one rank; every rank within its layer's limit.
    add_rows(np.repeat(np.arange(n), nparts), x.ravel(), np.ones(n * nparts), np.ones(n),
             np.ones(n))
    for k, limit in zip(range(first, last + 1), limits, strict=True):
        vs = np.arange(hg.offsets[k], hg.offsets[k + 1]) - lo
        add_rows(np.tile(np.arange(nparts), len(vs)), x[vs].ravel(),
                 np.repeat(hg.vertex_weights[vs + lo].astype(np.float64), nparts),
                 np.zeros(nparts), np.full(nparts, limit))

    # Nets of the last layer: source in the window, users' ranks fixed -> the source's rank is
    # a unary term (-w for every rank a user already holds).
    out = np.flatnonzero(hg.net_layer == last)
    if len(out):
        pin_net = np.repeat(out, sizes[out])
        pins = hg.net_pins[concat_ranges(starts[out], sizes[out])]
        users = pins >= hi  # the source is a net's only pin in its own layer
        key = np.unique(pin_net[users] * nparts + parts[pins[users]])
        net = key // nparts
        e = np.searchsorted(out, net)
        src = hg.net_pins[starts[net]] - lo
        np.add.at(cost, x[src, key % nparts], -hg.net_weights[out][e])

    # The other nets with a pin in the window: y[s, r] >= x[v, r] for every pin v in the window
    # of a set s of nets with the same such pins, cost w per rank spanned. A source before the
    # window is fixed (free for work-free inputs), and its rank costs nothing.
    free_source = first == 1 and not hg.vertex_weights[hg.offsets[0]:hg.offsets[1]].any()
    sets: dict[bytes, int] = {}
    set_pins: list[np.ndarray] = []
    set_cost: list[np.ndarray] = []
    for e in np.flatnonzero((hg.net_layer >= first - 1) & (hg.net_layer < last)):
        pins = hg.net_pins[starts[e]:starts[e] + sizes[e]]
        inside = (pins[1:] if hg.net_layer[e] == first - 1 else pins) - lo
        s = sets.setdefault(inside.tobytes(), len(sets))
        if s == len(set_cost):
            set_pins.append(inside)
            set_cost.append(np.zeros(nparts))
        set_cost[s] += hg.net_weights[e]
        if hg.net_layer[e] == first - 1 and not free_source:
            set_cost[s][parts[pins[0]]] -= hg.net_weights[e]
    n_var = n * nparts
    if sets:
        y = n_var + np.arange(len(sets) * nparts).reshape(len(sets), nparts)
        n_var += len(sets) * nparts
        cost = np.concatenate([cost, np.concatenate(set_cost)])
        pin = np.concatenate(set_pins)
        set_of = np.repeat(np.arange(len(sets)), [len(u) for u in set_pins])
        m = len(pin) * nparts
        r = np.arange(m)
        ranks = np.tile(np.arange(nparts), len(pin))
        add_rows(np.concatenate([r, r]),
                 np.concatenate([y[np.repeat(set_of, nparts), ranks],
                                 x[np.repeat(pin, nparts), ranks]]),
                 np.concatenate([np.ones(m), -np.ones(m)]), np.zeros(m), np.full(m, np.inf))
    rows, cols, vals, low, high = (np.concatenate(part) for part in zip(*blocks))
    a = sp.csr_matrix((vals, (rows, cols)), shape=(n_rows, n_var))
    res = milp(cost, constraints=LinearConstraint(a, low, high),
               integrality=np.concatenate([np.ones(n * nparts), np.zeros(n_var - n * nparts)]),
               bounds=Bounds(0, 1),
               options={"node_limit": node_limit, "time_limit": seconds, "presolve": True})
    return (None if res.x is None else res.x[x].argmax(axis=1)), int(res.status)


def inputs_with_a_user(hg: Hypergraph, parts: np.ndarray) -> np.ndarray:
    """Give every input (layer-0) vertex the rank of its first user when layer 0 carries no
    work: it then costs nothing beyond the ranks its users already span."""
    lo, hi = int(hg.offsets[0]), int(hg.offsets[1])
    if hg.vertex_weights[lo:hi].any():
        return parts
    nets = np.flatnonzero((hg.net_layer == 0) & (np.diff(hg.net_indptr) >= 2))
    out = parts.copy()
    out[hg.net_pins[hg.net_indptr[nets]]] = parts[hg.net_pins[hg.net_indptr[nets] + 1]]
    return out


def sweep_exact(hg: Hypergraph, parts: np.ndarray, nparts: int, limits: np.ndarray,
                 sweeps: int, node_limit: int = NODE_LIMIT, seconds: float = SECONDS_PER_LAYER,
                 log: Callable[[str], None] | None = None) -> np.ndarray:
    """Up to ``sweeps`` passes of ``layer_milp`` over layers 1..L, keeping a layer's new ranks
    only when the volume falls; stops early after a pass that changes nothing. ``limits[k]``
    is layer k's balance limit (inf: no work, not re-solved). Layers with more than
    MAX_VARIABLES vertex x rank variables are skipped."""
    parts = parts.astype(np.int64).copy()
    best = km1(hg, parts)
    t0 = time.perf_counter()
    sizes = np.diff(hg.offsets)
    large = [k for k in range(1, hg.n_layers + 1) if sizes[k] * nparts > MAX_VARIABLES]
    if large and log:
        log(f"exact sweeps skip {len(large)} of {hg.n_layers} layers (more than "
            f"{MAX_VARIABLES} vertices x ranks, e.g. layer {large[0]}: {sizes[large[0]]:,} x "
            f"{nparts})")
    for sweep in range(1, sweeps + 1):
        start = best
        for k in range(1, hg.n_layers + 1):
            if not np.isfinite(limits[k]) or k in large:
                continue
            owners = layer_milp(hg, parts, nparts, k, float(limits[k]), node_limit, seconds)
            if owners is not None:
                lo, hi = int(hg.offsets[k]), int(hg.offsets[k + 1])
                loads = np.bincount(owners, weights=hg.vertex_weights[lo:hi], minlength=nparts)
                trial = parts.copy()
                trial[lo:hi] = owners
                if k == 1:
                    trial = inputs_with_a_user(hg, trial)
                cost = km1(hg, trial)
                if cost < best and loads.max() <= limits[k] + 1e-9:
                    parts, best = trial, cost
            if log:
                log(f"exact sweep {sweep}, layer {k}/{hg.n_layers}: volume {best:,} "
                    f"({time.perf_counter() - t0:.1f} s)")
        if best == start:
            break
    return parts
