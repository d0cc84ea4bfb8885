"""Graph Challenge inference in bfloat16 beside float32: the categories, where they diverge and
why, and the rate.

    python scripts/bench/bench_challenge_bfloat16.py [--rounds 3] [--work DIR] [--no-write]

The official 1024 x 120 network (../shared/data/graphchallenge/neuron1024, bias -0.3, cap 32):
`spdnn infer --dtype float32|bfloat16` on the official 1,200-image subset against its truth
file, and on the 60,000 MNIST images made as the challenge makes them (`spdnn generate
challenge-images`; ../shared/data/mnist), P = 1, one thread, rounds interleaved, the rate
(inputs x edges / seconds of the inference loop) a median. Then the layers, in numpy on the
60,000 (float32 sums; bfloat16: each layer's outputs rounded as spdnn.reference.bfloat16
rounds them): per layer, the inputs alive in each type, those whose aliveness differs, and
the largest difference between the two types' outputs, up to the first layer where an input's
aliveness differs. Stops with a message when the data are absent.
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
from harness import (  # noqa: E402
    SHARED,
    parser,
    publish,
    run_job,
    shared_mnist,
    spdnn_tool,
    summary_row,
    table,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPDNN_THREADS": "1"}
TYPES = ("float32", "bfloat16")


def layer_by_layer(net_file: Path, images_file: Path, chunk: int = 10_000) -> list[list[str]]:
    """Per layer up to the first where aliveness differs (and 3 more): inputs alive in
    float32 and in bfloat16, how many differ, the largest output difference."""
    from spdnn.io.bundle import load_network
    from spdnn.io.images import read_image_share
    from spdnn.reference.bfloat16 import rounded

    net = load_network(net_file, "float32")
    images = read_image_share(images_file, net.sizes[0]).matrix.tocsr()
    n_layers = net.n_layers
    alive = {t: np.zeros((n_layers, images.shape[0]), bool) for t in TYPES}
    largest = np.zeros(n_layers)
    for start in range(0, images.shape[0], chunk):
        x0 = np.ascontiguousarray(images[start:start + chunk].T.toarray(), np.float32)
        x = {t: x0.copy() for t in TYPES}
        for k, layer in enumerate(net.layers):
            for t in TYPES:
                z = (layer.weight @ x[t] + layer.bias[:, None]).astype(np.float32)
                h = np.minimum(np.maximum(z, 0), net.cap)
                x[t] = rounded(h) if t == "bfloat16" else h
                alive[t][k, start:start + x0.shape[1]] = np.any(x[t] != 0, axis=0)
            largest[k] = max(largest[k], float(np.abs(x["float32"] - x["bfloat16"]).max()))
    rows = []
    first = None
    for k in range(n_layers):
        differ = int(np.count_nonzero(alive["float32"][k] != alive["bfloat16"][k]))
        if differ and first is None:
            first = k
        if k < 3 or first is None and largest[k] > 0 and k < 10 or \
                first is not None and k <= first + 3 or k == n_layers - 1:
            rows.append([str(k + 1), f"{alive['float32'][k].sum():,}",
                         f"{alive['bfloat16'][k].sum():,}", f"{differ:,}", f"{largest[k]:.3g}"])
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    gc = SHARED / "graphchallenge"
    if not (gc / "neuron1024").is_dir():
        raise SystemExit(f"{gc / 'neuron1024'} is absent: the official network is needed")
    mnist = shared_mnist()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        net, images = work / "gc.npz", work / "images32.npz"
        spdnn_tool("spdnn", "convert", "graphchallenge", "--dtype", "float32",
                   gc / "neuron1024", "--layers", "120", "--bias", "-0.3", "--cap", "32",
                   "-o", net, env=ENV)
        spdnn_tool("spdnn", "generate", "challenge-images", "--mnist", mnist, "--size", "32",
                   "-o", images, env=ENV)
        subset, truth = gc / "sparse-images-1024_subset.mtx", \
            gc / "neuron1024-l120-categories_subset.mtx"
        official = {}
        for t in TYPES:
            run_job(["infer", "--network", str(net), "--inputs", str(subset), "--truth",
                     str(truth), "--dtype", t], 1, metrics=work / "m.json", env=ENV)
            official[t] = "equal to the official"  # --truth fails the job otherwise
        rates: dict[str, list[float]] = {t: [] for t in TYPES}
        categories = {}
        for _ in range(args.rounds):
            for t in TYPES:
                out = work / f"categories-{t}.tsv"
                job = run_job(["infer", "--network", str(net), "--inputs", str(images),
                               "--dtype", t, "--categories-out", str(out)], 1,
                              metrics=work / "m.json", env=ENV)
                rates[t].append(job.metrics["rate"])
                categories[t] = set(int(v) for v in out.read_text().split())
                print(f"{t}: {job.metrics['categories']:,} categories, "
                      f"{job.metrics['rate']:.3e} edges/s", flush=True)
        layers = layer_by_layer(net, images)
    f32, b16 = categories["float32"], categories["bfloat16"]
    rows = [[t, official[t], f"{len(categories[t]):,}",
             f"{statistics.median(rates[t]):.3e}",
             f"{statistics.median(rates[t]) / statistics.median(rates['float32']):.2f}"]
            for t in TYPES]
    body = (f"Command: `python scripts/bench/bench_challenge_bfloat16.py --rounds {args.rounds}"
            "`. The official 1024 x 120 network (weights 1/16, bias -0.3, cap 32), P = 1, one "
            "thread; `spdnn infer --dtype float32|bfloat16`. bfloat16 represents 1/16 and 32 "
            "exactly; -0.3 is not a bfloat16 (it would round to -0.30078125), but spdnn keeps "
            "biases in float32 (the master precision), so what bfloat16 rounds is each "
            "layer's outputs min(max(Z, 0), 32), Z = (a sum of sixteenths) - 0.3, which need "
            "more than bfloat16's 8 significant bits from the first layer on. Inputs: the "
            "official 1,200-image subset (checked against its truth file) and the 60,000 "
            "MNIST images made as the challenge makes them (no official truth for them here: "
            "float32's categories are the reference). Rate: median of "
            f"{args.rounds} interleaved rounds.\n\n"
            + table(["value type", "1,200-image subset", "categories of 60,000",
                     "edges/s", "vs float32"], rows)
            + f"\n\nOf the 60,000: {len(f32 & b16):,} categories in both, "
            f"{len(f32 - b16):,} only in float32's, {len(b16 - f32):,} only in bfloat16's. "
            "Layer by layer (numpy, float32 sums; bfloat16 rounds each layer's outputs), up to "
            "the first layer where an input's aliveness differs and the last layer:\n\n"
            + table(["layer", "alive, float32", "alive, bfloat16", "aliveness differs",
                     "largest |difference|"], layers))

    def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
        r = {row["value type"]: row for row in tables[0]}
        return [summary_row("Graph Challenge 1024 x 120, 60,000 inputs, bfloat16: edges/s",
                            r["bfloat16"]["edges/s"], f"{r['float32']['edges/s']} (float32)",
                            f"{r['bfloat16']['vs float32']}x the rate; categories "
                            f"{r['bfloat16']['categories of 60,000']} vs "
                            f"{r['float32']['categories of 60,000']}; the 1,200-image subset "
                            f"{r['bfloat16']['1,200-image subset']}")]
    publish(args, "challenge-bfloat16", "Graph Challenge in bfloat16", body, area="Inference",
            rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
