"""The least forward volume any plan can reach while keeping every group of identical rows whole,
for networks where every layer splits into exactly P such units (e.g. the Graph Challenge 1024
network at P = 64: 64 groups of 16 identical rows per layer).

    python scripts/bench/bound_groups.py [--layers 24] [-P 64] [--network NET.npz]

With one unit per rank, a layer's intra-layer cost is fixed (each input row goes to every rank
holding a unit that reads it) and the only freedom is which unit of layer k shares a rank with
which unit of layer k+1: an independent linear assignment per layer pair, solved exactly here.
Layer 0 (inputs) is free: each input is owned by one of its consumers. Prints the per-layer
optimum and the total, to set against the `spdnn-partition` plan (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

from partition.methods import identical_row_clusters
from spdnn.io.bundle import load_network
from spdnn.io.graphchallenge import read_graphchallenge
from spdnn.model.network import Network
from spdnn.model.plan import network_patterns

ROOT = Path(__file__).resolve().parents[2]
GC = ROOT.parent / "shared" / "data" / "graphchallenge" / "neuron1024"


def consumers(weight: sp.csr_matrix, unit: np.ndarray, nparts: int) -> tuple[np.ndarray, ...]:
    """Distinct (input row j, consuming unit v) pairs of one layer."""
    coo = weight.tocoo()
    pairs = np.unique(coo.col.astype(np.int64) * nparts + unit[coo.row])
    return pairs // nparts, pairs % nparts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", help="a network bundle (default: the Graph Challenge 1024 "
                    "network from ../shared/data)")
    ap.add_argument("--layers", type=int, default=24, help="first L layers (default 24)")
    ap.add_argument("-P", type=int, default=64, dest="nparts")
    args = ap.parse_args()
    if args.network:
        net = load_network(args.network)
    elif GC.is_dir():
        net = read_graphchallenge(GC, -0.3, 32)
    else:
        print(f"bound_groups: {GC} absent; pass --network", file=sys.stderr)
        return 2
    net = Network(layers=net.layers[:args.layers])
    patterns = network_patterns(net)
    clusters = identical_row_clusters(patterns, args.nparts)
    offsets = np.concatenate([[0], np.cumsum(net.sizes)])
    units = []
    for k in range(1, len(net.sizes)):
        local = clusters[offsets[k]:offsets[k + 1]]
        local = np.unique(local, return_inverse=True)[1].reshape(-1)
        if local.max() + 1 != args.nparts or len(set(np.bincount(local))) != 1:
            print(f"bound_groups: layer {k} does not split into {args.nparts} equal units of "
                  "identical rows; the bound does not apply", file=sys.stderr)
            return 2
        units.append(local)
    j, _ = consumers(net.layers[0].weight, units[0], args.nparts)
    per_layer = [len(j) - len(np.unique(j))]  # each input owned by one of its consumers
    for k in range(1, len(net.layers)):
        j, v = consumers(net.layers[k].weight, units[k], args.nparts)
        overlap = np.bincount(units[k - 1][j] * args.nparts + v,
                              minlength=args.nparts ** 2).reshape(args.nparts, args.nparts)
        rows, cols = linear_sum_assignment(-overlap)
        per_layer.append(len(j) - int(overlap[rows, cols].sum()))
    print("layer  least forward rows with units whole")
    for k, rows_k in enumerate(per_layer, 1):
        print(f"{k:5d}  {rows_k:,}")
    print(f"total  {sum(per_layer):,} forward rows (P = {args.nparts}, {len(net.layers)} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
