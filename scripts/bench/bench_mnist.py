"""MNIST with a sparse MLP: test accuracy per epoch at 1 and 2 ranks, against the serial
reference engine on the same network, batches and seed.

    python scripts/bench/bench_mnist.py [--epochs 5] [--work DIR] [--no-write]

The network is `spdnn generate random --sizes 784,1024,1024 --fan-in 32 --head 10 --seed 0`;
training is SGD (lr 0.05, momentum 0.9, weight decay 1e-5), batch 64, float32, on the MNIST
under ../shared/data/mnist (the script stops with a message when it is absent). P = 2 runs
under a hypergraph plan (`spdnn-partition -P 2`).
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


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    mnist = shared_mnist()
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
