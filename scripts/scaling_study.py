"""Predicted scaling of a training step from 1 to 1,024 ranks on the example cluster.

    mpirun -n 2 spdnn calibrate -o docs/calibration-2core-vm.json
    python scripts/scaling_study.py --calibration docs/calibration-2core-vm.json \\
        [--cluster docs/cluster-hdr-infiniband.json] [--batch 256] [--max-ranks 1024] \\
        [--hypergraph-up-to 16] [--partition-limit 600] [--no-write]

Networks: the Graph Challenge 1024 x 120 network (read from ../shared/data/graphchallenge when
present, else its generated twin, RadiX-Net 1024 x 120, with the same first layers), and a
RadiX-Net 16384 x 120 network (generator, seed 0). Plans: block and cyclic for every part count
that is a power of 2 up to --max-ranks; hypergraph plans (spdnn-partition's method, KaHyPar) for
part counts up to --hypergraph-up-to on the 1024-neuron network, stopping early when one takes
longer than --partition-limit seconds, and none on the 16384-neuron one (the partitioner does
not finish it: issue 22). For every P, every grid n parts x P/n replicas with a plan of n parts
is predicted (spdnn.costmodel) and the fastest kept, per method and overall. Writes the tables
to docs/SCALING.md and one plot per network to docs/scaling-*.png.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT, SHARED, table, write_section  # noqa: E402

SCALING = ROOT / "docs" / "SCALING.md"


def networks():  # noqa: ANN201
    from spdnn.generate import radixnet
    from spdnn.graphchallenge import read_graphchallenge

    gc = SHARED / "graphchallenge" / "neuron1024"
    if gc.is_dir():
        yield "gc1024", "Graph Challenge 1024 x 120 (official layers)", \
            read_graphchallenge(gc, -0.3, 32.0)
    else:
        yield "gc1024", "RadiX-Net 1024 x 120 (generated: ../shared absent)", radixnet(1024, 120)
    yield "rx16384", "RadiX-Net 16384 x 120 (generated, seed 0)", radixnet(16384, 120, seed=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", required=True, help="from spdnn calibrate")
    ap.add_argument("--cluster", default=str(ROOT / "docs" / "cluster-hdr-infiniband.json"))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-ranks", type=int, default=1024)
    ap.add_argument("--hypergraph-up-to", type=int, default=16)
    ap.add_argument("--partition-limit", type=float, default=600.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from partition.methods import partition_network
    from spdnn.costmodel import Machine, predict
    from spdnn.machine import load_calibration, load_cluster
    from spdnn.plan import network_patterns
    from spdnn.workload import locality, workload

    machine = Machine(load_calibration(args.calibration), load_cluster(args.cluster))
    ranks = [2**i for i in range(args.max_ranks.bit_length()) if 2**i <= args.max_ranks]
    sections = []
    for key, title, net in networks():
        pats = network_patterns(net)
        local = locality(pats)  # once per network, not per plan
        works: dict[str, dict[int, object]] = {"block": {}, "cyclic": {}, "hypergraph": {}}
        notes = []
        for n in ranks:
            for method in ("block", "cyclic"):
                works[method][n] = workload(pats, partition_network(pats, n, method), local)
            print(f"{key}: block and cyclic plans for {n} parts", flush=True)
            if key == "gc1024" and 1 < n <= args.hypergraph_up_to and \
                    not any("stopped" in x for x in notes):
                t0 = time.perf_counter()
                plan = partition_network(pats, n, "hypergraph", seed=0)
                seconds = time.perf_counter() - t0
                works["hypergraph"][n] = workload(pats, plan, local)
                notes.append(f"hypergraph plan for {n} parts: {seconds:.0f} s")
                print(f"{key}: {notes[-1]}", flush=True)
                if seconds > args.partition_limit:
                    notes.append(f"stopped: the {n}-part plan took more than "
                                 f"{args.partition_limit:.0f} s")
        works["hypergraph"][1] = works["block"][1]
        top_hyper = max(n for n in works["hypergraph"]) if key == "gc1024" else None
        if key != "gc1024":
            del works["hypergraph"]
        rows, curves = [], {}
        one = predict(works["block"][1], machine, args.batch, 1).seconds
        for p in ranks:
            best_of = {}
            for method, plans in works.items():
                preds = [predict(w, machine, args.batch, p // n) for n, w in plans.items()
                         if p % n == 0 and p // n <= args.batch]
                if preds:
                    best_of[method] = min(preds, key=lambda x: x.seconds)
                    curves.setdefault(method, []).append((p, one / best_of[method].seconds))
            best = min(best_of.values(), key=lambda x: x.seconds)
            cells = []
            for method in ("block", "cyclic", "hypergraph"):
                b = best_of.get(method)
                cells.append(f"{1e3 * b.seconds:.2f} ({b.parts}x{b.replicas})" if b else "-")
            rows.append([str(p), f"{best.method} {best.parts}x{best.replicas}",
                         f"{1e3 * best.seconds:.2f}", f"{one / best.seconds:.1f}x",
                         f"{100 * best.compute / best.seconds:.0f} / "
                         f"{100 * best.exchange / best.seconds:.0f} / "
                         f"{100 * best.gradient / best.seconds:.0f}", *cells])
            print(" | ".join(rows[-1]), flush=True)
        png = ROOT / "docs" / f"scaling-{key}.png"
        if not args.no_write:
            from spdnn.plots import plot_scaling

            plot_scaling(curves, f"{title}: predicted training step, batch {args.batch}, "
                                 f"{machine.cluster.name}", png, top_hyper)
        hyper = (f"Hypergraph plans exist up to {top_hyper} parts "
                 f"({'; '.join(notes)}); beyond, its best grid uses them with more replicas "
                 "(the shaded part of the plot)." if top_hyper else
                 "No hypergraph plan: the partitioner does not finish this network "
                 "(issue 22); block and cyclic only.")
        sections.append(
            f"### {title}\n\n{hyper} One rank: {1e3 * one:.1f} ms per step. Plot: "
            f"`docs/{png.name}`.\n\n"
            + table(["P", "best grid (method parts x replicas)", "ms/step", "speed-up",
                     "compute / exchange / gradient %", "block best ms (grid)",
                     "cyclic best ms (grid)", "hypergraph best ms (grid)"], rows))
    if not args.no_write:
        cmd = (f"python scripts/scaling_study.py --calibration {args.calibration} --batch "
               f"{args.batch} --max-ranks {args.max_ranks} --hypergraph-up-to "
               f"{args.hypergraph_up_to}")
        memory = "" if machine.cluster.memory_bandwidth_Bps is None else (
            f"; copies within a node share its {machine.cluster.memory_bandwidth_Bps / 1e9:.0f} "
            "GB/s of memory bandwidth")
        body = (f"Command: `mpirun -n 2 spdnn calibrate -o {args.calibration}` (this 2-core "
                f"machine: the compute side), then `{cmd}`. Network: "
                f"`{os.path.relpath(args.cluster, ROOT)}` ({machine.cluster.name}; its numbers "
                "are assumptions with sources named in the file: one 25 GB/s HDR port per "
                f"node shared by its {machine.cluster.ranks_per_node} ranks{memory}). Every "
                "figure here "
                "is a prediction: beyond P = 2 nothing was measured, and the compute side "
                "carries the misses of the validation (\"Where it misses\"). Batch "
                f"{args.batch}, float32, `--exchange dense` bytes.\n\n"
                + "\n\n".join(sections))
        write_section("study", "Study: 1 to 1,024 ranks", body, SCALING)
    return 0


if __name__ == "__main__":
    sys.exit(main())
