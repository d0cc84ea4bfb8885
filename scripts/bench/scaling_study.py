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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

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


LARGE_RANKS = (64, 256, 1024)  # the large network's P (with plans of 16 to 1,024 parts)
LARGE_PARTS = (16, 64, 256, 1024)


def network_works(key: str, net, args) -> tuple[dict, list[str]]:  # noqa: ANN001
    """Block, cyclic and partitioned workloads for every part count, and each partitioned
    plan's time."""
    from partition.methods import partition_network
    from spdnn.cost.workload import locality, workload
    from spdnn.model.plan import network_patterns

    pats = network_patterns(net)
    local = locality(pats)  # once per network, not per plan
    works: dict[str, dict[int, object]] = {"block": {}, "cyclic": {}, "partitioned": {}}
    notes = []
    for n in args.ranks:
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
    return works, notes


def network_section(key: str, title: str, works: dict, notes: list[str], machine, suffix: str,
                    args) -> str:  # noqa: ANN001
    from spdnn.cost.costmodel import predict

    top_hyper = max(works["partitioned"])
    rows, curves = [], {}
    one = predict(works["block"][1], machine, args.batch, 1).seconds
    for p in args.ranks:
        best_of = {}
        for method, plans in works.items():
            preds = [predict(w, machine, args.batch, p // n) for n, w in plans.items()
                     if p % n == 0 and p // n <= args.batch]
            if preds:
                best_of[method] = min(preds, key=lambda x: x.seconds)
                curves.setdefault(method, []).append((p, one / best_of[method].seconds))
        rows.append(_row(title, p, one, best_of, ("block", "cyclic", "partitioned")))
        print(" | ".join(rows[-1]), flush=True)
    png = ROOT / "docs" / f"scaling-{key}{suffix}.png"
    if not args.no_write:
        from spdnn.io.plots import plot_scaling

        plot_scaling(curves, f"{title}: predicted training step, batch {args.batch}, "
                             f"{machine.cluster.name}", png, top_hyper)
    hyper = (f"Plans of the partitioner's {args.method} method for every part count up to "
             f"{top_hyper} (each plan's time: {'; '.join(notes)})"
             + ("" if top_hyper >= args.ranks[-1] else
                "; beyond, its best grid uses them with more replicas (the shaded part of "
                "the plot)") + ".")
    return (f"### {title}\n\n{hyper} One rank: {1e3 * one:.1f} ms per step. Plot: "
            f"`docs/{png.name}`.\n\n" + table(HEADER, rows))


HEADER = ["network", "P", "best grid (method parts x replicas)", "ms/step", "speed-up",
          "compute / exchange / gradient %", "block best ms (grid)", "cyclic best ms (grid)",
          "partitioned best ms (grid)"]


def _row(title: str, p: int, one: float, best_of: dict, methods: tuple[str, ...]) -> list[str]:
    best = min(best_of.values(), key=lambda x: x.seconds)
    cells = []
    for method in methods:
        b = best_of.get(method)
        cells.append(f"{1e3 * b.seconds:.2f} ({b.parts}x{b.replicas})" if b else "-")
    return [title, str(p), f"{best.method} {best.parts}x{best.replicas}",
            f"{1e3 * best.seconds:.2f}", f"{one / best.seconds:.1f}x",
            f"{100 * best.compute / best.seconds:.0f} / "
            f"{100 * best.exchange / best.seconds:.0f} / "
            f"{100 * best.gradient / best.seconds:.0f}", *cells]


def large_key(bundle) -> str:  # noqa: ANN001
    return f"{bundle.meta.get('generator', 'network')}{bundle.sizes[0]}x{bundle.n_layers}"


def large_plans(bundle, args) -> tuple[dict, list[str]]:  # noqa: ANN001
    """The large network's block plans (from its rows' nonzeros: row pointers only) and the
    partitioner's (from ``--plans``, else made by ``spdnn-partition`` under
    ``--large-memory-limit``, as a user would); the caller checks them against the network."""
    import subprocess

    from partition.baselines import baseline_owners
    from spdnn.io.planfile import load_plan
    from spdnn.model.plan import Plan

    weights = [np.ones(bundle.sizes[0], dtype=np.int64)] + [
        bundle.row_nnz(k).astype(np.int64) for k in range(1, bundle.n_layers + 1)]
    plans: dict[str, dict[int, Plan]] = {"block": {}, "partitioned": {}}
    notes = []
    for n in LARGE_PARTS:
        plans["block"][n] = Plan(n, tuple(baseline_owners("block", [], parts=n,
                                                         weights=weights)),
                                 {"method": "block"})
        out = Path(args.plans or ".") / f"{large_key(bundle)}-sweep-{n}.npz"
        if not out.exists():
            cmd = ["spdnn-partition", str(bundle.path), "-P", str(n), "-o", str(out),
                   "--method", "sweep", "--memory-limit", args.large_memory_limit]
            print(f"large: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, check=True)
        plans["partitioned"][n] = load_plan(out)
        seconds = plans["partitioned"][n].meta.get("partition_seconds", float("nan"))
        notes.append(f"{n} parts: {seconds:.0f} s")
    return plans, notes


class _Fingerprinting(Sequence):
    """Patterns that feed a fingerprint as they are first read in order (the streamed
    workloads' pass reads every layer once: the network is checked in the same pass)."""

    def __init__(self, patterns: Sequence, sizes: tuple[int, ...]) -> None:
        from spdnn.model.fingerprint import Fingerprint

        self.patterns, self.fingerprint, self.fed = patterns, Fingerprint(sizes), 0

    def __len__(self) -> int:
        return len(self.patterns)

    def __getitem__(self, i: int):  # noqa: ANN204
        pattern = self.patterns[i]
        if i == self.fed:
            self.fingerprint.add(pattern[0], pattern[1])
            self.fed += 1
        return pattern


def large_sections(path: Path, machines: list, args) -> list[str]:  # noqa: ANN001
    """RadiX-Net 65536 x 1920: its rank-pair lists (1.7e9 messages under the block plan at
    P = 1,024) do not fit in memory, so its workloads are streamed (each layer read again from
    the file for the forward and the backward replay), every run replayed side by side. The
    file is read three times: for the workloads (with the fingerprint and the locality), and
    for the forward and the backward replay."""
    from spdnn.cost.costmodel import predict_many, single_part
    from spdnn.cost.workload import streamed_workloads
    from spdnn.io.bundle import NetworkBundle

    bundle = NetworkBundle(path)
    plans, notes = large_plans(bundle, args)
    t0 = time.perf_counter()
    order = [("single", 1, single_part(bundle.sizes))] + [
        (method, n, plan) for method, by_n in plans.items() for n, plan in by_n.items()]
    first = _Fingerprinting(bundle.patterns(), bundle.sizes)
    works = streamed_workloads(first, [plan for *_, plan in order])
    for method, n, plan in order[1:]:
        if method == "partitioned":
            plan.check_for(bundle.sizes, first.fingerprint.hexdigest(),
                           f"{large_key(bundle)}-sweep-{n}.npz")
    patterns = bundle.patterns()  # the replays read through their own one-layer cache
    works = [replace(w, patterns=patterns) for w in works]
    print(f"large: {len(works)} workloads in {time.perf_counter() - t0:.0f} s", flush=True)
    runs, keys = [], []
    for m, machine in enumerate(machines):
        for (method, n, _), work in zip(order, works):
            for p in (1, *LARGE_RANKS):
                if p % n == 0 and p // n <= args.batch and (p > 1 or n == 1):
                    runs.append((work, machine, args.batch, p // n))
                    keys.append((m, method, p))
    t0 = time.perf_counter()
    preds = predict_many(runs)
    print(f"large: {len(runs)} predictions in {time.perf_counter() - t0:.0f} s", flush=True)
    title = (f"RadiX-Net {bundle.sizes[0]} x {bundle.n_layers} (generated, seed "
             f"{bundle.meta.get('seed')})" if bundle.meta.get("generator") == "radixnet"
             else path.name)
    sections = []
    for m, _ in enumerate(machines):
        mine = [(k, pr) for k, pr in zip(keys, preds) if k[0] == m]
        one = next(pr.seconds for (_, method, p), pr in mine if p == 1)
        rows = []
        for p in LARGE_RANKS:
            best_of = {}
            for (_, method, q), pr in mine:
                # One part with P replicas is a grid of either kind.
                for col in ("block", "partitioned") if method == "single" else (method,):
                    if q == p and (col not in best_of or pr.seconds < best_of[col].seconds):
                        best_of[col] = pr
            rows.append(_row(title, p, one, best_of, ("block", "partitioned")))
            print(" | ".join(rows[-1]), flush=True)
        sections.append(
            f"### {title}\n\nThe network of the challenge's largest class (4.0e9 nonzeros, "
            "a 33-GB file: `spdnn generate radixnet --neurons 65536 --layers 1920 --seed 0`), "
            f"at P = {', '.join(map(str, LARGE_RANKS))} only. Plans: block and the "
            f"partitioner's {', '.join(map(str, LARGE_PARTS))}-part plans (`spdnn-partition "
            f"--memory-limit {args.large_memory_limit}`; each plan's time: "
            f"{'; '.join(notes)}); grids from them and from one part with P replicas. One "
            f"rank (a prediction: it would hold the whole network): {one:.3g} s per step.\n\n"
            + table([h for h in HEADER if not h.startswith("cyclic")], rows))
    return sections


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--calibration", required=True, help="from spdnn calibrate")
    ap.add_argument("--cluster", nargs="+",
                    default=[str(ROOT / "docs" / "cluster-hdr-infiniband.json")],
                    help="cluster files, each its own section (default: the HDR example)")
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
    ap.add_argument("--large", metavar="NETWORK",
                    help="a RadiX-Net 65536 x 1920 bundle (spdnn generate radixnet --neurons "
                         "65536 --layers 1920 --seed 0 -o NETWORK): adds it at P = 64, 256 "
                         "and 1,024, streamed from the file")
    ap.add_argument("--large-memory-limit", default="7.5G",
                    help="spdnn-partition --memory-limit for its plans (default 7.5G)")
    args = ap.parse_args()
    if args.partitioned_up_to is None:
        args.partitioned_up_to = args.max_ranks
    if args.jobs < 1 or args.partition_limit <= 0 or args.partitioned_up_to < 1:
        ap.error("--jobs and --partitioned-up-to must be at least 1, --partition-limit above 0")
    if args.plans and os.path.exists(args.plans) and not os.path.isdir(args.plans):
        ap.error(f"--plans {args.plans}: not a directory")
    if args.large and not os.path.isfile(args.large):
        ap.error(f"--large {args.large}: no such file")

    from spdnn.cost.cluster import Machine, load_cluster
    from spdnn.cost.machine import load_calibration

    calibration = load_calibration(args.calibration)
    machines = [Machine(calibration, load_cluster(c)) for c in args.cluster]
    suffixes = []
    for c in args.cluster:
        stem = Path(c).stem.removeprefix("cluster-")
        suffixes.append("" if stem == "hdr-infiniband" else f"-{stem}")  # the example's names
    args.ranks = [2**i for i in range(args.max_ranks.bit_length()) if 2**i <= args.max_ranks]
    sections: list[list[str]] = [[] for _ in machines]
    for key, title, net in networks():
        works, notes = network_works(key, net, args)
        for m, machine in enumerate(machines):
            sections[m].append(network_section(key, title, works, notes, machine,
                                               suffixes[m], args))
    if args.large:
        for m, section in enumerate(large_sections(Path(args.large), machines, args)):
            sections[m].append(section)
    for machine, suffix, cluster, body in zip(machines, suffixes, args.cluster, sections):
        publish_study(args, machine, suffix, cluster, body)
    return 0


def publish_study(args, machine, suffix: str, cluster: str, sections: list[str]) -> None:  # noqa: ANN001
    cmd = (f"python scripts/bench/scaling_study.py --calibration {args.calibration} --batch "
           f"{args.batch} --max-ranks {args.max_ranks} --method {args.method}"
           + ("" if args.partitioned_up_to >= args.max_ranks else
              f" --partitioned-up-to {args.partitioned_up_to}")
           + ("" if args.method == "sweep" else
              f" --partition-limit {args.partition_limit:g} --jobs {args.jobs}")
           + ("" if len(args.cluster) == 1 and not suffix else
              " --cluster " + " ".join(os.path.relpath(c, ROOT) for c in args.cluster))
           + ("" if not args.large else
              f" --large NETWORK --large-memory-limit {args.large_memory_limit}"))
    link = machine.cluster.inter
    memory = "" if machine.cluster.memory_bandwidth_Bps is None else (
        f"; copies within a node share its {machine.cluster.memory_bandwidth_Bps / 1e9:.0f} "
        "GB/s of memory bandwidth")
    body = (f"Command: `mpirun -n 2 spdnn calibrate -o {args.calibration}` (this 2-core "
            f"machine: the compute side), then `{cmd}`. Network: "
            f"`{os.path.relpath(cluster, ROOT)}` ({machine.cluster.name}; its numbers "
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


if __name__ == "__main__":
    from spdnn.errors import SpdnnError

    try:
        sys.exit(main())
    except SpdnnError as exc:  # a bad --plans file or calibration: one line, not a traceback
        print(f"scaling_study.py: {exc}", file=sys.stderr)
        sys.exit(2)
