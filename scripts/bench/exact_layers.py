"""How far the plan is from a local optimum under exact one-layer re-assignment.

    python scripts/bench/exact_layers.py [-P 8] [--layers 24] [--objective infer] [--node-limit 200]
                                   [--fine-layers 3 11 17] [--windows 1 2 3 ... [--seconds 120]]
                                   [--cpsat SECONDS]

Partitions the Graph Challenge 1024 network (from ../shared/data) with `partition_network`, then
runs the exact one-layer sweeps of partition/exact.py (`spdnn-partition --exact-sweeps`) on the
hypergraph of identical-row groups until no layer improves. ``--fine-layers`` then solves the
same MILP on single neurons (groups may split) for the listed layers of the result, to check
whether splitting a group would pay. ``--windows`` re-assigns layers k and k+1 together for each
listed k (one MILP, HiGHS, ``--seconds`` each), ``--cpsat`` runs OR-Tools CP-SAT (pip install
ortools; not a dependency of spdnn) on all layers' groups at once from the result, hinted with
it, for that many seconds on 2 workers (docs/BENCHMARKS.md).
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from partition.exact import inputs_with_a_user, layer_milp, sweep_exact, window_milp
from partition.hypergraph import Hypergraph, build_hypergraph, contract, km1
from partition.methods import identical_row_clusters, majority, partition_network
from partition.refine import Refiner
from spdnn.io.graphchallenge import read_graphchallenge
from spdnn.model.network import Network
from spdnn.model.plan import network_patterns

GC = Path(__file__).resolve().parents[3] / "shared" / "data" / "graphchallenge" / \
    "neuron1024"
NO_NODE_LIMIT = 2**31 - 1  # HiGHS's own default: windows stop at --seconds only


def cpsat(hg: Hypergraph, parts: np.ndarray, nparts: int, limits: np.ndarray,
          seconds: float) -> np.ndarray:
    """OR-Tools CP-SAT over layers 1..L at once, hinted with ``parts``: the best it finds."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    n0 = int(hg.offsets[1])
    x = {v: [model.NewBoolVar("") for _ in range(nparts)] for v in range(n0, hg.n_vertices)}
    for v, xv in x.items():
        model.AddExactlyOne(xv)
        for r in range(nparts):
            model.AddHint(xv[r], int(parts[v] == r))
    for k in range(1, hg.n_layers + 1):
        vs = range(int(hg.offsets[k]), int(hg.offsets[k + 1]))
        for r in range(nparts):
            model.Add(sum(int(hg.vertex_weights[v]) * x[v][r] for v in vs) <= int(limits[k]))
    nets: dict[tuple[int, ...], int] = {}
    for e in range(hg.n_nets):
        pins = hg.net_pins[hg.net_indptr[e]:hg.net_indptr[e + 1]]
        if hg.net_layer[e] == 0:  # inputs carry no work: each goes with one of its users
            pins = pins[1:]
        key = tuple(sorted(set(pins.tolist())))
        if len(key) >= 2:
            nets[key] = nets.get(key, 0) + int(hg.net_weights[e])
    terms = []
    for pins, w in nets.items():  # cost w * (ranks spanned - 1)
        y = [model.NewBoolVar("") for _ in range(nparts)]
        for r in range(nparts):
            for p in pins:
                model.AddImplication(x[p][r], y[r])
            model.AddHint(y[r], int(any(parts[p] == r for p in pins)))
        terms += [w * yr for yr in y]
    model.Minimize(sum(terms) - sum(nets.values()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    status = solver.Solve(model)
    out = parts.copy()
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        for v, xv in x.items():
            out[v] = next(r for r in range(nparts) if solver.Value(xv[r]))
    print(f"cp-sat: {solver.StatusName(status)}, objective {solver.ObjectiveValue():.0f}, "
          f"bound {solver.BestObjectiveBound():.0f}", flush=True)
    return inputs_with_a_user(hg, out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-P", type=int, default=8, dest="nparts")
    ap.add_argument("--layers", type=int, default=24, help="first L layers (default 24)")
    ap.add_argument("--objective", default="infer", choices=("train", "infer"))
    ap.add_argument("--node-limit", type=int, default=200,
                    help="branch-and-bound nodes per layer MILP (default 200)")
    ap.add_argument("--fine-layers", type=int, nargs="*", default=[],
                    help="layers to re-solve on single neurons afterwards")
    ap.add_argument("--windows", type=int, nargs="*", default=[], metavar="K",
                    help="re-assign layers K and K+1 together, for each K (groups)")
    ap.add_argument("--seconds", type=float, default=120.0,
                    help="time limit of each window MILP (default 120)")
    ap.add_argument("--cpsat", type=float, default=0.0, metavar="SECONDS",
                    help="then run CP-SAT on all layers for SECONDS (needs ortools)")
    args = ap.parse_args()
    if not GC.is_dir():
        print(f"exact_layers: {GC} absent", file=sys.stderr)
        return 2
    net = Network(layers=read_graphchallenge(GC, -0.3, 32).layers[:args.layers])
    patterns = network_patterns(net)
    t0 = time.perf_counter()
    plan = partition_network(patterns, args.nparts, objective=args.objective)
    hg = build_hypergraph(patterns, objective=args.objective)
    fine = np.concatenate(plan.owners).astype(np.int64)
    print(f"partition_network: {args.objective} volume {km1(hg, fine):,} rows in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    limits = Refiner(hg, fine, args.nparts, 0.03).limits
    coarse, coarse_of = contract(hg, identical_row_clusters(patterns, args.nparts))
    parts = majority(coarse_of, fine, coarse.n_vertices, args.nparts)
    if km1(hg, parts[coarse_of]) != km1(hg, fine):
        print("exact_layers: the plan splits groups; the group-level sweep starts from their "
              "majority ranks", flush=True)
    parts = sweep_exact(coarse, parts, args.nparts, limits, sweeps=20,
                        node_limit=args.node_limit,
                        log=lambda m: print(m, flush=True))
    best = km1(coarse, parts)
    for k in args.windows:
        t1 = time.perf_counter()
        owners, code = window_milp(coarse, parts, args.nparts, k, k + 1, limits[k:k + 2],
                                   node_limit=NO_NODE_LIMIT, seconds=args.seconds)
        status = {0: "optimal", 1: "time limit"}.get(code, f"scipy status {code}")
        if owners is not None:
            lo, hi = int(coarse.offsets[k]), int(coarse.offsets[k + 2])
            trial = parts.copy()
            trial[lo:hi] = owners
            trial = inputs_with_a_user(coarse, trial)
            loads_ok = all(np.bincount(
                trial[coarse.offsets[j]:coarse.offsets[j + 1]], minlength=args.nparts,
                weights=coarse.vertex_weights[coarse.offsets[j]:coarse.offsets[j + 1]]
            ).max() <= limits[j] + 1e-9 for j in (k, k + 1))
            if loads_ok and km1(coarse, trial) < best:
                parts, best = trial, km1(coarse, trial)
        found = "none" if owners is None else f"{km1(coarse, trial):,}"
        print(f"window {k}-{k + 1}: {status}, found {found}, volume {best:,} "
              f"({time.perf_counter() - t1:.0f} s)", flush=True)
    if args.cpsat:
        t1 = time.perf_counter()
        trial = cpsat(coarse, parts, args.nparts, limits, args.cpsat)
        print(f"cp-sat: volume {best:,} -> {km1(coarse, trial):,} "
              f"({time.perf_counter() - t1:.0f} s)", flush=True)
        if km1(coarse, trial) < best:  # CP-SAT kept the layer limits
            parts, best = trial, km1(coarse, trial)
    fine = parts[coarse_of]
    for k in args.fine_layers:
        t1 = time.perf_counter()
        owners = layer_milp(hg, fine, args.nparts, k, float(limits[k]), args.node_limit,
                            seconds=np.inf)
        trial = fine.copy()
        lo, hi = int(hg.offsets[k]), int(hg.offsets[k + 1])
        if owners is not None:
            trial[lo:hi] = owners
            if k == 1:
                trial = inputs_with_a_user(hg, trial)
        split = len(np.unique(coarse_of[lo:hi] * args.nparts + trial[lo:hi])) - \
            len(np.unique(coarse_of[lo:hi]))
        print(f"layer {k} on single neurons: volume {km1(hg, fine):,} -> {km1(hg, trial):,}, "
              f"{split} extra group pieces ({time.perf_counter() - t1:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
