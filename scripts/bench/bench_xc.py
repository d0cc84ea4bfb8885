"""The extreme-classification step (issue 50 item 3): spdnn's exact training step against
PyTorch's full-softmax step, side by side in interleaved rounds, then one exact and one
``--lsh`` run of whole epochs with their test P@1.

    python scripts/bench/bench_xc.py [--labels 50000] [--samples 20000] [--steps 40]
                                     [--rounds 3] [--epochs 2] [--lsh 2:6:50]
                                     [--lr 0.1] [--torch PYTHON] [--no-write]

Task: ``spdnn generate xc-data`` with 20,000 features and ``--labels`` labels (seed 0; 40
features and 3 labels a sample); network 20,000 -> 128 -> labels (``spdnn generate random
--fan-in 4096,128``: a sparse input layer, a full output layer), float32, batch 128, momentum
0.9, seed 0, one thread. A round runs ``spdnn train`` for N + 3 steps and for 3 (steps 4 to
N + 3: their training seconds, evaluation excluded) and scripts/bench/torch_xc.py (PyTorch's
fastest form known here: the input layer as an ``EmbeddingBag``, its gradient dense and
sparse in turn with the faster kept, the output as ``F.linear``, the loss as log-sum-exp
minus the label logits; the median of N steps after 3 warm-up steps), one after the other.
The epochs: ``--epochs``
epochs exact, then with ``--lsh`` (``--lsh-random 200 --lsh-top-bias 100 --rehash 50``).
Writes docs/BENCHMARKS.md, section "Extreme classification: the exact step and LSH".
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
from harness import ROOT, Rounds, number, parser, publish, run_job, summary_row, table  # noqa: E402

BIN = Path(sys.executable).parent
FEATURES = 20_000
BATCH = 128
WARM = 3  # warm-up steps left out of both measures


def run(cmd: list[str], env: dict | None = None) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"bench_xc: {' '.join(cmd[:3])} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def train(args: list[str], metrics: Path) -> list[dict]:
    return run_job(["train", *args], metrics=metrics).metrics["epochs"]


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The exact step against PyTorch's full softmax; LSH training against exact."""
    steps, training = tables[0], tables[1]
    ours, torch = steps[0], next(r for r in steps if r["step"].startswith("PyTorch"))
    exact = next(r for r in training if r["training"] == "exact")
    rows = [summary_row("extreme classification step, exact (ms, median)",
                        ours["ms (median)"], f"{torch['ms (median)']} ({torch['step']})",
                        f"{number(torch['ms (median)']) / number(ours['ms (median)']):.2f}x "
                        "faster")]
    rows += [summary_row(f"extreme classification, {r['training']} (ms per step; final P@1)",
                         f"{r['ms/step']}; {r['P@1 per epoch'].split(' / ')[-1]}",
                         f"{exact['ms/step']}; {exact['P@1 per epoch'].split(' / ')[-1]} "
                         "(exact)", f"{number(exact['ms/step']) / number(r['ms/step']):.1f}x "
                         "faster")
             for r in training if r is not exact]
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--labels", type=int, default=50_000)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--steps", type=int, default=40, help="steps timed in a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the exact and LSH runs "
                    "(0: none)")
    ap.add_argument("--lsh", default="2:6:50")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--torch", default=str(ROOT / ".venv-torch" / "bin" / "python"))
    args = ap.parse_args()
    if not Path(args.torch).exists():
        raise SystemExit(f"bench_xc: no Python with torch at {args.torch} (--torch; "
                         "scripts/bench/bench_network.py's docstring says how to make one)")
    common = ["--batch-size", str(BATCH), "--momentum", "0.9", "--seed", "0", "--lr",
              str(args.lr)]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data, net = tmp / "xc", tmp / "net.npz"
        run([str(BIN / "spdnn"), "generate", "xc-data", "--samples", str(args.samples),
             "--test-samples", str(max(args.samples // 10, 1)), "--features", str(FEATURES),
             "--labels", str(args.labels), "-o", str(data)])
        run([str(BIN / "spdnn"), "generate", "random", "--sizes",
             f"{FEATURES},128,{args.labels}", "--fan-in", "4096,128", "-o", str(net)])
        base = ["--network", str(net), "--data", f"xc:{data}", *common]
        torch_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        steps = Rounds()
        for r in range(args.rounds):
            # steps 4 to N + 3 of a run: a run of N + 3 steps less one of 3 (PyTorch's
            # measure leaves 3 warm-up steps out too); the mean of all N + 3 beside it
            warm = train([*base, "--max-steps", str(WARM)], tmp / "m.json")[-1]["seconds"]
            ep = train([*base, "--max-steps", str(args.steps + WARM)], tmp / "m.json")[-1]
            steps.add("spdnn", 1000 * (ep["seconds"] - warm) / args.steps)
            steps.add("spdnn-all", 1000 * ep["seconds"] / ep["epoch_steps"])
            best = None  # both forms of the input layer's gradient: the faster
            for form in ("dense", "sparse"):
                out = run([args.torch, str(ROOT / "scripts" / "bench" / "torch_xc.py"),
                           str(net), str(data), "--batch-size", str(BATCH), "--lr",
                           str(args.lr), "--momentum", "0.9", "--steps", str(args.steps),
                           "--embedding-grad", form], torch_env)
                step = json.loads(out.strip().splitlines()[-1])["seconds_per_step"]
                best = step if best is None else min(best, step)
            steps.add("torch", 1000 * best)
            print(f"round {r + 1}: spdnn {steps.values['spdnn'][-1]:.1f} ms, PyTorch "
                  f"{steps.values['torch'][-1]:.1f} ms", flush=True)
        epochs = {}
        if args.epochs:
            lsh = ["--lsh", args.lsh, "--lsh-random", "200", "--lsh-top-bias", "100",
                   "--rehash", "50"]
            for mode, extra in (("exact", []), (f"--lsh {args.lsh}", lsh)):
                epochs[mode] = train([*base, "--epochs", str(args.epochs), *extra],
                                     tmp / "e.json")
    med = steps.median()
    rows = [[name, f"{med[key]:.1f}", " / ".join(f"{v:.1f}" for v in steps.values[key]),
             f"{med['spdnn'] / med[key]:.2f}"]
            for name, key in (("spdnn, exact (after 3 warm-up steps)", "spdnn"),
                              ("spdnn, exact (every step of the run)", "spdnn-all"),
                              ("PyTorch, full softmax", "torch"))]
    body = (f"Command: `python scripts/bench/bench_xc.py --labels {args.labels} --samples "
            f"{args.samples} --steps {args.steps} --rounds {args.rounds} --epochs "
            f"{args.epochs} --lsh {args.lsh} --lr {args.lr}`. Task: {FEATURES:,} features -> "
            f"128 -> {args.labels:,} labels (a sparse input layer of fan-in 4,096, a full "
            f"output layer), float32, batch {BATCH}, lr {args.lr}, momentum 0.9, one thread; "
            "spdnn: the mean of steps 4 to N + 3 (a run of N + 3 steps less a run of 3; "
            "beside it the mean of every step of the longer run, its start-up included), "
            "PyTorch: the median of N steps after 3 warm-up steps (scripts/bench/torch_xc.py:"
            " the faster of the input layer's dense and sparse gradients, each round). Rounds "
            "interleaved; "
            "the medians.\n\n"
            + table(["step", "ms (median)", "ms per round", "spdnn / this"], rows))
    summary = f"\n\nspdnn's exact step is **{med['spdnn'] / med['torch']:.2f}x** PyTorch's."
    if epochs:
        erows = []
        for mode, ep in epochs.items():
            secs = sum(e["seconds"] for e in ep)
            erows.append([mode, " / ".join(f"{e['seconds']:.1f}" for e in ep),
                          f"{1000 * secs / sum(e['epoch_steps'] for e in ep):.1f}",
                          " / ".join(f"{e['precision_at_1']:.4f}" for e in ep),
                          f"{ep[-1].get('active_outputs') or args.labels:,.0f}"])
        exact, lsh_ep = (sum(e["seconds"] for e in ep) for ep in epochs.values())
        gap = 100 * (list(epochs.values())[1][-1]["precision_at_1"]
                     - list(epochs.values())[0][-1]["precision_at_1"])
        body += ("\n\nWhole epochs (training seconds, evaluation excluded; P@1 on the test "
                 "split, exact):\n\n"
                 + table(["training", "epoch s", "ms/step", "P@1 per epoch", "active"], erows))
        summary += (f" `--lsh {args.lsh}` trains an epoch **{exact / lsh_ep:.1f}x** faster "
                    f"than exact training; P@1 after {args.epochs} epochs {gap:+.1f} points.")
    body += summary
    publish(args, "xc-step", "Extreme classification: the exact step and LSH", body,
            area="Extreme classification", rows=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
