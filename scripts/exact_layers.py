"""How far the shipped plan is from a local optimum under exact one-layer re-assignment.

    python scripts/exact_layers.py [-P 8] [--layers 24] [--objective infer] [--node-limit 200]
                                   [--fine-layers 3 11 17]

Partitions the Graph Challenge 1024 network (from ../shared/data) with `partition_network`, then
re-assigns one layer at a time with its neighbours fixed, exactly, as a small MILP (HiGHS via
``scipy.optimize.milp``) on the hypergraph of identical-row groups: x[v, r] = 1 when group v of
layer k goes to rank r, y[c, r] >= x[v, r] for every user v of the nets c of layer k-1 that
share a set of users, per-layer balance as a row per rank. Sweeps repeat until no layer
improves. ``--fine-layers`` then solves the same MILP on single neurons (groups may split) for
the listed layers of the result, to check whether splitting a group would pay. A measurement
of an alternative (docs/BENCHMARKS.md), not part of the partitioner: it gains under 1% for
minutes of solver time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

import spdnn._threads  # noqa: F401
from partition.hypergraph import Hypergraph, build_hypergraph, contract, km1
from partition.methods import identical_row_clusters, majority, partition_network
from partition.refine import Refiner
from spdnn.formats import read_graphchallenge
from spdnn.network import Network
from spdnn.plan import network_patterns

GC = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "graphchallenge" / \
    "neuron1024"



def _layer_milp(hg: Hypergraph, parts: np.ndarray, nparts: int, layer: int, limit: float,
                node_limit: int) -> np.ndarray | None:
    """Best owners of ``layer``'s vertices with every other layer fixed (None: no solution)."""
    lo, hi = int(hg.offsets[layer]), int(hg.offsets[layer + 1])
    n = hi - lo
    sizes = np.diff(hg.net_indptr)
    first = hg.net_indptr[:-1]
    n_x = n * nparts
    cost = np.zeros(n_x)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lower: list[np.ndarray] = []
    upper: list[np.ndarray] = []
    n_rows = 0

    def add_rows(r: np.ndarray, c: np.ndarray, v: np.ndarray, lo_: np.ndarray, hi_: np.ndarray
                 ) -> None:
        nonlocal n_rows
        rows.append(r + n_rows)
        cols.append(c)
        vals.append(v)
        lower.append(lo_)
        upper.append(hi_)
        n_rows += len(lo_)

    x = np.arange(n_x).reshape(n, nparts)
    # Every vertex on one rank; every rank within the layer's limit.
    add_rows(np.repeat(np.arange(n), nparts), x.ravel(), np.ones(n_x), np.ones(n), np.ones(n))
    w = hg.vertex_weights[lo:hi].astype(np.float64)
    add_rows(np.tile(np.arange(nparts), n), x.ravel(), np.repeat(w, nparts),
             np.zeros(nparts), np.full(nparts, limit))

    # Nets of layer k: the source is free, the users' ranks are fixed -> a unary term.
    out = np.flatnonzero(hg.net_layer == layer)
    if len(out):
        net_of_pin = np.repeat(out, sizes[out])
        pins = hg.net_pins[np.concatenate([np.arange(first[e], first[e] + sizes[e])
                                           for e in out])]
        users = pins >= hi  # the source is the net's only pin in this layer
        src = hg.net_pins[first[out]] - lo
        key = np.unique(net_of_pin[users] * nparts + parts[pins[users]])
        e_idx = np.searchsorted(out, key // nparts)
        np.add.at(cost, x[src[e_idx], key % nparts], -hg.net_weights[out][e_idx])

    # Nets of layer k-1: the source fixed (free when it lies in a layer without work, i.e.
    # the inputs), users in layer k -> y[c, r] >= x[v, r], cost w * [r != source rank].
    inc = np.flatnonzero(hg.net_layer == layer - 1)
    free_source = layer == 1 and not hg.vertex_weights[hg.offsets[0]:hg.offsets[1]].any()
    sets: dict[tuple[int, ...], int] = {}
    set_cost: list[np.ndarray] = []
    for e in inc:
        pins = hg.net_pins[first[e]:first[e] + sizes[e]]
        users = tuple(int(p) - lo for p in pins[1:])
        c = sets.setdefault(users, len(sets))
        if c == len(set_cost):
            set_cost.append(np.zeros(nparts))
        set_cost[c] += hg.net_weights[e]
        if not free_source:
            set_cost[c][parts[pins[0]]] -= hg.net_weights[e]
    n_y = len(sets) * nparts
    y = n_x + np.arange(n_y).reshape(len(sets), nparts)
    if sets:
        cost = np.concatenate([cost, np.concatenate(set_cost)])
        set_users = list(sets)
        lens = np.array([len(u) for u in set_users])
        user = np.concatenate([np.array(u, dtype=np.int64) for u in set_users])
        set_of = np.repeat(np.arange(len(sets)), lens)
        # one row per (set, user, rank): y[set, r] - x[user, r] >= 0
        m = len(user) * nparts
        r_idx = np.arange(m)
        yc = y[np.repeat(set_of, nparts), np.tile(np.arange(nparts), len(user))]
        xc = x[np.repeat(user, nparts), np.tile(np.arange(nparts), len(user))]
        add_rows(np.concatenate([r_idx, r_idx]), np.concatenate([yc, xc]),
                 np.concatenate([np.ones(m), -np.ones(m)]), np.zeros(m), np.full(m, np.inf))
    n_var = n_x + n_y
    a = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(n_rows, n_var))
    integrality = np.concatenate([np.ones(n_x), np.zeros(n_y)])
    res = milp(cost, constraints=LinearConstraint(a, np.concatenate(lower),
                                                  np.concatenate(upper)),
               integrality=integrality, bounds=Bounds(0, 1),
               options={"node_limit": node_limit, "presolve": True})
    if res.x is None:
        return None
    return res.x[x].argmax(axis=1)


def exact_sweeps(hg: Hypergraph, parts: np.ndarray, nparts: int, limits: np.ndarray,
                 node_limit: int, passes: int, log: Callable[[str], None]) -> np.ndarray:
    """Re-assign layers 1..L one at a time by ``_layer_milp``, keeping a result only when the
    volume falls, until a sweep changes nothing."""
    parts = parts.astype(np.int64).copy()
    best = km1(hg, parts)
    n_layers = hg.n_layers
    for sweep in range(passes):
        start = best
        for k in range(1, n_layers + 1):
            lo, hi = int(hg.offsets[k]), int(hg.offsets[k + 1])
            if not np.isfinite(limits[k]):
                continue
            owners = _layer_milp(hg, parts, nparts, k, float(limits[k]), node_limit)
            if owners is None:
                continue
            trial = parts.copy()
            trial[lo:hi] = owners
            if k == 1:
                trial = _inputs_with_a_user(hg, trial)
            cost = km1(hg, trial)
            if cost < best:
                parts, best = trial, cost
        log(f"exact layer sweep {sweep + 1}: volume {start:,} -> {best:,}")
        if best == start:
            break
    return parts


def _inputs_with_a_user(hg: Hypergraph, parts: np.ndarray) -> np.ndarray:
    """Give every input (layer-0) vertex the rank of its first user when layer 0 carries no
    work: then it costs nothing beyond the ranks its users already span."""
    lo, hi = int(hg.offsets[0]), int(hg.offsets[1])
    if hg.vertex_weights[lo:hi].any():
        return parts
    nets = np.flatnonzero((hg.net_layer == 0) & (np.diff(hg.net_indptr) >= 2))
    src = hg.net_pins[hg.net_indptr[nets]]
    user = hg.net_pins[hg.net_indptr[nets] + 1]
    out = parts.copy()
    out[src] = parts[user]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-P", type=int, default=8, dest="nparts")
    ap.add_argument("--layers", type=int, default=24, help="first L layers (default 24)")
    ap.add_argument("--objective", default="infer", choices=("train", "infer"))
    ap.add_argument("--node-limit", type=int, default=200,
                    help="branch-and-bound nodes per layer MILP (default 200)")
    ap.add_argument("--fine-layers", type=int, nargs="*", default=[],
                    help="layers to re-solve on single neurons afterwards")
    args = ap.parse_args()
    if not GC.is_dir():
        print(f"exact_layers: {GC} absent", file=sys.stderr)
        return 2
    net = Network(read_graphchallenge(GC, -0.3, 32).layers[:args.layers])
    patterns = network_patterns(net)
    t0 = time.perf_counter()
    plan = partition_network(patterns, args.nparts, objective=args.objective)
    hg = build_hypergraph(patterns, args.objective)
    fine = np.concatenate(plan.owners).astype(np.int64)
    print(f"partition_network: {args.objective} volume {km1(hg, fine):,} rows in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    limits = Refiner(hg, fine, args.nparts, 0.03).limits
    coarse, coarse_of = contract(hg, identical_row_clusters(patterns, args.nparts))
    parts = majority(coarse_of, fine, coarse.n_vertices, args.nparts)
    if km1(hg, parts[coarse_of]) != km1(hg, fine):
        print("exact_layers: the plan splits groups; the group-level sweep starts from their "
              "majority ranks", flush=True)
    t0 = time.perf_counter()
    parts = exact_sweeps(coarse, parts, args.nparts, limits,
                         node_limit=args.node_limit, passes=20,
                         log=lambda m: print(f"{m} ({time.perf_counter() - t0:.0f} s)",
                                             flush=True))
    fine = parts[coarse_of]
    for k in args.fine_layers:
        t1 = time.perf_counter()
        owners = _layer_milp(hg, fine, args.nparts, k, float(limits[k]), args.node_limit)
        trial = fine.copy()
        lo, hi = int(hg.offsets[k]), int(hg.offsets[k + 1])
        if owners is not None:
            trial[lo:hi] = owners
            if k == 1:
                trial = _inputs_with_a_user(hg, trial)
        split = len(np.unique(coarse_of[lo:hi] * args.nparts + trial[lo:hi])) - \
            len(np.unique(coarse_of[lo:hi]))
        print(f"layer {k} on single neurons: volume {km1(hg, fine):,} -> {km1(hg, trial):,}, "
              f"{split} extra group pieces ({time.perf_counter() - t1:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
