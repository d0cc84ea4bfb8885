"""The partitioner at scale: time, peak memory and volume against network size.

Generates RadiX-Net networks (NEURONS x LAYERS, seed 0) in a work directory outside the
repository, runs ``spdnn-partition`` on each as a user would, samples the summed proportional
set size (PSS) of its process tree every 0.5 s (the command and its worker processes: shared
pages counted once), and compares the plan with the block and cyclic baselines. Rows accumulate
in WORKDIR/bench_scale.json, so sizes can be measured in separate runs; the table in
docs/BENCHMARKS.md ("Partitioner at scale") shows them all.

    python scripts/bench/bench_scale.py --neurons 1024 4096 16384 -P 64
    python scripts/bench/bench_scale.py --neurons 65536 -P 256
    python scripts/bench/bench_scale.py --neurons 65536 --layers 1920 -P 16 --memory-limit 8G
    python scripts/bench/bench_scale.py --neurons 16384 -P 64 --method hypergraph --time-limit 600
    python scripts/bench/bench_scale.py --publish   # the rows of the runs above, together
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import spdnn.cli.thread_pools  # noqa: F401
from harness import parser, publish, summary_row, table
from spdnn.io.atomic import write_text


def _tree(pid: int) -> list[int]:
    out = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for c in children:
        out += _tree(int(c))
    return out


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measured(cmd: list[str], log: Path) -> tuple[float, float, int]:
    """Run ``cmd`` (output to ``log``): wall seconds, peak summed PSS in bytes, exit code."""
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, sum(_pss(p) for p in _tree(proc.pid)))
            time.sleep(0.5)
    return time.monotonic() - t0, peak, proc.returncode


def baselines(network: Path, nparts: int) -> dict[str, dict]:
    """The statistics of the block and cyclic plans (as ``_counts``), read a layer at a time:
    the largest networks do not fit in memory."""
    from partition.methods import baseline_owners
    from spdnn.io.bundle import NetworkBundle
    from spdnn.model.plan import combine_stats, plan_statistics

    bundle = NetworkBundle(str(network))
    out = {}
    for name in ("block", "cyclic"):  # a layer's owners depend on that layer alone
        stats, prev = [], None
        for k in range(1, bundle.n_layers + 1):
            layer = [(*bundle.pattern(k), bundle.shapes[k - 1])]
            first, own = baseline_owners(name, layer, parts=nparts)
            stats.append(plan_statistics(layer, [first if prev is None else prev, own],
                                         parts=nparts, first_layer=k))
            prev = own
        out[name] = _counts(combine_stats(stats).summary())
    return out


def _counts(s: dict) -> dict:
    """What a row shows of a plan's statistics (``PlanStats.summary``)."""
    return {"volume": s["volume"], "forward": s["forward_total"], "max_sent": s["max_sent"],
            "max_received": s["max_received"],
            "messages": s.get("messages", sum(s["pairs"]) + sum(
                p for p, b in zip(s["pairs"], s["backward"]) if b))}


def run_one(args: argparse.Namespace, neurons: int) -> dict:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    network = work / f"radixnet{neurons}x{args.layers}.npz"
    if not network.exists():
        subprocess.run(["spdnn", "generate", "radixnet", "--neurons", str(neurons), "--layers",
                        str(args.layers), "--seed", "0", "-o", str(network)], check=True)
    tag = f"{neurons}x{args.layers}-P{args.nparts}-{args.method}-j{args.jobs}-" \
          f"t{args.time_limit}-m{args.memory_limit}"
    plan = work / f"plan-{tag}.npz"
    cmd = ["spdnn-partition", str(network), "-P", str(args.nparts), "-o", str(plan),
           "--jobs", str(args.jobs), "--verbose"]
    for flag, value in (("--method", args.method), ("--time-limit", args.time_limit),
                        ("--memory-limit", args.memory_limit)):
        if value:
            cmd += [flag, str(value)]
    print(" ".join(cmd), flush=True)
    seconds, peak, code = measured(cmd, work / f"log-{tag}.txt")
    if code != 0:
        raise SystemExit(f"spdnn-partition failed ({code}): see {work / f'log-{tag}.txt'}")
    from spdnn.io.bundle import NetworkBundle
    from spdnn.io.planfile import load_plan

    meta = load_plan(plan).meta
    bundle = NetworkBundle(str(network))
    nnz = sum(bundle.nnz(k) for k in range(1, bundle.n_layers + 1))
    return {"neurons": neurons, "layers": args.layers, "nnz": nnz, "P": args.nparts,
            "method": meta["method"], "jobs": args.jobs, "time_limit": args.time_limit,
            "memory_limit": args.memory_limit, "windows": len(meta.get("windows") or [1]),
            "seconds": seconds, "peak_gb": peak / 1e9, **_counts(meta["stats"]),
            "chosen": "+".join(sorted(set(meta.get("window_starts") or [meta["chosen_start"]]))),
            "unfinished": len(meta.get("unfinished") or []),
            "baselines": baselines(network, args.nparts), "date": time.strftime("%Y-%m-%d")}


def render(rows: list[dict]) -> str:
    header = ["network", "P", "method", "options", "wall s", "peak memory GB",
              "volume (forward)", "block", "cyclic", "block / plan", "cyclic / plan",
              "max sent / received a rank (block)", "messages (block)", "best start",
              "unfinished"]
    lines = []
    for r in sorted(rows, key=lambda r: (r["nnz"], r["P"], r["method"], r["jobs"])):
        b, c = r["baselines"]["block"], r["baselines"]["cyclic"]
        options = " ".join(f"{flag} {r[key]}" for flag, key in (
            ("--time-limit", "time_limit"), ("--memory-limit", "memory_limit"),
            ("--jobs", "jobs")) if r[key] and not (key == "jobs" and r[key] == 1)) or "-"
        if r["windows"] > 1:
            options += f" ({r['windows']} windows)"
        lines.append([f"RadiX-Net {r['neurons']} x {r['layers']} ({r['nnz'] / 1e6:,.1f} M nnz)",
                      f"{r['P']:,}", r["method"], options, f"{r['seconds']:.0f}",
                      f"{r['peak_gb']:.2f}", f"{r['volume']:,} ({r['forward']:,})",
                      f"{b['volume']:,} ({b['forward']:,})",
                      f"{c['volume']:,} ({c['forward']:,})",
                      f"{b['volume'] / r['volume']:.1f}x", f"{c['volume'] / r['volume']:.1f}x",
                      f"{r['max_sent']:,} / {r['max_received']:,} ({b['max_sent']:,} / "
                      f"{b['max_received']:,})", f"{r['messages']:,} ({b['messages']:,})",
                      r["chosen"], str(r["unfinished"])])
    return table(header, lines)


def before_after(args: argparse.Namespace) -> int:
    """The Graph Challenge network (all 120 layers, or --gc-layers) partitioned by this tree
    and by ``--before`` (e.g. a git worktree of an earlier commit), alternating, one process
    each, default options: seconds (whole command) and volume."""
    import os
    import statistics

    from spdnn.io.bundle import save_network
    from spdnn.io.graphchallenge import read_graphchallenge
    from spdnn.model.network import Network

    gc = Path(__file__).resolve().parents[3] / "shared" / "data" / "graphchallenge" / "neuron1024"
    if not gc.is_dir():
        raise SystemExit(f"{gc} is absent: the before/after comparison needs the real network")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    network = work / f"gc1024x{args.gc_layers}.npz"
    if not network.exists():
        save_network(Network(layers=read_graphchallenge(gc, -0.3, 32).layers[:args.gc_layers]),
                     network)
    trees = {"before": Path(args.before).resolve(), "after": Path(__file__).resolve().parents[2]}
    seconds: dict[str, list[float]] = {k: [] for k in trees}
    volume: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            plan = work / f"gc-{name}.npz"
            env = {**os.environ, "PYTHONPATH": str(tree)}
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "partition", str(network), "-P",
                            str(args.nparts), "-o", str(plan), "--quiet"], check=True, env=env,
                           stdout=subprocess.DEVNULL, cwd=tree)
            seconds[name].append(time.monotonic() - t0)
            from spdnn.io.planfile import load_plan

            volume[name] = load_plan(plan).meta["stats"]["volume"]
    rows = [[name, f"{statistics.median(seconds[name]):.1f}",
             " / ".join(f"{t:.1f}" for t in seconds[name]), f"{volume[name]:,}"]
            for name in trees]
    ratio = statistics.median(seconds["before"]) / statistics.median(seconds["after"])
    body = (f"Command: `python scripts/bench/bench_scale.py --before {args.before} --gc-layers "
            f"{args.gc_layers} -P {args.nparts} --rounds {args.rounds}` "
            f"({time.strftime('%Y-%m-%d')}; the two trees alternate; whole `spdnn-partition` "
            f"commands, default options). "
            f"Graph Challenge 1024 x {args.gc_layers} at P = {args.nparts}.\n\n"
            + table(["tree", "median s", "each round s", "volume"], rows)
            + f"\n\nAfter / before speed: **{ratio:.2f}x**.")
    publish(args, "partition-before-after", "Partitioner before and after", body, area=None,
            rows=None)
    return 0


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each run's volume against the block plan's, with its time and peak memory."""
    return [summary_row(f"{r['network']} at P = {r['P']}, {r['method']}"
                        + ("" if r["options"] == "-" else f" {r['options']}")
                        + " (rows per step; wall s, peak GB)",
                        f"{r['volume (forward)'].split(' (')[0]}; {r['wall s']} s, "
                        f"{r['peak memory GB']} GB",
                        f"{r['block'].split(' (')[0]} (block plan)",
                        f"{r['block / plan']} fewer rows")
            for r in tables[0]]


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--neurons", type=int, nargs="+")
    p.add_argument("--before", metavar="TREE",
                   help="instead: time the Graph Challenge network against this source tree")
    p.add_argument("--gc-layers", type=int, default=120)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--layers", type=int, default=120)
    p.add_argument("-P", "--nparts", type=int, default=64)
    p.add_argument("--method", default="sweep")
    p.add_argument("--time-limit", type=float, default=None)
    p.add_argument("--memory-limit", default=None)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--publish", action="store_true",
                   help="publish the rows stored in --workdir by earlier runs (made with "
                        "--no-write), without measuring again")
    p.add_argument("--workdir", default="/tmp/spdnn-bench-scale",
                   help="generated networks, plans, logs and the results file (not committed)")
    args = p.parse_args()
    if args.before:
        return before_after(args)
    results = Path(args.workdir) / "bench_scale.json"
    if not args.neurons and not args.publish:
        p.error("--neurons is required (or --before TREE, or --publish)")
    rows: list[dict] = json.loads(results.read_text()) if args.publish and \
        results.exists() else []
    for n in args.neurons or []:
        row = run_one(args, n)
        rows = json.loads(results.read_text()) if results.exists() else []  # others' rows too
        key = ("neurons", "layers", "P", "method", "jobs", "time_limit", "memory_limit")
        rows = [r for r in rows if tuple(r.get(k) for k in key)
                != tuple(row[k] for k in key)] + [row]
        write_text(results, json.dumps(rows, indent=1), "the results store")
        print(render([row]), flush=True)
    body = ("Commands: `python scripts/bench/bench_scale.py --neurons N... [--layers L] -P P "
            "[--method M] [--time-limit S] [--memory-limit BYTES] [--jobs J]` (one run per "
            "row; RadiX-Net generated with seed 0; wall time of the whole command, loading and "
            "writing included; peak memory: the largest sum of the proportional set sizes of "
            "the command and its worker processes, sampled every 0.5 s). Volumes in rows per "
            "training step, forward in brackets; the busiest rank's rows sent and received "
            "per step, and the point-to-point messages per step, of the plan and (in "
            "brackets) of the block plan.\n\n" + render(rows))
    publish(args, "partition-scale", "Partitioner at scale", body, area="Partitioning",
            rows=summary, command="python scripts/bench/bench_scale.py --neurons N [--layers L] "
                                  "-P P [--memory-limit BYTES] (a run per row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
