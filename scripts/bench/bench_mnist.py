"""MNIST with a sparse MLP: test accuracy per epoch at 1 and 2 ranks, against the serial
reference engine on the same network, batches and seed.

    python scripts/bench/bench_mnist.py [--epochs 5] [--work DIR] [--no-write]
    python scripts/bench/bench_mnist.py --dtypes [--epochs 5] [--ranks 1 2 4]

The network is `spdnn generate random --sizes 784,1024,1024 --fan-in 32 --head 10 --seed 0`;
training is SGD (lr 0.05, momentum 0.9, weight decay 1e-5), batch 64, float32, on the MNIST
under ../shared/data/mnist (the script stops with a message when it is absent). P = 2 runs
under a hypergraph plan (`spdnn-partition -P 2`). ``--dtypes``: the same training in float32
and in bfloat16 at every P of ``--ranks`` (hypergraph plans): the test accuracy after each
epoch and the bytes the ranks sent per training step (``--metrics-out``), side by side.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    parser,
    publish,
    run_job,
    shared_mnist,
    spdnn_tool,
    summary_row,
    table,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPDNN_THREADS": "1"}
SGD = ["--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-5", "--batch-size", "64"]


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    last = tables[0][-1]
    one, two = last["test accuracy, 1 process"], last["test accuracy, `mpirun -n 2`"]
    same = abs(float(one) - float(two)) < 0.005
    return [summary_row(
        f"MNIST, 784-1024-1024-10 (fan-in 32), {last['epoch']} epochs: test accuracy",
        f"{one} (1 process); {two} (mpirun -n 2)",
        f"{last['test accuracy, serial reference']} (the serial reference engine)",
        "same accuracy at P = 1 and 2" if same else "accuracy differs by P")]


def reference_accuracies(net_file: Path, data_dir: Path, epochs: int) -> list[float]:
    """The serial reference engine's test accuracy after each epoch."""
    from spdnn import reference
    from spdnn.io.bundle import load_network
    from spdnn.io.loaders import load_dataset
    from spdnn.optim import SGDConfig

    net = load_network(net_file)
    data = load_dataset(f"mnist:{data_dir}", "float32")
    got: list[float] = []
    reference.train(net, data, epochs, 64, SGDConfig(lr=0.05, momentum=0.9, weight_decay=1e-5),
                    seed=0, on_epoch=lambda r: got.append(float(r.test_accuracy)))
    return got


def sent_per_step(metrics: dict) -> tuple[float, float]:
    """Bytes all ranks sent per training step, forward and backward (the evaluations' forward
    passes included)."""
    counted = metrics["traffic"]["counted"]
    steps = metrics["epochs"][-1]["steps"]
    return sum(counted["forward_sent"]) / steps, sum(counted["backward_sent"]) / steps


def value_types(args, mnist: Path, work: Path) -> str:  # noqa: ANN001
    """float32 and bfloat16 trainings side by side at every P: accuracy and bytes."""
    net = work / "mnistnet.npz"
    spdnn_tool("spdnn", "generate", "random", "--sizes", "784,1024,1024", "--fan-in", "32",
               "--head", "10", "--seed", "0", "-o", net, env=ENV)
    accuracy, traffic = [], []
    for p in args.ranks:
        plan = work / f"mnist-p{p}.npz"
        if p > 1:
            spdnn_tool("spdnn-partition", net, "-P", str(p), "-o", plan, env=ENV)
        got = {}
        for dtype in ("float32", "bfloat16"):
            cmd = ["train", "--network", str(net), "--data", f"mnist:{mnist}", "--epochs",
                   str(args.epochs), *SGD, "--dtype", dtype]
            got[dtype] = run_job(cmd + (["--plan", str(plan)] if p > 1 else []), p,
                                 metrics=work / f"m{p}-{dtype}.json", env=ENV).metrics
        f32, bf16 = (got[d]["epochs"] for d in ("float32", "bfloat16"))
        for e in range(args.epochs):
            accuracy.append([str(p), str(e + 1), f"{f32[e]['test_accuracy']:.4f}",
                             f"{bf16[e]['test_accuracy']:.4f}",
                             f"{100 * (bf16[e]['test_accuracy'] - f32[e]['test_accuracy']):+.2f}",
                             f"{f32[e]['samples_per_second']:,.0f} / "
                             f"{bf16[e]['samples_per_second']:,.0f}"])
            print(" | ".join(accuracy[-1]), flush=True)
        if p > 1:
            (ff, fb), (bf, bb) = (sent_per_step(got[d]) for d in ("float32", "bfloat16"))
            traffic.append([str(p), f"{ff / 1e3:,.1f} / {fb / 1e3:,.1f}",
                            f"{bf / 1e3:,.1f} / {bb / 1e3:,.1f}", f"{bf / ff:.3f}",
                            f"{bb / fb:.3f}", f"{(bf + bb) / (ff + fb):.3f}"])
            print(" | ".join(traffic[-1]), flush=True)
    return ("Command: `python scripts/bench/bench_mnist.py --dtypes --epochs "
            f"{args.epochs} --ranks {' '.join(map(str, args.ranks))}`. `spdnn train --network "
            "mnistnet.npz --data mnist:../shared/data/mnist " + " ".join(SGD) + " --dtype "
            "float32|bfloat16`, hypergraph plans (`spdnn-partition -P P`), one thread per "
            "rank (P = 4 oversubscribes 2 cores: its bytes, not its speed). Rows travel as "
            "each type's default: float32's `--exchange auto` packs the zeros of ReLU's "
            "outputs and of its slope; bfloat16 sends dense 16-bit rows forward and float32 "
            "partial sums backward (the folds are float32 sums: rounding them would make "
            "the result depend on P).\n\n"
            + table(["P", "epoch", "test accuracy, float32", "test accuracy, bfloat16",
                     "bfloat16 - float32 (points)", "samples/s, float32 / bfloat16"],
                    accuracy)
            + "\n\nBytes all ranks sent per training step (kB; the evaluations' forward "
            "passes included), forward / backward:\n\n"
            + table(["P", "float32 (kB)", "bfloat16 (kB)", "forward, bfloat16 / float32",
                     "backward, bfloat16 / float32", "total, bfloat16 / float32"], traffic))


def dtype_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    accuracy, traffic = tables
    last = [r for r in accuracy if r["epoch"] == max(r["epoch"] for r in accuracy)]
    rows = [summary_row(f"MNIST, 784-1024-1024-10, {r['epoch']} epochs, P = {r['P']}: test "
                        "accuracy, bfloat16", r["test accuracy, bfloat16"],
                        f"{r['test accuracy, float32']} (float32)",
                        f"{r['bfloat16 - float32 (points)']} points") for r in last]
    rows += [summary_row(f"MNIST training, P = {r['P']}: bytes sent a step, bfloat16 (kB, "
                         "forward / backward)", r["bfloat16 (kB)"], f"{r['float32 (kB)']} "
                         "(float32)", f"{r['total, bfloat16 / float32']}x in total")
             for r in traffic]
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--dtypes", action="store_true",
                    help="float32 and bfloat16 side by side (its own record)")
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4], help="with --dtypes")
    args = ap.parse_args()
    mnist = shared_mnist()
    if args.dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            work = args.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            body = value_types(args, mnist, work)
        publish(args, "mnist-bfloat16", "MNIST in bfloat16", body, area="Training",
                rows=dtype_summary)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        net, plan = work / "mnistnet.npz", work / "mnist-p2.npz"
        spdnn_tool("spdnn", "generate", "random", "--sizes", "784,1024,1024", "--fan-in", "32",
                   "--head", "10", "--seed", "0", "-o", net, env=ENV)
        spdnn_tool("spdnn-partition", net, "-P", "2", "-o", plan, env=ENV)
        common = ["train", "--network", str(net), "--data", f"mnist:{mnist}", "--epochs",
                  str(args.epochs), *SGD]
        jobs = {p: run_job(common + (["--plan", str(plan)] if p > 1 else []), p,
                           metrics=work / f"m{p}.json", env=ENV) for p in (1, 2)}
        ref = reference_accuracies(net, mnist, args.epochs)
    rows = []
    for e in range(args.epochs):
        one, two = (jobs[p].metrics["epochs"][e] for p in (1, 2))
        rows.append([str(e + 1), f"{one['test_accuracy']:.4f}", f"{two['test_accuracy']:.4f}",
                     f"{ref[e]:.4f}",
                     f"{one['samples_per_second']:,.0f} / {two['samples_per_second']:,.0f}"])
        print(" | ".join(rows[-1]), flush=True)
    body = ("Command: `python scripts/bench/bench_mnist.py --epochs " + str(args.epochs)
            + "`. `spdnn train --network mnistnet.npz --data mnist:../shared/data/mnist "
            + " ".join(SGD) + "` on 1 process and under `mpirun -n 2 ... --plan mnist-p2.npz` "
            "(`spdnn-partition -P 2`); the serial reference engine (`spdnn.reference.train`) "
            "on the same network, seed and batches. float32, one thread per rank.\n\n"
            + table(["epoch", "test accuracy, 1 process", "test accuracy, `mpirun -n 2`",
                     "test accuracy, serial reference", "samples/s, 1 / 2 ranks"], rows))
    publish(args, "mnist-mlp", "MNIST with a sparse MLP", body, area="Training", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
