"""Predicted scaling of a training step from 1 to 1,024 ranks on the example cluster.

    mpirun -n 2 spdnn calibrate -o docs/calibration-2core-vm.json
    python scripts/bench/scaling_study.py --calibration docs/calibration-2core-vm.json \\
        [--cluster docs/cluster-hdr-infiniband.json] [--batch 256] [--max-ranks 1024] \\
        [--method sweep] [--plans DIR] [--no-write]

Networks: the Graph Challenge 1024 x 120 network (read from ../shared/data/graphchallenge when
present, else its generated twin, RadiX-Net 1024 x 120, with the same first layers), and a
RadiX-Net 16384 x 120 network (generator, seed 0). Plans: block and cyclic for every part count
that is a power of 2 up to --max-ranks, and the partitioner's (--method, default sweep; the
hypergraph method within --partition-limit seconds and --jobs worker processes) for every part
count up to --partitioned-up-to (default: all of them); --plans DIR keeps them and reuses them
on the next run (a run that only changes the calibration then takes minutes). For every P,
every grid n parts x P/n
replicas with a plan of n parts is predicted (spdnn.cost.costmodel) and the fastest kept, per method
and overall. Writes the tables to docs/SCALING.md and one plot per network to
docs/scaling-*.png; another --cluster file (e.g. docs/cluster-ethernet-10g.json) gets its own
section and plots, named after the file, beside the HDR example's.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, SHARED, parser, publish, summary_row, table  # noqa: E402

SCALING = ROOT / "docs" / "SCALING.md"


def networks():  # noqa: ANN201
    from spdnn.io.graphchallenge import read_graphchallenge
    from spdnn.model.generate import radixnet

    gc = SHARED / "graphchallenge" / "neuron1024"
    if gc.is_dir():
        yield "gc1024", "Graph Challenge 1024 x 120 (official layers)", \
            read_graphchallenge(gc, -0.3, 32.0)
    else:
        yield "gc1024", "RadiX-Net 1024 x 120 (generated: ../shared absent)", radixnet(1024, 120)
    yield "rx16384", "RadiX-Net 16384 x 120 (generated, seed 0)", radixnet(16384, 120, seed=0)


def searched_plan(net, pats, n: int, key: str, args):  # noqa: ANN001, ANN201
    """The partitioner's plan for ``n`` parts and the seconds it took: from ``--plans`` when
    made before for this network by this method, else made now (and kept there)."""
    from partition.methods import partition_network
    from spdnn.io.planfile import load_plan, save_plan
    from spdnn.model.plan import Plan

    path = Path(args.plans) / f"{key}-{args.method}-{n}.npz" if args.plans else None
    if path is not None and path.exists():
        plan = load_plan(path)  # a plan for another network: one line, exit 2 (main)
        plan.check_for(net.sizes, net.fingerprint(), str(path))
        if plan.parts == n and "study_seconds" in plan.meta:
            return plan, float(plan.meta["study_seconds"])
    t0 = time.perf_counter()
    limit = args.partition_limit if args.method == "hypergraph" else None
    plan = partition_network(pats, n, method=args.method, seed=0, fingerprint=net.fingerprint(),
                             time_limit=limit, jobs=args.jobs)
    seconds = time.perf_counter() - t0
    plan = Plan(plan.parts, plan.owners, {**plan.meta, "study_seconds": seconds})
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_plan(plan, path)
    return plan, seconds


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network's predicted step at one rank, at the largest P with a partitioned plan
    and at the largest P, against the best block-plan grid."""
    rows = []
    for t in tables:
        planned = [r for r in t if r["partitioned best ms (grid)"] != "-"]
        picks = [t[0], planned[-1] if planned else t[0], t[-1]]
        picks = list({r["P"]: r for r in picks}.values())
        rows.append(summary_row(
            f"{t[0]['network']}: predicted step at P = {' / '.join(r['P'] for r in picks)} "
            "(ms, best grid)", " / ".join(r["ms/step"] for r in picks),
            " / ".join(r["block best ms (grid)"].split(" (")[0] for r in picks)
            + " (block plans)", f"speed-up {picks[-1]['speed-up']} at P = {picks[-1]['P']}"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--calibration", required=True, help="from spdnn calibrate")
    ap.add_argument("--cluster", default=str(ROOT / "docs" / "cluster-hdr-infiniband.json"))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-ranks", type=int, default=1024)
    ap.add_argument("--method", default="sweep", choices=("sweep", "hypergraph"),
                    help="the partitioner's method (default sweep)")
    ap.add_argument("--partitioned-up-to", type=int, default=None,
                    help="the largest part count given a partitioned plan (default: "
                         "--max-ranks)")
    ap.add_argument("--partition-limit", type=float, default=300.0,
                    help="seconds for one plan of --method hypergraph (default 300)")
    ap.add_argument("--jobs", type=int, default=2, help="partitioner worker processes")
    ap.add_argument("--plans", metavar="DIR", help="keep the partitioned plans in DIR and reuse "
                                                   "them (checked against the network)")
    args = ap.parse_args()
    if args.partitioned_up_to is None:
        args.partitioned_up_to = args.max_ranks
    if args.jobs < 1 or args.partition_limit <= 0 or args.partitioned_up_to < 1:
        ap.error("--jobs and --partitioned-up-to must be at least 1, --partition-limit above 0")
    if args.plans and os.path.exists(args.plans) and not os.path.isdir(args.plans):
        ap.error(f"--plans {args.plans}: not a directory")

    from partition.methods import partition_network
    from spdnn.cost.cluster import Machine, load_cluster
    from spdnn.cost.costmodel import predict
    from spdnn.cost.machine import load_calibration
    from spdnn.cost.workload import locality, workload
    from spdnn.model.plan import network_patterns

    machine = Machine(load_calibration(args.calibration), load_cluster(args.cluster))
    stem = Path(args.cluster).stem.removeprefix("cluster-")
    suffix = "" if stem == "hdr-infiniband" else f"-{stem}"  # the example keeps its names
    ranks = [2**i for i in range(args.max_ranks.bit_length()) if 2**i <= args.max_ranks]
    sections = []
    for key, title, net in networks():
        pats = network_patterns(net)
        local = locality(pats)  # once per network, not per plan
        works: dict[str, dict[int, object]] = {"block": {}, "cyclic": {}, "partitioned": {}}
        notes = []
        for n in ranks:
            for method in ("block", "cyclic"):
                works[method][n] = workload(pats, partition_network(pats, n, method=method), local)
            print(f"{key}: block and cyclic plans for {n} parts", flush=True)
            if 1 < n <= args.partitioned_up_to:
                plan, seconds = searched_plan(net, pats, n, key, args)
                works["partitioned"][n] = workload(pats, plan, local)
                cut = " (time limit: the best plan found by then)" \
                    if plan.meta.get("unfinished") else ""
                notes.append(f"{n} parts: {seconds:.0f} s{cut}")
                print(f"{key}: {args.method} plan for {notes[-1]}", flush=True)
        works["partitioned"][1] = works["block"][1]
        top_hyper = max(works["partitioned"])
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
            for method in ("block", "cyclic", "partitioned"):
                b = best_of.get(method)
                cells.append(f"{1e3 * b.seconds:.2f} ({b.parts}x{b.replicas})" if b else "-")
            rows.append([title, str(p), f"{best.method} {best.parts}x{best.replicas}",
                         f"{1e3 * best.seconds:.2f}", f"{one / best.seconds:.1f}x",
                         f"{100 * best.compute / best.seconds:.0f} / "
                         f"{100 * best.exchange / best.seconds:.0f} / "
                         f"{100 * best.gradient / best.seconds:.0f}", *cells])
            print(" | ".join(rows[-1]), flush=True)
        png = ROOT / "docs" / f"scaling-{key}{suffix}.png"
        if not args.no_write:
            from spdnn.io.plots import plot_scaling

            plot_scaling(curves, f"{title}: predicted training step, batch {args.batch}, "
                                 f"{machine.cluster.name}", png, top_hyper)
        hyper = (f"Plans of the partitioner's {args.method} method for every part count up to "
                 f"{top_hyper} (each plan's time: {'; '.join(notes)})"
                 + ("" if top_hyper >= ranks[-1] else
                    "; beyond, its best grid uses them with more replicas (the shaded part of "
                    "the plot)") + ".")
        sections.append(
            f"### {title}\n\n{hyper} One rank: {1e3 * one:.1f} ms per step. Plot: "
            f"`docs/{png.name}`.\n\n"
            + table(["network", "P", "best grid (method parts x replicas)", "ms/step",
                     "speed-up",
                     "compute / exchange / gradient %", "block best ms (grid)",
                     "cyclic best ms (grid)", "partitioned best ms (grid)"], rows))
    cmd = (f"python scripts/bench/scaling_study.py --calibration {args.calibration} --batch "
           f"{args.batch} --max-ranks {args.max_ranks} --method {args.method}"
           + ("" if args.partitioned_up_to >= args.max_ranks else
              f" --partitioned-up-to {args.partitioned_up_to}")
           + ("" if args.method == "sweep" else
              f" --partition-limit {args.partition_limit:g} --jobs {args.jobs}")
           + ("" if not suffix else
                              f" --cluster {os.path.relpath(args.cluster, ROOT)}"))
    link = machine.cluster.inter
    memory = "" if machine.cluster.memory_bandwidth_Bps is None else (
        f"; copies within a node share its {machine.cluster.memory_bandwidth_Bps / 1e9:.0f} "
        "GB/s of memory bandwidth")
    body = (f"Command: `mpirun -n 2 spdnn calibrate -o {args.calibration}` (this 2-core "
            f"machine: the compute side), then `{cmd}`. Network: "
            f"`{os.path.relpath(args.cluster, ROOT)}` ({machine.cluster.name}; its numbers "
            "are assumptions with sources named in the file: one port of "
            f"{link.bandwidth_Bps / 1e9:.3g} GB/s and {link.latency_s * 1e6:.3g} us per node "
            f"shared by its {machine.cluster.ranks_per_node} ranks{memory}). Every "
            "figure here "
            "is a prediction: beyond P = 2 nothing was measured, and the compute side "
            "carries the misses of the validation (\"Where it misses\"). Batch "
            f"{args.batch}, float32, `--exchange dense` bytes.\n\n"
            + "\n\n".join(sections))
    where = "" if not suffix else f" over {machine.cluster.name.split(',')[0]}"
    publish(args, f"study{suffix}", f"Study: 1 to 1,024 ranks{where}", body, page="SCALING",
            area="Scaling study", rows=summary, command=cmd)
    return 0


if __name__ == "__main__":
    from spdnn.errors import SpdnnError

    try:
        sys.exit(main())
    except SpdnnError as exc:  # a bad --plans file or calibration: one line, not a traceback
        print(f"scaling_study.py: {exc}", file=sys.stderr)
        sys.exit(2)
