"""Plans in windows of layers against the whole-hypergraph plan (issue 48 item 4): time, peak
memory (summed PSS of the command's process tree, sampled every 0.5 s, as bench_scale.py) beside
the prediction, and volume beside the block plan's.

Runs ``spdnn-partition`` as a user would on an existing network file, once on the whole
hypergraph (unless --no-whole) and once in windows (under --memory-limit, or --window-layers),
and keeps the rows in WORKDIR/bench_windows.json. Its record holds the rows stored (with
--report, those of several work directories: runs hours apart publish as one record).

    python scripts/bench/bench_windows.py rx16384x120.npz -P 64 --memory-limit 1200M \
        --time-limit 600 --jobs 2
    python scripts/bench/bench_windows.py rx65536x1920.npz -P 2 --memory-limit 8G \
        --time-limit 3600 --no-whole --workdir W2
    python scripts/bench/bench_windows.py - -P 0 --report W2/bench_windows.json   # the table
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import argparse
import json
import time
from pathlib import Path

import spdnn.cli.thread_pools  # noqa: F401
from bench_scale import measured
from harness import parser, publish, summary_row, table
from spdnn.io.atomic import write_text


def run(args: argparse.Namespace, windowed: bool) -> dict:
    from partition.windows import whole_bytes
    from spdnn.io.bundle import NetworkBundle
    from spdnn.io.planfile import load_plan

    network = Path(args.network).resolve()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    tag = f"{network.stem}-P{args.nparts}-{'windows' if windowed else 'whole'}"
    plan = work / f"plan-{tag}.npz"
    cmd = ["spdnn-partition", str(network), "-P", str(args.nparts), "-o", str(plan),
           "--jobs", str(args.jobs)]
    if args.time_limit:
        cmd += ["--time-limit", str(args.time_limit)]
    if windowed:
        cmd += ["--memory-limit", args.memory_limit] if args.memory_limit else []
        cmd += ["--window-layers", str(args.window_layers)] if args.window_layers else []
    else:
        cmd += ["--memory-limit", "none"]
    print(" ".join(cmd), flush=True)
    seconds, peak, code = measured(cmd, work / f"log-{tag}.txt")
    if code != 0:
        raise SystemExit(f"spdnn-partition failed ({code}): see {work / f'log-{tag}.txt'}")
    meta = load_plan(plan).meta
    with NetworkBundle(network) as bundle:
        nnz = sum(bundle.nnz(k) for k in range(1, bundle.n_layers + 1))
        predicted = meta.get("predicted_bytes") or whole_bytes(bundle, args.nparts, args.jobs)
        shape = f"{bundle.sizes[1]} x {bundle.n_layers}"
    block = (meta.get("baseline_volumes") or {}).get("block")
    if block is None:  # the whole search names it only when it refined it
        block = block_volume(network, args.nparts)
    return {"network": shape, "nnz": nnz, "P": args.nparts, "jobs": args.jobs,
            "time_limit": args.time_limit, "mode": "windows" if windowed else "whole",
            "windows": len(meta.get("windows") or []) or 1,
            "memory_limit": args.memory_limit if windowed else None,
            "seconds": seconds, "peak_gb": peak / 1e9, "predicted_gb": predicted / 1e9,
            "volume": meta["stats"]["volume"], "block": block, "chosen": meta["chosen_start"],
            "unfinished": len(meta.get("unfinished") or []), "date": time.strftime("%Y-%m-%d")}


def block_volume(network: Path, nparts: int) -> int:
    """The block plan's training-step volume, read a few layers at a time."""
    from partition.windows import choose_windows, partition_windows
    from spdnn.io.bundle import NetworkBundle

    with NetworkBundle(network) as bundle:
        windows = choose_windows(bundle, nparts, limit=2**62, max_layers=8)
        return partition_windows(bundle, nparts, windows, method="block").stats.volume


def render(rows: list[dict]) -> str:
    header = ["network", "P", "plan", "--memory-limit", "--time-limit", "--jobs", "wall s",
              "peak GB (predicted)", "volume", "block / plan", "vs whole"]
    whole = {(r["network"], r["P"]): r["volume"] for r in rows if r["mode"] == "whole"}
    lines = []
    for r in sorted(rows, key=lambda r: (r["nnz"], r["P"], r["mode"] == "windows")):
        ref = whole.get((r["network"], r["P"]))
        lines.append([f"RadiX-Net {r['network']} ({r['nnz'] / 1e6:,.0f} M nnz)", str(r["P"]),
                      "whole hypergraph" if r["mode"] == "whole" else f"{r['windows']} windows",
                      r["memory_limit"] or "-", str(r["time_limit"] or "-"), str(r["jobs"]),
                      f"{r['seconds']:.0f}", f"{r['peak_gb']:.2f} ({r['predicted_gb']:.2f})",
                      f"{r['volume']:,}", f"{r['block'] / r['volume']:.1f}x",
                      "1" if r["mode"] == "whole" else
                      (f"{r['volume'] / ref:.3f}" if ref else "not run")])
    return table(header, lines)


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each windowed plan's volume and peak against the whole hypergraph's plan (or the
    block plan's volume where the whole one was not run)."""
    rows = []
    for r in tables[0]:
        if r["plan"] == "whole hypergraph":
            continue
        whole = next((w for w in tables[0] if w["network"] == r["network"] and w["P"] == r["P"]
                      and w["plan"] == "whole hypergraph"), None)
        rows.append(summary_row(
            f"{r['network']} at P = {r['P']}, {r['plan']} under --memory-limit "
            f"{r['--memory-limit']} (rows; wall s, peak GB)",
            f"{r['volume']}; {r['wall s']} s, {r['peak GB (predicted)']}",
            (f"{whole['volume']}; {whole['wall s']} s, {whole['peak GB (predicted)']} "
             "(whole hypergraph)") if whole else "not run (too large)",
            f"{r['vs whole']}x the volume" if whole else f"{r['block / plan']} below block"))
    return rows


def main() -> None:
    p = parser(__doc__)
    p.add_argument("network")
    p.add_argument("-P", "--nparts", type=int, required=True)
    p.add_argument("--memory-limit", default=None)
    p.add_argument("--window-layers", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=None)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--no-whole", action="store_true", help="only the windowed run")
    p.add_argument("--workdir", default="/tmp/spdnn-bench-windows")
    p.add_argument("--report", nargs="*", metavar="JSON",
                   help="run nothing: write the table of the rows stored in WORKDIR and in "
                        "these other bench_windows.json files")
    args = p.parse_args()
    store = Path(args.workdir) / "bench_windows.json"
    rows = json.loads(store.read_text()) if store.exists() else []
    for other in args.report or []:
        rows += json.loads(Path(other).read_text())
    for windowed in ([] if args.report is not None else
                     [True] if args.no_whole else [False, True]):
        row = run(args, windowed)
        rows = [r for r in rows if (r["network"], r["P"], r["mode"]) !=
                (row["network"], row["P"], row["mode"])] + [row]
        store.parent.mkdir(parents=True, exist_ok=True)
        write_text(store, json.dumps(rows, indent=1), "the results store")
        print(json.dumps(row), flush=True)
    # the record holds every row stored: with --report, the runs of every work directory
    publish(args, "windows", "Partitioner: networks larger than memory",
            "Command: `python scripts/bench/bench_windows.py NETWORK -P P --memory-limit "
            "LIMIT --time-limit T --jobs J` (the header of each row).\n\n" + render(rows),
            area="Partitioning", rows=summary,
            command="python scripts/bench/bench_windows.py NETWORK -P P --memory-limit LIMIT "
                    "--time-limit T --jobs J")


if __name__ == "__main__":
    main()
