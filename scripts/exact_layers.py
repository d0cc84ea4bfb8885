"""How far the plan is from a local optimum under exact one-layer re-assignment.

    python scripts/exact_layers.py [-P 8] [--layers 24] [--objective infer] [--node-limit 200]
                                   [--fine-layers 3 11 17]

Partitions the Graph Challenge 1024 network (from ../shared/data) with `partition_network`, then
runs the exact one-layer sweeps of partition/exact.py (`spdnn-partition --exact-sweeps`) on the
hypergraph of identical-row groups until no layer improves. ``--fine-layers`` then solves the
same MILP on single neurons (groups may split) for the listed layers of the result, to check
whether splitting a group would pay (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import spdnn._threads  # noqa: F401
from partition.exact import inputs_with_a_user, layer_milp, sweep_exact
from partition.hypergraph import build_hypergraph, contract, km1
from partition.methods import identical_row_clusters, majority, partition_network
from partition.refine import Refiner
from spdnn.formats import read_graphchallenge
from spdnn.network import Network
from spdnn.plan import network_patterns

GC = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "graphchallenge" / \
    "neuron1024"



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
    parts = sweep_exact(coarse, parts, args.nparts, limits, sweeps=20,
                        node_limit=args.node_limit,
                        log=lambda m: print(m, flush=True))
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
