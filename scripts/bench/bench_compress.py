"""Gradient compressors: selection time against exact Top-k, and SIDCo's achieved ratio on real
gradients, side by side in one run.

    python scripts/bench/bench_compress.py [--steps 300] [--repeats 15] [--no-write]

1. Real gradients: the MNIST MLP of docs/BENCHMARKS.md (784 -> 1024 -> 1024 -> 10, fan-in 32,
   float32) is trained on one process for ``--steps`` steps of batch 64 (lr 0.05, momentum
   0.9); every step's gradient of every layer is recorded (../shared/data/mnist; synthetic
   heavy-tailed values stand in, and the table says so, when it is absent).
2. Overhead: one 1,000,000-value float32 vector made of those gradients end to end (the first
   steps' layer gradients, each scaled to unit norm so that no step dominates); each selector
   (exact Top-k = abs + argpartition, DGC, SIDCo exp / gamma / gpareto) is timed on it,
   interleaved, median of ``--repeats``; one thread.
3. Achieved ratio: each layer's recorded gradients in step order through SIDCo with its
   adaptation and error feedback (a fresh compressor per layer, as in training: what it sees
   is the gradient plus the residual), the mean achieved / target ratio over the steps after
   the first 50.

Writes docs/BENCHMARKS.md, section "Gradient compressors".
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import os
import sys
import time

import spdnn.cli.thread_pools  # noqa: F401
from spdnn.lossy import compress as C

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHARED, interleaved, parser, publish, summary_row, table  # noqa: E402

N = 1_000_000


def record(steps: int) -> tuple[list[list[np.ndarray]], str]:
    """Per layer, the gradient (weights then biases) of every step."""
    import tempfile

    from spdnn.comm.mpi import Communicator
    from spdnn.io.bundle import save_network
    from spdnn.io.loaders import load_dataset
    from spdnn.model.batching import batch_order, batches, columns
    from spdnn.model.generate import random_network
    from spdnn.optim import SGD, SGDConfig, interleave
    from spdnn.runtime.session import open_network

    mnist = SHARED / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").is_file():
        rng = np.random.default_rng(0)
        fake = [[(rng.laplace(size=n) * rng.exponential(size=n) ** 0.5).astype(np.float32)
                 for _ in range(steps)] for n in (33_792, 33_792, 10_250)]
        return fake, "synthetic (no ../shared/data/mnist)"
    with tempfile.TemporaryDirectory() as tmp, Communicator.self_only() as comm:
        path = os.path.join(tmp, "mlp.npz")
        save_network(random_network([784, 1024, 1024], 32, seed=0, head=10), path)
        dnet = open_network(comm, path, None).dnet
        data = load_dataset(f"mnist:{mnist}", "float32")
        opt = SGD(SGDConfig(0.05, 0.9), dnet.parameters())
        grads: list[list[np.ndarray]] = [[] for _ in dnet.layers]
        order = batch_order(len(data.y_train), 0, 0, True)
        for step, idx in enumerate(batches(order, 64)):
            if step == steps:
                break
            fwd = dnet.forward(columns(data.x_train, idx))
            _, _, gw, gb = dnet.backward(fwd, data.y_train[idx], "cross_entropy")
            for i in range(len(gw)):
                grads[i].append(np.concatenate([gw[i], gb[i]]))
            opt.step(interleave(gw, gb))
    return grads, "MNIST MLP, recorded"


def overhead(vector: np.ndarray, repeats: int) -> list[list[str]]:
    rows = []
    for ratio in (0.01, 0.001):
        fns = {}
        for text in ("topk", "dgc", "sidco:exp", "sidco:gamma", "sidco:gpareto"):
            kind, _, dist = text.partition(":")
            spec = C.parse_compress(f"{kind}:{ratio}" + (f":{dist}" if dist else ""))
            comp = C.Compressor(spec, len(vector), vector.dtype, seed=0)
            fns[spec.text()] = (lambda c=comp: c.select(vector, 0))
        times = interleaved(fns, repeats=repeats, warmup=2)
        base = times[f"topk:{ratio:g}"]
        for name, t in times.items():
            picked = len(fns[name]()) / (ratio * len(vector))
            rows.append([f"{ratio:g}", name, f"{t * 1e3:.3f}", f"{t / base:.2f}",
                         f"{picked:.2f}"])
    return rows


def achieved(grads: list[list[np.ndarray]]) -> list[list[str]]:
    rows = []
    for ratio in (0.01, 0.001):
        for dist in C.DISTRIBUTIONS:
            spec = C.CompressSpec("sidco", ratio, dist)
            cells = []
            for layer in grads:
                comp = C.Compressor(spec, len(layer[0]), layer[0].dtype)
                got = [len(comp.compress((g,), s)[0]) / (ratio * len(g))
                       for s, g in enumerate(layer)]
                tail = got[50:] if len(got) > 60 else got
                cells.append(f"{np.mean(tail):.2f} ({int(comp.state[0])})")
            rows.append([f"{ratio:g}", spec.text(), *cells])
    return rows


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each approximate selector's time against exact Top-k at each ratio."""
    rows = []
    for ratio in dict.fromkeys(r["ratio"] for r in tables[0]):
        mine = [r for r in tables[0] if r["ratio"] == ratio]
        exact = next(r for r in mine if r["selector"].startswith("topk"))
        for r in mine:
            if r is not exact:
                rows.append(summary_row(
                    f"select 1M float32 gradient values at ratio {ratio}, {r['selector']} (ms)",
                    r["ms"], f"{exact['ms']} (exact Top-k)", f"{r['x Top-k time']}x the time, "
                    f"{r['selected / k']} of k selected"))
    return rows


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    C.warm_up()
    t0 = time.perf_counter()
    grads, source = record(args.steps)
    print(f"recorded {len(grads[0])} steps of {len(grads)} layers ({source}) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    parts, total = [], 0
    for step in range(len(grads[0])):
        for layer in grads:
            g = layer[step]
            parts.append(g / np.linalg.norm(g))
            total += len(g)
        if total >= N:
            break
    vector = np.concatenate(parts)[:N].astype(np.float32)
    if len(vector) < N:
        raise SystemExit(f"recorded {len(vector)} values, need {N}: raise --steps")
    over = overhead(vector, args.repeats)
    print(table(["ratio", "selector", "ms", "x Top-k time", "selected / k"], over))
    ach = achieved(grads)
    sizes = [f"layer {i + 1} ({len(g[0]):,} values)" for i, g in enumerate(grads)]
    body = (
        f"Command: `python scripts/bench/bench_compress.py --steps {args.steps} --repeats "
        f"{args.repeats}`. Gradients: {source} ({len(grads[0])} steps of batch 64, "
        "lr 0.05, momentum 0.9). One thread.\n\n"
        "Selection time on one 1,000,000-value float32 vector made of recorded layer "
        "gradients (each scaled to unit norm), median of the interleaved repeats; `x Top-k "
        "time` is the ratio to exact Top-k (abs + argpartition) at the same ratio, measured in "
        "the same run; `selected / k` is that call's count against the target (one call, "
        "before adaptation: SIDCo starts at 2 stages).\n\n"
        + table(["ratio", "selector", "ms", "x Top-k time", "selected / k"], over)
        + "\n\nSIDCo's achieved ratio on each layer's recorded gradients in step order, with "
        "its adaptation and error feedback as in training: mean achieved / target over the "
        "steps after the first 50 (stages at the end in brackets). Target: within "
        "[0.8, 1.2].\n\n"
        + table(["ratio", "compressor", *sizes], ach))
    publish(args, "compressors", "Gradient compressors", body,
            area="Compression and critical sets", rows=summary)


if __name__ == "__main__":
    main()
