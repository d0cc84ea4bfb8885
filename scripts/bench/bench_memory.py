"""Each rank's memory as a scheduler counts it, against the prediction and against one rank.

    python scripts/bench/bench_memory.py [--networks mlp random radixnet big | shares]
                                   [--ranks 1 2 4] [--work DIR] [--no-write]
    python scripts/bench/bench_memory.py --dtypes [--networks random | random-tanh | big]
                                   [--batch-size 1024]

Networks (float32, a dense 10-way head): `mlp`, 784 -> 1024 -> 1024 (fan-in 32); `random`,
4096 -> 16384 x 3 (fan-in 32); `random-tanh`, the same with tanh, sigmoid and tanh hidden
layers; `radixnet`, the first 3 RadiX-Net layers of 16384 neurons (as
scripts/bench/validate_model.py); `big`, 1024 -> 65536 x 3 (fan-in 512: 101,318,656 weights,
an 812 MB file). Block plans for P = 2 and 4. Each network trains 4 steps of 64 on 2,048
synthetic samples and evaluates 512 (`spdnn train`), and infers the 512 (`spdnn infer`), at
every P, each job in a memory cgroup of its own (as root). `shares`: the `mlp` network on
60,000 synthetic samples (`npz:`) and on the MNIST of ../shared/data (`mnist:`, when there),
40 steps, on one rank and on P ranks as data-parallel replicas (`--replicas P`: each holds its
share of the samples); written as its own record (memory-shares). Per job: the largest rank's
peak as spdnn reports it (private memory and its share of what the node's ranks share), its
prediction (the job's own, above the baseline it measured), that baseline, the rank's memory
above its baseline against one rank's, `/usr/bin/time -f %M` (shared pages counted in every
rank) and what the job's cgroup was charged at most (every rank together).
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHARED, parser, publish, run_job, summary_row, table  # noqa: E402
from validate_model import build as network  # noqa: E402  (the same validation networks)

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPDNN_THREADS": "1"}


def prepare(name: str, ranks: list[int], work: Path) -> dict:
    from spdnn.io.bundle import save_network
    from spdnn.io.planfile import save_plan
    from spdnn.model.generate import random_network
    from spdnn.model.network import Network
    from spdnn.model.plan import Plan

    if name == "big":
        net = random_network([1024, 65536, 65536, 65536], 512, seed=0, head=10)
    elif name == "random-tanh":  # slopes read from the outputs, applied to a float32 block
        net = Network(layers=network("random").layers, activations=("tanh", "sigmoid", "tanh"))
    else:
        net = network("mlp" if name == "shares" else name)
    files: dict = {"net": work / f"{name}.npz", "data": work / f"{name}-data.npz",
                   "weights": sum(layer.weight.nnz for layer in net.layers)}
    save_network(net, files["net"])
    rng = np.random.default_rng(0)
    n0 = net.sizes[0]
    train, test = (60_000, 10_000) if name == "shares" else (2048, 512)
    np.savez(files["data"], x_train=rng.random((train, n0), dtype=np.float32),
             y_train=rng.integers(0, 10, train), x_test=rng.random((test, n0), dtype=np.float32),
             y_test=rng.integers(0, 10, test))
    files["inputs"] = [f"npz:{files['data']}"]
    if name == "shares":  # samples by shares: no plan, P replicas
        if (SHARED / "mnist").is_dir():
            files["inputs"].append(f"mnist:{SHARED / 'mnist'}")
        return files
    for p in ranks:
        if p > 1:
            owners = tuple((np.arange(n) * p // n).astype(np.int32) for n in net.sizes)
            files[p] = work / f"{name}-block{p}.npz"
            save_plan(Plan(p, owners, {"method": "block"}), files[p])
    return files


def run(ranks: int, args: list[str], metrics: Path) -> dict[str, float]:
    """The largest rank's peak, prediction and baseline (as the job reports them), the largest
    ``/usr/bin/time`` peak and the job's cgroup peak, in bytes."""
    job = run_job(args, ranks, metrics=metrics, env=ENV, peaks=True, cgroup=True)
    mem = job.metrics["memory"]
    r = max(range(ranks), key=lambda q: mem["peak_bytes"][q])
    return {"peak": mem["peak_bytes"][r], "predicted": mem["predicted_bytes"][r]["total"],
            "baseline": mem["predicted_bytes"][r]["baseline"], "rss": max(job.peaks),
            "cgroup": job.cgroup_peak}


# How a summary row names each network.
DESCRIBED = {"big": "101,318,656 weights (1024 -> 65536 x 3, fan-in 512)",
             "mlp": "784 -> 1024 -> 1024 (fan-in 32)", "random": "4096 -> 16384 x 3 (fan-in 32)",
             "random-tanh": "4096 -> 16384 x 3 (fan-in 32), tanh, sigmoid, tanh",
             "radixnet": "RadiX-Net 16384 x 3"}


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network and job: the peak a rank against the prediction at every P, and its memory
    above the baseline against one rank's."""
    rows = []
    for key in dict.fromkeys((r["network"], r["job"]) for r in tables[0]):
        mine = [r for r in tables[0] if (r["network"], r["job"]) == key]
        ps = " / ".join(r["P"] for r in mine)
        rows.append(summary_row(
            f"{DESCRIBED.get(key[0], key[0])}, {key[1]}: peak a rank at P = {ps} (MB, private "
            "+ shared share)",
            " / ".join(r["peak (MB)"] for r in mine),
            " / ".join(r["predicted (MB)"] for r in mine) + " (predicted)",
            "error " + " / ".join(r["error"] for r in mine) + "; above the baseline "
            + " / ".join(r["above baseline vs P = 1"] for r in mine) + " of P = 1"))
    return rows


def prepared(args, tmp: str):  # noqa: ANN001, ANN201
    """(name, files, work directory) of each network the run measures, prepared in turn."""
    work = args.work or Path(tmp)
    work.mkdir(parents=True, exist_ok=True)
    for name in args.networks:
        yield name, prepare(name, args.ranks, work), work


def value_types(args) -> str:  # noqa: ANN001
    """Each network's training in bfloat16 beside float32 at every P: the largest rank's peak
    above its baseline, the prediction's error, and bfloat16's memory above the baseline over
    float32's."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, files, work in prepared(args, tmp):
            for p in args.ranks:
                above = {}
                for dtype in ("float32", "bfloat16"):
                    cmd = ["train", "--network", str(files["net"]), "--data",
                           files["inputs"][0], "--epochs", "1", "--max-steps", "2",
                           "--batch-size", str(args.batch_size), "--dtype", dtype]
                    if p > 1:
                        cmd += ["--plan", str(files[p])]
                    m = run(p, cmd, work / "m.json")
                    above[dtype] = m["peak"] - m["baseline"]
                    predicted = m["predicted"] - m["baseline"]
                    rows.append([name, str(p), dtype, f"{m['peak'] / 1e6:,.0f}",
                                 f"{m['baseline'] / 1e6:,.0f}", f"{above[dtype] / 1e6:,.1f}",
                                 f"{predicted / 1e6:,.1f}",
                                 f"{100 * (predicted - above[dtype]) / above[dtype]:+.1f}%",
                                 f"{above[dtype] / above['float32']:.3f}x",
                                 f"{above[dtype] * p / files['weights']:.1f}"])
                    print(" | ".join(rows[-1]), flush=True)
    return ("Command: `python scripts/bench/bench_memory.py --dtypes --networks "
            + " ".join(args.networks) + " --ranks " + " ".join(map(str, args.ranks))
            + f" --batch-size {args.batch_size}`. Training, 2 steps of {args.batch_size} on "
            "2,048 synthetic samples (evaluation on 512), block plans, one thread per rank, "
            "SGD with momentum. "
            "Peak: the largest rank's as the job reports it (private + its share of shared "
            "pages); above baseline: that peak less the baseline the job measured (the "
            "interpreter, numpy, MPI and the loaded kernels, bfloat16's included); predicted: "
            "the job's prediction above the same baseline (what `--dry-run` prints); the last "
            "columns: memory above the baseline over float32's at the same P, and over the "
            "weights a rank holds (1/P of them: what a weight costs where the per-weight state "
            "dominates).\n\n"
            + table(["network", "P", "value type", "peak (MB)", "baseline (MB)",
                     "above baseline (MB)", "predicted above (MB)", "error",
                     "vs float32", "bytes a weight"], rows))


def dtype_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """bfloat16's memory above the baseline against float32's, per network and P."""
    rows = tables[0]
    return [summary_row(f"training memory above the baseline, "
                        f"{DESCRIBED.get(b['network'], b['network'])}, P = {b['P']}, "
                        "bfloat16 (MB)", f"{b['above baseline (MB)']} (predicted "
                        f"{b['predicted above (MB)']}, {b['error']})",
                        f"{f['above baseline (MB)']} (float32)", f"{b['vs float32']} float32's"
                        + (f"; {b['bytes a weight']} against {f['bytes a weight']} bytes a "
                           "weight" if b["network"] == "big" else ""))
            for f, b in zip(rows[::2], rows[1::2])]


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--networks", nargs="+",
                    choices=["mlp", "random", "random-tanh", "radixnet", "big", "shares"],
                    default=["mlp", "random", "radixnet"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--work", type=Path)
    ap.add_argument("--dtypes", action="store_true",
                    help="training in bfloat16 beside float32 (its own record)")
    ap.add_argument("--batch-size", type=int, default=1024, help="with --dtypes")
    args = ap.parse_args()
    if args.dtypes:  # the random network's record, or one per other set of networks
        which = "" if args.networks == ["random"] else "-" + "-".join(args.networks)
        publish(args, "memory-bfloat16" + which,
                "Memory: bfloat16" + (", " + " ".join(args.networks) if which else ""),
                value_types(args), area="Memory", rows=dtype_summary)
        return 0
    shares = args.networks == ["shares"]
    if "shares" in args.networks and not shares:
        ap.error("--networks shares is a run of its own (its own record)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, files, work in prepared(args, tmp):
            for data, job in ((d, j) for d in files["inputs"] for j in ("train", "infer")):
                one = None
                label = f"mlp, {data.split(':')[0]}:" if shares else name
                for p in args.ranks:
                    common = ["--network", str(files["net"])]
                    if p > 1:
                        common += ["--replicas", str(p)] if shares else ["--plan", str(files[p])]
                    if job == "train":
                        cmd = ["train", *common, "--data", data, "--epochs", "1",
                               "--max-steps", "40" if shares else "4", "--batch-size", "64"]
                    else:
                        cmd = ["infer", *common, "--inputs", data]
                    m = run(p, cmd, work / "m.json")
                    above = m["peak"] - m["baseline"]
                    one = above if p == 1 else one
                    rows.append([label, job, f"{p} replicas" if shares and p > 1 else str(p),
                                 f"{m['peak'] / 1e6:,.0f}", f"{m['predicted'] / 1e6:,.0f}",
                                 f"{100 * (m['predicted'] - m['peak']) / m['peak']:+.1f}%",
                                 f"{m['baseline'] / 1e6:,.0f}",
                                 f"{above / one:.3f}x" if one else "-",
                                 f"{m['rss'] / 1e6:,.0f}", f"{m['cgroup'] / 1e6:,.0f}"])
                    print(" | ".join(rows[-1]), flush=True)
    what = ("Replicas (`--replicas P`, each holding its share of the samples); training: 40 "
            "steps of 64 on 60,000 samples (synthetic `npz:`, and MNIST `mnist:`), evaluation "
            "on 10,000; inference: the 10,000. " if shares else
            "Block plans; training: 4 steps of 64 on 2,048 samples, evaluation on 512; "
            "inference: the 512. ")
    body = ("Command: `python scripts/bench/bench_memory.py --networks " + " ".join(args.networks)
            + " --ranks " + " ".join(map(str, args.ranks)) + "`. " + what + "Peak: the "
            "largest rank's, as the job reports it (private + its share of shared pages); "
            "predicted: that rank's prediction (`spdnn.model.memory.predict` above the "
            "baseline it measured); "
            "`above baseline vs P = 1`: (peak - baseline) over that of one rank; `%M`: the "
            "largest rank's `/usr/bin/time -f %M`; cgroup: the job's memory cgroup at its "
            f"most (every rank). float32, one thread per rank, on {os.cpu_count()} cores.\n\n"
            + table(["network", "job", "P", "peak (MB)", "predicted (MB)", "error",
                     "baseline (MB)", "above baseline vs P = 1", "%M (MB)", "cgroup (MB)"],
                    rows))
    marker, title = ("memory-101m", "the 101M-weight network") if args.networks == ["big"] \
        else ("memory-shares", "samples by shares") if shares \
        else ("memory-validation", "the validation networks")
    publish(args, marker, "Memory: " + title, body, area="Memory", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
