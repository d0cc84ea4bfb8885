"""Graph Challenge inference rate (official metric: inputs x edges / seconds of the inference
loop), spdnn at P = 1 and P = 2 against a plain scipy loop, side by side in one run.

    python scripts/bench/bench_infer.py [--radix-layers 120] [--inputs 1200]

Cases: the official 1024-neuron, 120-layer network on the 1,200-image subset from ../shared/data
(skipped when absent), and a generated RadiX-Net 4096 network (120 layers, bias -0.35, cap 32) on
random binary inputs with 50% density (all samples stay alive: the dense case). spdnn runs
through `spdnn infer` (2 ranks under mpiexec: a hypergraph plan, or 2 replicas each taking
half of the inputs). Two scipy baselines: the
plain sparse loop of the official serial reference (Y sparse, samples x neurons: Y <- Y W^T, bias
added to the stored entries, ReLU, cap, explicit zeros removed; valid because every bias is
negative), and spdnn's own serial reference (dense Y, Y <- h(W Y + b), dead samples dropped).
Ratios are against the plain loop. Writes the table to docs/BENCHMARKS.md.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHARED, Rounds, number, parser, publish, run_job, summary_row, table  # noqa: E402

from partition.methods import partition_network  # noqa: E402
from spdnn.io.bundle import save_network  # noqa: E402
from spdnn.io.formats import read_inputs, write_mtx  # noqa: E402
from spdnn.io.graphchallenge import read_graphchallenge  # noqa: E402
from spdnn.io.planfile import save_plan  # noqa: E402
from spdnn.model.generate import radixnet  # noqa: E402
from spdnn.model.plan import network_patterns
from spdnn.reference import challenge_infer  # noqa: E402

BIN = Path(sys.executable).parent


# spdnn's configurations: ranks, and how they share the work (a plan's rows, or replicas each
# taking a contiguous share of the inputs).
CONFIGS = {"spdnn P=1": (1, None), "spdnn P=2 (hypergraph plan)": (2, "plan"),
           "spdnn 2 replicas": (2, "replicas")}


def spdnn_rate(ranks: int, split: str | None, work: Path, name: str) -> tuple[float, int]:
    arguments = ["infer", "--network", str(work / f"{name}.npz"), "--inputs",
                 str(work / f"{name}-inputs.mtx")]
    if split == "plan":
        arguments += ["--plan", str(work / f"{name}-plan.npz")]
    elif split == "replicas":
        arguments += ["--replicas", str(ranks)]
    m = run_job(arguments, ranks, metrics=work / "m.json").metrics
    return m["rate"], m["categories"]


def sparse_loop(net, images: sp.csr_matrix) -> tuple[float, int]:  # noqa: ANN001
    """The official serial reference, Y <- Y W^T; Y(Y != 0) += b; ReLU; cap, on sparse Y."""
    assert all(float(layer.bias.max(initial=0)) <= 0 for layer in net.layers)
    weights = [layer.weight.T.tocsr() for layer in net.layers]
    biases = [layer.bias for layer in net.layers]
    y = images.astype(net.dtype).tocsr()
    t0 = time.perf_counter()
    for wt, b in zip(weights, biases):
        y = (y @ wt).tocsr()
        y.data += b[y.indices]
        np.maximum(y.data, 0, out=y.data)
        if net.cap is not None:
            np.minimum(y.data, net.cap, out=y.data)
        y.eliminate_zeros()
    seconds = time.perf_counter() - t0
    n_cats = int(np.count_nonzero(np.diff(y.indptr)))
    return images.shape[0] * net.nnz / seconds, n_cats


def bench_case(label: str, name: str, net, images: sp.csr_matrix, work: Path) -> list[list[str]]:  # noqa: ANN001
    save_network(net, work / f"{name}.npz")
    write_mtx(work / f"{name}-inputs.mtx", images)
    t0 = time.perf_counter()
    plan = partition_network(network_patterns(net), 2, method="hypergraph",
                             fingerprint=net.fingerprint())
    print(f"{label}: hypergraph plan for P=2 in {time.perf_counter() - t0:.0f} s", flush=True)
    save_plan(plan, work / f"{name}-plan.npz")
    images = read_inputs(work / f"{name}-inputs.mtx", net.sizes[0])
    rounds = Rounds()
    cats = {}
    plain = "scipy sparse loop (official reference)"
    for _ in range(3):  # interleaved rounds; the best rate of each is kept
        rate, cats[plain] = sparse_loop(net, images)
        rounds.add(plain, rate)
        ref = challenge_infer(net, images)
        dense = "scipy dense loop, dead samples dropped (spdnn serial reference)"
        rounds.add(dense, ref.rate)
        cats[dense] = len(ref.categories)
        for key, (ranks, split) in CONFIGS.items():
            rate, cats[key] = spdnn_rate(ranks, split, work, name)
            rounds.add(key, rate)
        print(label, {k: f"{v:.3g}" for k, v in rounds.best().items()}, flush=True)
    best = rounds.best()
    assert len(set(cats.values())) == 1, cats  # every run found the same categories
    return [[label, k, f"{v:.3g}", f"{v / best[plain]:.2f}x", f"{v / best[dense]:.2f}x",
             str(cats[plain])] for k, v in best.items()]


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each case's fastest spdnn configuration against the faster scipy loop."""
    rows = []
    for case in dict.fromkeys(r["case"] for r in tables[0]):
        mine = [r for r in tables[0] if r["case"] == case]
        ours = max((r for r in mine if r["implementation"].startswith("spdnn")),
                   key=lambda r: number(r["rate (edges/s)"]))
        peer = max((r for r in mine if r["implementation"].startswith("scipy")),
                   key=lambda r: number(r["rate (edges/s)"]))
        rows.append(summary_row(
            f"{case} (edges/s)",
            f"{ours['rate (edges/s)']} ({ours['implementation'].removeprefix('spdnn ')})",
            f"{peer['rate (edges/s)']} ({peer['implementation']})",
            f"{number(ours['rate (edges/s)']) / number(peer['rate (edges/s)']):.2f}x faster, "
            f"{ours['categories']} categories in both"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--radix-layers", type=int, default=120)
    ap.add_argument("--inputs", type=int, default=1200)
    args = ap.parse_args()
    rows = []
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gc = SHARED / "graphchallenge"
        if (gc / "neuron1024").is_dir():
            net = read_graphchallenge(gc / "neuron1024", -0.3, 32)
            images = read_inputs(gc / "sparse-images-1024_subset.mtx", 1024)
            rows += bench_case("Graph Challenge 1024 x 120, 1,200 official images", "gc", net,
                               images, work)
        else:
            notes.append("Graph Challenge case skipped: ../shared/data absent.")
        rng = np.random.default_rng(0)
        net = radixnet(4096, args.radix_layers, seed=0, bias=-0.35, cap=32)
        images = sp.csr_matrix((rng.random((args.inputs, 4096)) < 0.5).astype(np.float32))
        rows += bench_case(f"RadiX-Net 4096 x {args.radix_layers}, {args.inputs:,} random "
                           "inputs", "rx", net, images, work)
    body = (f"Command: `python scripts/bench/bench_infer.py --radix-layers {args.radix_layers} "
            f"--inputs {args.inputs}`. Rate in edges/s (official metric), best of three "
            "interleaved rounds; float32.\n\n"
            + table(["case", "implementation", "rate (edges/s)", "vs sparse loop",
                     "vs dense loop", "categories"], rows)
            + ("\n\n" + "\n".join(notes) if notes else ""))
    publish(args, "BENCH_INFER", "Graph Challenge inference", body, area="Inference",
            rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
