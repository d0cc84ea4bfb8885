"""Each rank's memory, predicted against measured, on the validation networks (issue 48).

    python scripts/bench/bench_memory.py [--networks mlp random radixnet] [--ranks 1 2 4]
                                   [--work DIR] [--no-write]

Networks (float32, a dense 10-way head): `mlp`, 784 -> 1024 -> 1024 (fan-in 32); `random`,
4096 -> 16384 x 3 (fan-in 32); `radixnet`, the first 3 RadiX-Net layers of 16384 neurons (as
scripts/bench/validate_model.py). Block plans for P = 2 and 4. Each network trains 4 steps of 64 on
2,048 synthetic samples and evaluates 512 (`spdnn train`), and infers the 512 (`spdnn infer`),
at every P. Each rank's peak: `/usr/bin/time -f %M`; the prediction: the job's own
(`--metrics-out`'s memory.predicted_bytes, spdnn.model.memory.predict). The table gives the
largest rank's. Writes the section "Memory: the validation networks" of docs/BENCHMARKS.md
unless --no-write.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import parser, publish, run_job, summary_row, table  # noqa: E402
from validate_model import build as network  # noqa: E402  (the same validation networks)

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPDNN_THREADS": "1"}


def prepare(name: str, ranks: list[int], work: Path) -> dict[str, Path]:
    from spdnn.io.bundle import save_network
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import Plan

    net = network(name)
    files = {"net": work / f"{name}.npz", "data": work / f"{name}-data.npz"}
    save_network(net, files["net"])
    rng = np.random.default_rng(0)
    n0 = net.sizes[0]
    np.savez(files["data"], x_train=rng.random((2048, n0), dtype=np.float32),
             y_train=rng.integers(0, 10, 2048), x_test=rng.random((512, n0), dtype=np.float32),
             y_test=rng.integers(0, 10, 512))
    for p in ranks:
        if p > 1:
            owners = tuple((np.arange(n) * p // n).astype(np.int32) for n in net.sizes)
            files[p] = work / f"{name}-block{p}.npz"
            save_plan(Plan(p, owners, {"method": "block"}), files[p])
    return files


def run(ranks: int, args: list[str], metrics: Path) -> tuple[list[int], list[int]]:
    """Each rank's measured peak (bytes) and predicted total, in rank order."""
    job = run_job(args, ranks, metrics=metrics, env=ENV, peaks=True)
    return job.peaks, [p["total"] for p in job.metrics["memory"]["predicted_bytes"]]


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network and job: the measured peak against the prediction at every P."""
    rows = []
    for key in dict.fromkeys((r["network"], r["job"]) for r in tables[0]):
        mine = [r for r in tables[0] if (r["network"], r["job"]) == key]
        ps = " / ".join(r["P"] for r in mine)
        rows.append(summary_row(f"{key[0]}, {key[1]}: peak a rank at P = {ps} (MB)",
                                " / ".join(r["peak (MB)"] for r in mine),
                                " / ".join(r["predicted (MB)"] for r in mine) + " (predicted)",
                                "error " + " / ".join(r["error"] for r in mine)))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--networks", nargs="+", choices=["mlp", "random", "radixnet"],
                    default=["mlp", "random", "radixnet"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.networks:
            files = prepare(name, args.ranks, work)
            for job in ("train", "infer"):
                for p in args.ranks:
                    common = ["--network", str(files["net"])] + \
                        (["--plan", str(files[p])] if p > 1 else [])
                    if job == "train":
                        cmd = ["train", *common, "--data", f"npz:{files['data']}", "--epochs",
                               "1", "--max-steps", "4", "--batch-size", "64"]
                    else:
                        cmd = ["infer", *common, "--inputs", f"npz:{files['data']}"]
                    measured, predicted = run(p, cmd, work / "m.json")
                    # /usr/bin/time's lines come in the order the ranks end: take the largest
                    # measured beside the largest predicted
                    peak, pred = max(measured), max(predicted)
                    rows.append([name, job, str(p), f"{peak / 1e6:,.0f}", f"{pred / 1e6:,.0f}",
                                 f"{100 * (pred - peak) / peak:+.1f}%"])
                    print(" | ".join(rows[-1]), flush=True)
    body = ("Command: `python scripts/bench/bench_memory.py --networks " + " ".join(args.networks)
            + " --ranks " + " ".join(map(str, args.ranks)) + "`. Block plans; training: 4 "
            "steps of 64 on 2,048 samples, evaluation on 512; inference: the 512. Peak: the "
            "largest rank's `/usr/bin/time -f %M`; predicted: the largest rank's prediction "
            "of the job's own memory line (`spdnn.model.memory.predict`, the data counted as "
            "held); float32, one thread per rank, P = 4 on 2 cores.\n\n"
            + table(["network", "job", "P", "peak (MB)", "predicted (MB)", "error"], rows))
    publish(args, "memory-validation", "Memory: the validation networks", body, area="Memory",
            rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
