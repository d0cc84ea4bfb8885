"""Which grid wins: at P = 2, 2 model parts x 1 replica against 1 part x 2 replicas, side by
side in one run, and at P = 4 the values per step of 4x1, 2x2 and 1x4.

    python scripts/bench/bench_grid.py [--batches 32 256] [--samples 2048] [--rounds 2]

Networks (float32): the MNIST MLP 784-1024-1024-10 (fan-in 32, dense head) on MNIST from
../shared (synthetic inputs when it is absent, first 8,192 samples), `random` 4096 -> 16384 x 3
(fan-in 32, 10-way head) and the first 3 RadiX-Net layers of 16,384 neurons (+ head), both on
--samples synthetic samples. Plans: hypergraph for the MLP and RadiX-Net, block for `random`
(the hypergraph plan equals block there: docs/BENCHMARKS.md, "Training"). Per configuration the
second epoch's seconds (median over --rounds) and the values per training step on each axis
from `spdnn.model.plan.step_values` (the test suite checks them equal to the runtime's counts on
every grid; the counts of a run also hold evaluation passes): the model axis moves volume x B values
(expand + fold), the data axis sums nnz(W) + biases per replica and sends 2 (R - 1) / R of that
per rank (ring all-reduce). P = 4 is not timed (2 cores). Writes docs/BENCHMARKS.md ("Grids").
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHARED, parser, publish, run_job, summary_row, table  # noqa: E402

from partition.methods import partition_network  # noqa: E402
from spdnn.io.bundle import save_network  # noqa: E402
from spdnn.io.planfile import save_plan  # noqa: E402
from spdnn.model.generate import add_head, radixnet, random_network  # noqa: E402
from spdnn.model.plan import network_patterns, plan_statistics, step_values

BIN = Path(sys.executable).parent


def networks(samples: int, work: Path) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    mlp = random_network([784, 1024, 1024], 32, seed=0, head=10)
    if (SHARED / "mnist").is_dir():
        out["mnist-mlp"] = (mlp, f"mnist:{SHARED / 'mnist'}", "hypergraph")
    else:
        np.savez(work / "mlp.npz", x_train=rng.random((8192, 784)).astype(np.float32),
                 y_train=rng.integers(0, 10, 8192))
        out["mlp (synthetic data)"] = (mlp, f"npz:{work / 'mlp.npz'}", "hypergraph")
    for name, net, method in (
            ("random-16384x3", random_network([4096, 16384, 16384, 16384], 32, seed=0,
                                              head=10), "block"),
            ("radixnet-16384x3", add_head(radixnet(16384, 3, seed=0), 10), "hypergraph")):
        np.savez(work / f"{name}-data.npz",
                 x_train=rng.standard_normal((samples, net.sizes[0])).astype(np.float32),
                 y_train=rng.integers(0, 10, samples))
        out[name] = (net, f"npz:{work / f'{name}-data.npz'}", method)
    return out


def run(work: Path, name: str, data: str, batch: int, parts: int, replicas: int) -> dict:
    arguments = ["train", "--network", str(work / f"{name}.npz"), "--data", data, "--epochs",
                 "2", "--batch-size", str(batch), "--lr", "0.01", "--momentum", "0.9",
                 "--replicas", str(replicas)]
    if parts > 1:
        arguments += ["--plan", str(work / f"{name}-{parts}.npz")]
    return run_job(arguments, parts * replicas, metrics=work / "m.json").metrics


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Two model parts against two replicas, each network and batch, epoch time."""
    return [summary_row(f"{r['network']}, batch {r['batch']}, P = 2 (s per epoch)",
                        f"{r['2x1 s/epoch']} (2 parts x 1)", f"{r['1x2 s/epoch']} (1 part x 2)",
                        f"faster: {r['faster']}")
            for r in tables[0]]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rows, rows4 = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, (net, data, method) in networks(args.samples, work).items():
            save_network(net, work / f"{name}.npz")
            patterns = network_patterns(net)
            stats = {}
            for parts in (2, 4):
                plan = partition_network(patterns, parts, method=method, seed=0,
                                         fingerprint=net.fingerprint())
                save_plan(plan, work / f"{name}-{parts}.npz")
                stats[parts] = plan_statistics(patterns, plan.owners, parts=parts)
            single = [np.zeros(n, np.int32) for n in net.sizes]
            stats[1] = plan_statistics(patterns, single, parts=1)
            nnz = [layer.nnz for layer in net.layers]
            for batch in args.batches:
                seconds: dict[tuple[int, int], list[float]] = {}
                for _ in range(args.rounds):
                    for parts, replicas in ((2, 1), (1, 2)):
                        m = run(work, name, data, batch, parts, replicas)
                        seconds.setdefault((parts, replicas), []).append(
                            m["epochs"][1]["seconds"])
                med = {g: statistics.median(s) for g, s in seconds.items()}
                win = "2 parts x 1" if med[(2, 1)] < med[(1, 2)] else "1 part x 2"
                model = step_values(stats[2], nnz, net.sizes[1:], 1, batch)
                data_axis = step_values(stats[1], nnz, net.sizes[1:], 2, batch)
                rows.append([name, str(batch), f"{med[(2, 1)]:.2f}", f"{med[(1, 2)]:.2f}",
                             f"{sum(model.expand) + sum(model.fold):,}",
                             f"{sum(data_axis.gradient_sent):,.0f}", win])
                for parts, replicas in ((4, 1), (2, 2), (1, 4)):
                    v = step_values(stats[parts], nnz, net.sizes[1:], replicas, batch)
                    rows4.append([name, str(batch), f"{parts}x{replicas}",
                                  f"{sum(v.expand) + sum(v.fold):,}",
                                  f"{sum(v.gradient_in):,}", f"{sum(v.gradient_sent):,.0f}"])
                print(rows[-1], flush=True)
    body = ("Command: `python scripts/bench/bench_grid.py --batches "
            f"{' '.join(map(str, args.batches))}"
            f" --samples {args.samples} --rounds {args.rounds}` (P = 2 timed side by side: "
            "seconds of the second epoch, median over the rounds; values per step from "
            "spdnn.model.plan.step_values, equal to the runtime's counts).\n\n"
            + table(["network", "batch", "2x1 s/epoch", "1x2 s/epoch",
                     "2x1 values/step (expand + fold)", "1x2 values/step (gradient sum sent)",
                     "faster"], rows)
            + "\n\nP = 4 (parts x replicas), values per step (predicted; equal to the runtime's "
              "counts in tests/test_replicas_mpi.py):\n\n"
            + table(["network", "batch", "grid", "model axis (expand + fold)",
                     "gradient sum in", "gradient sum sent (ring)"], rows4))
    publish(args, "bench-grid", "Grids: model parts x replicas", body,
            area="Exchange and grids", rows=summary)


if __name__ == "__main__":
    main()
