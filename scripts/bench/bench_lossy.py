"""The lossy options on MNIST, side by side with exact training in one run.

    python scripts/bench/bench_lossy.py [--only compress|critical] [--epochs 5] [--rounds 2]
                                  [--no-write]

Network: the MNIST MLP of docs/BENCHMARKS.md (784 -> 1024 -> 1024 -> 10, fan-in 32, float32),
``--batch-size 64 --lr 0.05 --momentum 0.9 --weight-decay 1e-5``, seed 0; needs
../shared/data/mnist.

- compress: grids 1 x 2 (``--replicas 2``) and 2 x 2 (a 2-part hypergraph plan, ``--replicas
  2``; 4 ranks oversubscribe this 2-core machine: accuracy and bytes, not time), exact and
  every compressor at ratio 0.01 and ``hylo`` (2 bits per value): final test accuracy,
  gradient-sum bytes (indices included, all ranks, all epochs) and the achieved ratio.
- critical: one process, full training against ``--critical-set 0.5 --refresh 2``, ``--rounds``
  interleaved rounds: the training seconds until the test accuracy first reaches 97% (median
  over rounds), and the final accuracy.

Writes docs/BENCHMARKS.md, sections "Compressed gradient sums" and "Critical-set training".
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHARED, number, parser, publish, run_job, summary_row, table  # noqa: E402

BIN = Path(sys.executable).parent
MNIST = SHARED / "mnist"
COMPRESSORS = ("none", "topk:0.01", "dgc:0.01", "sidco:0.01:exp", "sidco:0.01:gamma",
               "sidco:0.01:gpareto", "hylo")
COMMON = ["--data", f"mnist:{MNIST}", "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9",
          "--weight-decay", "1e-5", "--seed", "0"]


def spdnn(ranks: int, args: list[str], metrics: Path) -> dict:
    return run_job(args, ranks, metrics=metrics).metrics


def compress(tmp: Path, epochs: int) -> str:
    net, plan = tmp / "mlp.npz", tmp / "plan2.npz"
    subprocess.run([str(BIN / "spdnn-partition"), str(net), "-P", "2", "-o", str(plan)],
                   check=True, capture_output=True)
    rows = []
    for grid, ranks, extra in (("1x2", 2, []), ("2x2", 4, ["--plan", str(plan)])):
        exact_acc = exact_bytes = None
        for spec in COMPRESSORS:
            m = spdnn(ranks, ["train", "--network", str(net), "--replicas", "2",
                              "--epochs", str(epochs), "--compress", spec, *extra, *COMMON],
                      tmp / "m.json")
            ep = m["epochs"]
            acc = ep[-1]["test_accuracy"]
            mb = sum(e["gradient_megabytes"] for e in ep)
            if spec == "none":
                exact_acc, exact_bytes = acc, mb
            ratio = ep[-1]["compression_ratio"]
            sel = sum(e["select_seconds"] for e in ep)
            rows.append([grid, spec, f"{acc:.4f}", f"{100 * (acc - exact_acc):+.2f}",
                         f"{mb:,.1f}", f"{exact_bytes / mb:.0f}x" if spec != "none" else "1x",
                         f"{ratio:.4f}" if ratio is not None else "-", f"{sel:.1f}",
                         f"{sum(e['seconds'] for e in ep):.0f}"])
            print(" | ".join(rows[-1]), flush=True)
    return (f"Command: `python scripts/bench/bench_lossy.py --only compress --epochs {epochs}`; "
            f"{epochs} epochs, {' '.join(COMMON[2:])}. `points`: test accuracy minus exact "
            "training's on the same grid; `MB`: gradient-sum bytes of all ranks and epochs "
            "(positions counted); `ratio`: values sent / values, last epoch (hylo: the share of "
            "nonzero 2-bit codes; every value travels); `selection s`: "
            "the slowest rank's selection time (hylo: quantisation), all epochs.\n\n"
            + table(["grid", "--compress", "test accuracy", "points", "MB", "fewer bytes",
                     "ratio", "selection s", "train s"], rows))


def critical(tmp: Path, epochs: int, rounds: int) -> str:
    net = tmp / "mlp.npz"
    runs: dict[str, list[list[dict]]] = {"full": [], "critical": []}
    for _ in range(rounds):
        for name, extra in (("full", []), ("critical", ["--critical-set", "0.5",
                                                        "--refresh", "2"])):
            m = spdnn(1, ["train", "--network", str(net), "--epochs", str(epochs), *extra,
                          *COMMON], tmp / "m.json")
            runs[name].append(m["epochs"])

    def reach(ep: list[dict]) -> float | None:
        total = 0.0
        for e in ep:
            total += e["seconds"]
            if e["test_accuracy"] >= 0.97:
                return total
        return None

    rows, summary = [], {}
    for name, all_runs in runs.items():
        times = [reach(ep) for ep in all_runs]
        got = [t for t in times if t is not None]
        summary[name] = (statistics.median(got) if len(got) == len(times) else None,
                         statistics.median(ep[-1]["test_accuracy"] for ep in all_runs))
    for k in range(epochs):
        row = [str(k + 1)]
        for name in runs:
            ep = runs[name][0][k]
            cum = sum(e["seconds"] for e in runs[name][0][:k + 1])
            row += [f"{ep['test_accuracy']:.4f}", f"{ep['samples']:,}", f"{cum:.1f}"]
        rows.append(row)
    tf, tc = summary["full"][0], summary["critical"][0]
    speed = f"{tf / tc:.2f}x" if tf and tc else "not reached by both"
    line = (f"Time to 97% test accuracy (median of {rounds} rounds): full "
            f"{tf if tf is None else f'{tf:.1f} s'}, critical set "
            f"{tc if tc is None else f'{tc:.1f} s'}: **{speed}** less time. Final accuracy "
            f"(median): full {summary['full'][1]:.4f}, critical set "
            f"{summary['critical'][1]:.4f} "
            f"({100 * (summary['critical'][1] - summary['full'][1]):+.2f} points).")
    print(line)
    return (f"Command: `python scripts/bench/bench_lossy.py --only critical --epochs {epochs} "
            f"--rounds {rounds}`; one process, {' '.join(COMMON[2:])}; the two runs "
            "alternate within each round. Per epoch (first round): test accuracy, samples "
            "trained, cumulative training seconds (evaluation excluded).\n\n"
            + table(["epoch", "full: accuracy", "full: samples", "full: s",
                     "critical 0.5: accuracy", "critical 0.5: samples", "critical 0.5: s"], rows)
            + "\n\n" + line + "\n\n"
            + table(["median of the rounds", "full", "critical 0.5, refresh 2"],
                    [["seconds to 97% test accuracy", "-" if tf is None else f"{tf:.1f}",
                      "-" if tc is None else f"{tc:.1f}"],
                     ["final test accuracy", f"{summary['full'][1]:.4f}",
                      f"{summary['critical'][1]:.4f}"]]))


def compress_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each compressor's accuracy and bytes against exact gradient sums on the same grid."""
    rows = []
    for r in tables[0]:
        if r["--compress"] == "none":
            continue
        exact = next(e for e in tables[0] if e["grid"] == r["grid"] and e["--compress"] == "none")
        rows.append(summary_row(
            f"MNIST MLP, {r['grid']}, --compress {r['--compress']} (test accuracy; MB)",
            f"{r['test accuracy']}; {r['MB']}", f"{exact['test accuracy']}; {exact['MB']} "
            "(exact sums)", f"{r['points']} points, {r['fewer bytes']} fewer bytes"))
    return rows


def critical_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The critical set's time to 97% and final accuracy against full epochs."""
    reach, final = tables[-1]
    critical = "critical 0.5, refresh 2"
    speed = (f"{number(reach['full']) / number(reach[critical]):.2f}x less time"
             if "-" not in (reach["full"], reach[critical]) else "not reached by both")
    return [summary_row("MNIST MLP, critical set 0.5 (s to 97% test accuracy; final accuracy)",
                        f"{reach[critical]} s; {final[critical]}",
                        f"{reach['full']} s; {final['full']} (every sample, every epoch)",
                        f"{speed}, "
                        f"{100 * (number(final[critical]) - number(final['full'])):+.2f} points")]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--only", choices=["compress", "critical"])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not (MNIST / "train-images-idx3-ubyte.gz").is_file():
        raise SystemExit(f"needs MNIST in {MNIST}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        subprocess.run([str(BIN / "spdnn"), "generate", "random", "--sizes", "784,1024,1024",
                        "--fan-in", "32", "--head", "10", "--seed", "0", "-o",
                        str(tmp / "mlp.npz")], check=True, capture_output=True)
        if args.only in (None, "compress"):
            body = compress(tmp, args.epochs)
            publish(args, "compressed-sums", "Compressed gradient sums", body,
                    area="Compression and critical sets", rows=compress_summary)
        if args.only in (None, "critical"):
            body = critical(tmp, args.epochs, args.rounds)
            publish(args, "critical-set", "Critical-set training", body,
                    area="Compression and critical sets", rows=critical_summary)


if __name__ == "__main__":
    main()
