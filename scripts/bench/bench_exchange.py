"""Bytes and time of `--exchange dense|auto|sparse`, side by side in one run.

    python scripts/bench/bench_exchange.py [--rounds 3] [--only TEXT] [--no-write]
    python scripts/bench/bench_exchange.py --kernels [--no-write]

Cases (float32, one thread per rank; P = 4 oversubscribes this 2-core machine and measures bytes,
not time):
- Graph Challenge 1024 x 120 on the 1,200-image subset (../shared; skipped when absent),
  `spdnn infer` at P = 2 and 4 with a KaHyPar plan (`spdnn-partition --objective infer`);
- the MNIST MLP of docs/BENCHMARKS.md (784 -> 1024 -> 1024 -> 10, fan-in 32), one epoch of
  `spdnn train --batch-size 64` at P = 2 and 4 with a hypergraph plan (../shared/data/mnist;
  skipped when absent);
- RadiX-Net 4096 x 120 (bias -0.35) on 256 random binary inputs that all stay alive, `spdnn
  infer` at P = 2 with a cyclic plan.

``--kernels`` times the encoders alone instead, per entry, against the dense path's gather
(np.take) on one message of GC-like, MNIST-like and saturated blocks: both backends, float32 and
float64 (section "Sparse exchange kernels").

Bytes are the runtime's counts of what it sent (payload and headers, all ranks, --metrics-out);
time is the inference loop (`seconds`) or the epoch's seconds, median over the rounds, the modes
alternating within each round. Writes the table to docs/BENCHMARKS.md ("Sparse exchange").
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHARED, number, parser, publish, run_job, summary_row, table  # noqa: E402

BIN = Path(sys.executable).parent
MODES = ("dense", "auto", "sparse")


def run(ranks: int, args: list[str], metrics: Path) -> dict:
    return run_job(args, ranks, metrics=metrics).metrics


def partition(work: Path, net: Path, ranks: int, extra: list[str]) -> Path:
    out = work / f"{net.stem}-{ranks}.npz"
    subprocess.run([str(BIN / "spdnn-partition"), str(net), "-P", str(ranks), "-o", str(out),
                    *extra], check=True, capture_output=True)
    return out


def cases(work: Path) -> list[tuple[str, int, list[str], str]]:
    """(label, ranks, spdnn arguments without --exchange, time metric)."""
    from spdnn.io.bundle import save_network
    from spdnn.io.formats import write_mtx
    from spdnn.io.graphchallenge import read_graphchallenge
    from spdnn.model.generate import radixnet, random_network

    out = []
    gc = SHARED / "graphchallenge"
    if (gc / "neuron1024" / "n1024-l1.tsv").is_file():
        net = work / "gc.npz"
        save_network(read_graphchallenge(gc / "neuron1024", -0.3, 32), net)
        for p in (2, 4):
            plan = partition(work, net, p, ["--objective", "infer"])
            out.append((f"Graph Challenge 1024 x 120, 1,200 images, infer, P={p}", p,
                        ["infer", "--network", str(net), "--plan", str(plan), "--inputs",
                         str(gc / "sparse-images-1024_subset.mtx")], "seconds"))
    else:
        print(f"skipped the Graph Challenge case: {gc} is absent", flush=True)
    mnist = SHARED / "mnist"
    if (mnist / "train-images-idx3-ubyte.gz").is_file():
        net = work / "mnistnet.npz"
        save_network(random_network([784, 1024, 1024], 32, seed=0, head=10), net)
        for p in (2, 4):
            plan = partition(work, net, p, [])
            out.append((f"MNIST MLP 784-1024-1024-10, train 1 epoch, P={p}", p,
                        ["train", "--network", str(net), "--plan", str(plan), "--data",
                         f"mnist:{mnist}", "--epochs", "1", "--batch-size", "64", "--lr",
                         "0.05", "--momentum", "0.9"], "epoch"))
    else:
        print(f"skipped the MNIST case: {mnist} is absent", flush=True)
    net = work / "rx.npz"
    save_network(radixnet(4096, 120, seed=0, bias=-0.35), net)
    images = sp.random(256, 4096, density=0.5, random_state=1, format="csr")
    images.data[:] = 1
    write_mtx(work / "rx-inputs.mtx", images)
    plan = partition(work, net, 2, ["--method", "cyclic"])
    out.append(("RadiX-Net 4096 x 120, 256 random inputs (all alive), infer, P=2", 2,
                ["infer", "--network", str(net), "--plan", str(plan), "--inputs",
                 str(work / "rx-inputs.mtx")], "seconds"))
    return out


def _time_encoders(x, rows: np.ndarray, repeats: int) -> dict[str, float]:  # noqa: ANN001
    """ns per entry of each step on one message (rows of x), the active backend."""
    import numpy as np
    from harness import interleaved

    from spdnn.kernels import encoding

    n = len(rows) * x.shape[1]
    starts = np.array([0, len(rows)], np.int64)
    out = np.zeros(encoding.expand_capacity(len(rows), x.shape[1], x.itemsize), np.uint8)
    block = np.empty((len(rows), x.shape[1]), x.dtype)
    partials = np.random.default_rng(1).standard_normal(block.shape).astype(x.dtype)
    packed = np.empty(n, x.dtype)
    g = np.zeros_like(x)
    encoding.warm_up()
    encoding.encode_rows(x, rows, "sparse", 32.0, out)
    count = encoding.fold_pack(partials, x, rows, 32.0, packed)
    t = interleaved({
        "take": lambda: np.take(x, rows, axis=0, out=block, mode="clip"),
        "encode": lambda: encoding.encode_blocks(x, rows, starts, "sparse", 32.0, out,
                                                 starts[:1]),
        "decode": lambda: encoding.decode_rows(out, block, 32.0, "bench"),
        "fold_pack": lambda: encoding.fold_pack(partials, x, rows, 32.0, packed),
        "fold_add": lambda: encoding.fold_add(g, rows, packed[:count], x, 32.0),
    }, repeats=repeats)
    return {k: v / n * 1e9 for k, v in t.items()}


def kernel_rows(repeats: int) -> list[list[str]]:
    """ns per entry of each encoder step, both backends, beside the dense gather."""
    from spdnn.kernels import products as kernels

    rng = np.random.default_rng(0)
    blocks = {"GC layer 2 (1,098 samples, 27% nonzero)": (1098, 0.27, 0.0),
              "MNIST hidden (64 samples, 50% nonzero)": (64, 0.5, 0.0),
              "GC deep layer (19 samples, all at the cap)": (19, 1.0, 1.0)}
    out = []
    steps = ("encode", "decode", "fold_pack", "fold_add")
    for dtype in (np.float32, np.float64):
        for label, (batch, density, at_cap) in blocks.items():
            x = rng.uniform(0.1, 31, (1024, batch)).astype(dtype)
            x[rng.random(x.shape) > density] = 0
            x[rng.random(x.shape) < at_cap] = 32
            rows = np.sort(rng.choice(1024, 300, replace=False)).astype(np.int64)
            cells = [label, np.dtype(dtype).name]
            per_backend = {}
            for backend in ("numba", "scipy"):
                kernels.set_backend(backend)
                per_backend[backend] = _time_encoders(x, rows, repeats)
            cells.append(f"{per_backend['numba']['take']:.2f}")
            cells += [" / ".join(f"{per[k]:.2f}" for k in steps) for per in per_backend.values()]
            kernels.set_backend("numba")
            out.append(cells)
            print(" | ".join(cells), flush=True)
    return out


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each case's bytes and time under the default exchange (auto) against dense rows."""
    rows = []
    for auto in (r for r in tables[0] if r["--exchange"] == "auto"):
        dense = next(r for r in tables[0] if r["case"] == auto["case"]
                     and r["--exchange"] == "dense" and r["MB as dense rows"] ==
                     auto["MB as dense rows"])
        rows.append(summary_row(
            f"{auto['case']} (MB sent; s, median)",
            f"{auto['MB sent']} MB; {auto['seconds, median (best)'].split(' ')[0]} s (auto)",
            f"{dense['MB sent']} MB; {dense['seconds, median (best)'].split(' ')[0]} s "
            "(dense rows)",
            f"{auto['fewer bytes']} fewer bytes, {auto['speed vs dense'].split(' ')[0]} the "
            "speed"))
    return rows


def kernel_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The numba encoders against the numpy ones, ns per entry summed over the four."""
    rows = []
    for r in tables[0]:
        fast = r["numba: encode / decode / fold pack / fold add"]
        slow = r["numpy (scipy backend): encode / decode / fold pack / fold add"]
        total = [sum(number(v) for v in cell.split("/")) for cell in (fast, slow)]
        rows.append(summary_row(
            f"exchange encoders, {r['block']}, {r['dtype']} (ns per entry: encode / decode / "
            "fold pack / fold add)", fast, f"{slow} (numpy)",
            f"{total[1] / total[0]:.1f}x faster"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", metavar="TEXT", help="run only the cases whose label contains "
                    "TEXT (e.g. 'MNIST'); implies --no-write")
    ap.add_argument("--kernels", action="store_true",
                    help="time the encoders alone (ns per entry), not whole runs")
    args = ap.parse_args()
    if args.kernels:
        body = ("Command: `python scripts/bench/bench_exchange.py --kernels` (one message of 300 "
                "rows x B, one thread, median of 50 interleaved calls; ns per entry of the "
                "block; encode and decode are the forward's sparse form, fold pack and add the "
                "backward's; `take` is what `--exchange dense` does per entry before MPI "
                "copies the rows).\n\n"
                + table(["block", "dtype", "dense gather (np.take)",
                         "numba: encode / decode / fold pack / fold add",
                         "numpy (scipy backend): encode / decode / fold pack / fold add"],
                        kernel_rows(50)))
        publish(args, "BENCH_EXCHANGE_KERNELS", "Sparse exchange kernels", body,
                area="Kernels", rows=kernel_summary)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label, ranks, base, metric in cases(work):
            if args.only and args.only not in label:
                continue
            sent: dict[str, int] = {}
            dense_rows: dict[str, int] = {}
            secs: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(args.rounds):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    m = run(ranks, [*base, "--exchange", mode], work / "m.json")
                    c = m["traffic"]["counted"]
                    sent[mode] = sum(c["forward_sent"]) + sum(c["backward_sent"])
                    dense_rows[mode] = sum(c["forward_bytes"]) + sum(c["backward_bytes"])
                    secs[mode].append(m["seconds"] if metric == "seconds"
                                      else m["epochs"][-1]["seconds"])
                    print(f"{label}, {mode}: {sent[mode] / 1e6:.2f} MB, "
                          f"{secs[mode][-1]:.3f} s", flush=True)
            base, best = statistics.median(secs["dense"]), min(secs["dense"])
            for mode in MODES:
                t = statistics.median(secs[mode])
                rows.append([label, mode, f"{dense_rows[mode] / 1e6:,.2f}",
                             f"{sent[mode] / 1e6:,.2f}", f"{sent['dense'] / sent[mode]:.2f}x",
                             f"{t:.3f} ({min(secs[mode]):.3f})",
                             f"{base / t:.2f}x ({best / min(secs[mode]):.2f}x)"])
    body = (f"Command: `python scripts/bench/bench_exchange.py --rounds {args.rounds}` "
            "(float32, one thread per rank, median (best) seconds over the rounds with the modes "
            "alternating; the "
            "time is the inference loop, or the training epoch including its evaluation "
            "pass). `MB as dense rows`: the plan's rows x samples x 4 bytes, what `dense` "
            "sends; `MB sent`: the runtime's count of payload and headers; the ratios are "
            "dense over each mode.\n\n"
            + table(["case", "--exchange", "MB as dense rows", "MB sent", "fewer bytes",
                     "seconds, median (best)", "speed vs dense"], rows))
    args.no_write = args.no_write or bool(args.only)  # a part of the table is not the table
    publish(args, "BENCH_EXCHANGE", "Sparse exchange", body, area="Exchange and grids",
            rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
