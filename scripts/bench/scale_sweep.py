"""Every grid from 1 rank to this machine's cores (or, over an emulated network, to its nodes),
measured and predicted side by side: the check of the cost model past 2 ranks that the first
machine with more cores can run with no new code.

    python scripts/bench/scale_sweep.py [--networks mlp random radixnet | --network FILE ...]
        [--max-ranks P] [--batch 32 256] [--steps 10] [--rounds 3] [--calibration FILE]
        [--nodes N --link RATE] [-o sweep.json]

For each P = 1, 2, ..., max (default: the cores, or the nodes with --nodes), every grid
parts x replicas = P (hypergraph plan for parts > 1; the block plan beside it when parts = P);
each configuration in a fresh job timing ``steps`` SGD steps after 2 warm-up steps (the
slowest rank's median step, scripts/bench/validate_model.py's worker), rounds interleaved, each
predicted from one calibration (taken first with as many ranks as the sweep's largest P on
one node, unless given). The output has validate_model.py's format (``spdnn-validation/1``:
``steps`` per case and round, ``calibrations``) plus ``predicted`` per case and round; the
table printed gives the medians and their ratio.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Ranks, table  # noqa: E402
from validate_model import MEASUREMENTS_FORMAT, build  # noqa: E402

from spdnn.io.atomic import write_text  # noqa: E402

BIN = Path(sys.executable).parent
WORKER = Path(__file__).resolve().parent / "validate_model.py"


def grids(max_ranks: int) -> list[tuple[int, int, str | None]]:
    """(parts, replicas, plan method or None) for every P up to ``max_ranks``."""
    out = []
    for p in range(1, max_ranks + 1):
        for parts in (d for d in range(1, p + 1) if p % d == 0):
            if parts == 1:
                out.append((1, p, None))
                continue
            out.append((parts, p // parts, "hypergraph"))
            if parts == p:
                out.append((parts, 1, "block"))
    return out


def label(parts: int, replicas: int, method: str | None) -> str:
    return f"{parts}x{replicas}" + (f" {method}" if method else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--networks", nargs="+", choices=["mlp", "random", "radixnet"],
                    default=["mlp"])
    ap.add_argument("--network", action="append", default=[],
                    help="a network bundle to sweep as well (repeatable)")
    ap.add_argument("--max-ranks", type=int, help="largest P (default: cores, or --nodes)")
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calibration")
    ap.add_argument("--nodes", type=int, help="run on this many emulated nodes (spdnn emulate)")
    ap.add_argument("--link", default="1gbit", help="the emulated links' rate")
    ap.add_argument("-o", "--output", default="sweep.json")
    args = ap.parse_args()

    from partition.methods import partition_network
    from spdnn.cost.cluster import Cluster, Machine
    from spdnn.cost.costmodel import predict, single_part
    from spdnn.cost.machine import Network, load_calibration
    from spdnn.cost.workload import workload
    from spdnn.io.bundle import load_network, save_network
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import network_patterns

    max_ranks = args.max_ranks or args.nodes or os.cpu_count() or 1
    configs = grids(max_ranks)
    nets = {name: build(name) for name in args.networks if not args.network}
    nets |= {Path(f).stem: load_network(f) for f in args.network}
    emu = None
    if args.nodes:
        from spdnn.emulate import Cluster as Emulated
        from spdnn.emulate import parse_rate

        emu = Emulated(nodes=args.nodes, rate_bps=parse_rate(args.link)).__enter__()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            cal_path = args.calibration or str(work / "calibration.json")
            if not args.calibration:
                calibrate = [str(BIN / "spdnn"), "calibrate", "-o", cal_path, "--dtype",
                             "float32"]
                ranks = min(max_ranks, os.cpu_count() or 1)
                subprocess.run(([str(BIN / "mpiexec"), "-n", str(ranks)] if ranks > 1 else [])
                               + calibrate, check=True, capture_output=True, timeout=1800)
            cal, cal_json = load_calibration(cal_path), json.loads(Path(cal_path).read_text())
            machine = Machine(cal)
            if emu is not None:
                m = emu.measure()
                print(m.describe(emu.rate_bps), flush=True)
                link = Network(latency_s=m.latency, bandwidth_Bps=m.bandwidth,
                               allreduce_latency_s=m.latency, allreduce_bandwidth_Bps=m.bandwidth)
                machine = Machine(cal, Cluster(
                    name=f"{args.nodes} emulated nodes, {args.link}", ranks_per_node=1,
                    intra=cal.network or link, inter=link, sources=("measured",),
                    assumptions="the emulated link as measured, one rank per node"))
            works = {}
            for name, net in nets.items():
                save_network(net, work / f"{name}.npz")
                pats = network_patterns(net)
                for parts, _, method in configs:
                    if (name, parts, method) in works:
                        continue
                    if parts == 1:
                        works[name, 1, None] = workload(pats, single_part(net.sizes))
                        continue
                    plan = partition_network(pats, parts, method=method, seed=0,
                                             fingerprint=net.fingerprint())
                    save_plan(plan, work / f"{name}-{parts}-{method}.npz")
                    works[name, parts, method] = workload(pats, plan)
            runner = Ranks(emu)
            steps: dict[str, list[float]] = {}
            predicted: dict[str, list[float]] = {}
            for r in range(args.rounds):
                order = configs[r % len(configs):] + configs[:r % len(configs)]
                for name in nets:
                    for batch in args.batch:
                        for parts, replicas, method in order:
                            case = repr((name, batch, (label(parts, replicas, method), method,
                                                       replicas)))
                            cmd = [sys.executable, str(WORKER), "--worker", "--net",
                                   str(work / f"{name}.npz"), "--batch", str(batch),
                                   "--steps", str(args.steps), "--replicas", str(replicas)]
                            if method:
                                cmd += ["--plan", str(work / f"{name}-{parts}-{method}.npz")]
                            proc = runner.run(cmd, parts * replicas)
                            t = json.loads(proc.stdout.strip().splitlines()[-1])["median"]
                            steps.setdefault(case, []).append(float(t))
                            predicted.setdefault(case, []).append(predict(
                                works[name, parts, method], machine, batch, replicas).seconds)
                print(f"round {r + 1} of {args.rounds} done", flush=True)
    finally:
        if emu is not None:
            emu.close()
    write_text(args.output, json.dumps({
        "format": MEASUREMENTS_FORMAT, "steps": steps, "predicted": predicted,
        "calibrations": [cal_json],
        "emulated": None if emu is None else {"nodes": args.nodes, "link": args.link}},
        separators=(",", ":")), "the measurements")
    rows = []
    for case, times in steps.items():
        t, p = statistics.median(times), statistics.median(predicted[case])
        rows.append([case, f"{t * 1e3:.3f}", f"{p * 1e3:.3f}", f"{p / t:.2f}"])
    print(table(["case (network, batch, grid)", "measured ms", "predicted ms",
                 "predicted / measured"], rows))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
