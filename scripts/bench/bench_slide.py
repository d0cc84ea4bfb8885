"""LSH-selected output neurons (``--lsh``, SLIDE) against exact training and PyTorch, on a
synthetic extreme-classification task, side by side in one run.

    python scripts/bench/bench_slide.py [--samples 20000] [--test-samples 2000] [--epochs 2]
                                  [--lsh 2:6:50] [--lsh-random 200] [--lsh-top-bias 100]
                                  [--rehash 50] [--lr 0.1] [--high-lr 0.5] [--high-rehash 20]
                                  [--high-random N]
                                  [--torch PYTHON] [--no-write]

Task: ``spdnn generate xc-data`` with 100,000 features and 200,000 labels (seed 0); network
features -> 128 -> labels (``spdnn generate random --fan-in 4096,128``: a sparse input layer,
each hidden neuron reading 4,096 features, and a full output layer of 25.6 M weights), float32,
batch 64, lr 0.1 (--lr), momentum 0.9, seed 0. Runs, one after the other: 1 rank,
2 ranks as 2 parts x 1 replica (block plan) and as 1 part x 2 replicas, each exact and with
``--lsh``; the test P@1 and P@5 after every epoch are exact (every neuron). PyTorch
(scripts/bench/torch_xc.py, ``--torch`` names a Python with torch; its input layer's gradient
dense and sparse, the faster kept): the median full-softmax step at
one thread. ``--high-lr``: also, on one rank, exact training and ``--lsh`` at that rate, the
latter with and without ``--lsh-estimate-tail`` (and ``--rehash`` from ``--high-rehash``,
``--lsh-random`` from ``--high-random``, by default --lsh-random's).
Writes docs/BENCHMARKS.md, section "LSH-selected output neurons".
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, number, parser, publish, run_job, summary_row, table  # noqa: E402

BIN = Path(sys.executable).parent
COMMON = ["--batch-size", "64", "--momentum", "0.9", "--seed", "0"]


def run(cmd: list[str], env: dict | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return proc.stdout


def train(ranks: int, args: list[str], metrics: Path) -> list[dict]:
    print(f"{ranks} rank(s): spdnn train {' '.join(args[-12:])}", flush=True)
    return run_job(["train", *args], ranks, metrics=metrics,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}).metrics["epochs"]


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """LSH-selected training against the exact step on the same grid: step time, P@1."""
    rows = []
    for exact in (r for r in tables[0] if r["training"] == "exact"):
        for lsh in (r for r in tables[0] if r["grid"] == exact["grid"] and r is not exact):
            rows.append(summary_row(
                f"{exact['grid']}, {lsh['training']} (ms per step; final P@1)",
                f"{lsh['ms/step']}; {lsh['P@1 per epoch'].split(' / ')[-1]}",
                f"{exact['ms/step']}; {exact['P@1 per epoch'].split(' / ')[-1]} (exact)",
                f"{number(exact['ms/step']) / number(lsh['ms/step']):.1f}x faster"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--test-samples", type=int, default=2_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lsh", default="2:6:50")
    ap.add_argument("--lsh-random", type=int, default=200)
    ap.add_argument("--lsh-top-bias", type=int, default=100)
    ap.add_argument("--rehash", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--high-lr", type=float, default=None)
    ap.add_argument("--high-rehash", type=int, default=20)
    ap.add_argument("--high-random", type=int, default=None)
    ap.add_argument("--torch", default=str(ROOT / ".venv-torch" / "bin" / "python"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data, net, plan = tmp / "xc", tmp / "net.npz", tmp / "plan2.npz"
        run([str(BIN / "spdnn"), "generate", "xc-data", "--samples", str(args.samples),
             "--test-samples", str(args.test_samples), "--features", "100000", "--labels",
             "200000", "-o", str(data)])
        run([str(BIN / "spdnn"), "generate", "random", "--sizes", "100000,128,200000",
             "--fan-in", "4096,128", "-o", str(net)])
        run([str(BIN / "spdnn-partition"), str(net), "-P", "2", "--method", "block", "-o",
             str(plan), "--quiet"])
        common = [*COMMON, "--lr", str(args.lr)]
        base = ["--network", str(net), "--data", f"xc:{data}", "--epochs", str(args.epochs),
                *common]
        lsh = ["--lsh", args.lsh, "--lsh-random", str(args.lsh_random), "--lsh-top-bias",
               str(args.lsh_top_bias), "--rehash", str(args.rehash)]
        results: dict[tuple[str, str], list[dict]] = {}
        for grid, ranks, extra in (("1 rank", 1, []), ("2x1 (block plan)", 2,
                                                         ["--plan", str(plan)]),
                                   ("1x2", 2, ["--replicas", "2"])):
            for mode, more in (("exact", []), (f"--lsh {args.lsh}", lsh)):
                results[(grid, mode)] = train(ranks, base + extra + more, tmp / "m.json")
        if args.high_lr is not None:  # where the active-only softmax kills the hidden layer
            high = [*base[:base.index("--lr")], "--lr", str(args.high_lr)]
            grid = f"1 rank, lr {args.high_lr}"
            random = args.lsh_random if args.high_random is None else args.high_random
            tail = [*lsh[:lsh.index("--lsh-random")], "--lsh-random", str(random),
                    "--lsh-top-bias", str(args.lsh_top_bias), "--rehash", str(args.high_rehash),
                    "--lsh-estimate-tail"]
            for mode, more in (("exact", []), (f"--lsh {args.lsh}", lsh),
                               (f"--lsh {args.lsh} --lsh-random {random} --rehash "
                                f"{args.high_rehash} --lsh-estimate-tail", tail)):
                results[(grid, mode)] = train(1, high + more, tmp / "m.json")
        torch_step, torch_form = None, None
        if Path(args.torch).exists():  # both forms of the input layer's gradient: the faster
            torch_xc = ROOT / "scripts" / "bench" / "torch_xc.py"
            for form in ("dense", "sparse"):
                out = run([args.torch, str(torch_xc), str(net), str(data), "--batch-size",
                           "64", "--lr", str(args.lr), "--momentum", "0.9",
                           "--embedding-grad", form], {**os.environ, "OMP_NUM_THREADS": "1"})
                step = json.loads(out.strip().splitlines()[-1])["seconds_per_step"]
                if torch_step is None or step < torch_step:
                    torch_step, torch_form = step, form
    rows = []
    for (grid, mode), ep in results.items():
        steps = sum(e["epoch_steps"] for e in ep)
        secs = sum(e["seconds"] for e in ep)
        moved = sum(e["megabytes_sent"] + e["gradient_megabytes"] for e in ep) / steps
        active = ep[-1].get("active_outputs")
        rows.append([grid, mode, " / ".join(f"{e['seconds']:.1f}" for e in ep),
                     f"{1000 * secs / steps:.1f}",
                     " / ".join(f"{e['precision_at_1']:.4f}" for e in ep),
                     f"{ep[-1]['precision_at_5']:.4f}",
                     f"{active:,.0f}" if active is not None else "200,000",
                     f"{moved:.2f}"])
        print(" | ".join(rows[-1]), flush=True)
    one_exact = results[("1 rank", "exact")]
    one_lsh = results[("1 rank", f"--lsh {args.lsh}")]
    speed = sum(e["seconds"] for e in one_exact) / sum(e["seconds"] for e in one_lsh)
    gap = 100 * (one_lsh[-1]["precision_at_1"] - one_exact[-1]["precision_at_1"])
    step_exact = sum(e["seconds"] for e in one_exact) / sum(e["epoch_steps"] for e in one_exact)
    step_lsh = sum(e["seconds"] for e in one_lsh) / sum(e["epoch_steps"] for e in one_lsh)
    summary = (f"One rank: `--lsh {args.lsh}` trains an epoch **{speed:.1f}x** faster than "
               f"exact training; P@1 after {args.epochs} epochs {gap:+.1f} points against "
               "exact.")
    if torch_step is not None:
        summary += (f" PyTorch's full-softmax step (one thread; the faster form of its input "
                    f"layer's gradient, {torch_form}): {1000 * torch_step:.1f} ms, "
                    f"against spdnn's exact step {1000 * step_exact:.1f} ms "
                    f"({torch_step / step_exact:.2f}x) and its `--lsh` step "
                    f"{1000 * step_lsh:.1f} ms ({torch_step / step_lsh:.1f}x faster than "
                    "PyTorch).")
    if args.high_lr is not None:
        grid = f"1 rank, lr {args.high_lr}"
        ex, plain, est = (results[k] for k in results if k[0] == grid)
        summary += (f" At `--lr {args.high_lr}`: P@1 after {args.epochs} epochs "
                    f"{est[-1]['precision_at_1']:.4f} with `--lsh-estimate-tail` against "
                    f"{plain[-1]['precision_at_1']:.4f} without and exact's "
                    f"{ex[-1]['precision_at_1']:.4f}; its epoch "
                    f"{sum(e['seconds'] for e in ex) / sum(e['seconds'] for e in est):.1f}x "
                    "faster than exact.")
    body = (f"Command: `python scripts/bench/bench_slide.py --samples {args.samples} "
            f"--test-samples {args.test_samples} --epochs {args.epochs} --lsh {args.lsh} "
            f"--lsh-random {args.lsh_random} --lsh-top-bias {args.lsh_top_bias} "
            f"--rehash {args.rehash} --lr {args.lr}"
            + (f" --high-lr {args.high_lr} --high-rehash {args.high_rehash}"
               if args.high_lr is not None else "")
            + (f" --high-random {args.high_random}" if args.high_random is not None else "")
            + "`. Task: `spdnn generate xc-data` "
            "(100,000 features, 200,000 labels, seed 0); network features -> 128 -> labels "
            "(`--fan-in 4096,128`: sparse input layer, full output layer), float32, "
            f"{' '.join(common)}. One run each, one after the other. `epoch s`: training "
            "seconds per epoch (evaluation excluded); `ms/step`: "
            "over all epochs, table rebuilds included; P@k on the test split, exact (every "
            "neuron); `active`: output neurons computed per sample (all ranks); `MB/step`: "
            "exchange between parts plus gradient sums between replicas, all ranks.\n\n"
            + table(["grid", "training", "epoch s", "ms/step", "P@1 per epoch", "P@5",
                     "active", "MB/step"], rows) + "\n\n" + summary)
    print(summary)
    publish(args, "slide", "LSH-selected output neurons", body, area="Extreme classification",
            rows=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
