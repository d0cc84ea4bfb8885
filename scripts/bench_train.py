"""Training time per epoch: spdnn at P = 1 and P = 2 (hypergraph and block plans) against a
PyTorch implementation of the same sparse network, side by side in one run.

    python scripts/bench_train.py [--hidden 16384] [--samples 2048] [--batch 256]
                                  [--structure random radixnet]

Networks (float32, a dense 10-way head, synthetic inputs and labels): `random`, fixed fan-in 32,
4096 -> H -> H -> H (the worst case for partitioning: almost every row is cut); `radixnet`, the
first 3 RadiX-Net layers of H neurons (structured sparsity, 32 nonzeros per row). Each
configuration trains 2 epochs of --samples samples; the second epoch's time is reported (the first
loads compiled kernels and allocates buffers). PyTorch (`pip install torch==2.13.0`, not a
dependency of spdnn) keeps each layer's nonzeros as a parameter vector and multiplies with
torch.sparse.mm on a COO tensor of the same pattern, SGD with the same momentum, with 1 and 2
threads. Writes the table to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import table, write_section  # noqa: E402

from partition.methods import partition_network  # noqa: E402
from spdnn.bundle import save_network  # noqa: E402
from spdnn.generate import add_head, radixnet, random_network  # noqa: E402
from spdnn.plan import network_patterns, plan_statistics, save_plan  # noqa: E402

BIN = Path(sys.executable).parent


def spdnn_epoch(ranks: int, work: Path, plan: str | None, args) -> float:  # noqa: ANN001
    cmd = [str(BIN / "spdnn"), "train", "--network", str(work / "net.npz"), "--data",
           f"npz:{work / 'data.npz'}", "--epochs", "2", "--batch-size", str(args.batch),
           "--lr", "0.01", "--momentum", "0.9", "--metrics-out", str(work / "m.json")]
    if plan:
        cmd += ["--plan", str(work / plan)]
    if ranks > 1:
        cmd = [str(BIN / "mpiexec"), "-n", str(ranks)] + cmd
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    metrics = json.loads((work / "m.json").read_text())
    # Where the time goes (both epochs, summed over layers and directions, max over ranks).
    split = {name: sum(map(sum, metrics["timing"][name].values()))
             for name in ("compute", "comm", "wait")}
    return metrics["epochs"][1]["seconds"], split


def torch_epoch(net, x, y, args, threads: int) -> float:  # noqa: ANN001
    import torch

    torch.set_num_threads(threads)
    params, shapes = [], []
    for layer in net.layers:
        coo = layer.weight.tocoo()
        idx = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
        vals = torch.nn.Parameter(torch.from_numpy(coo.data.copy()))
        bias = torch.nn.Parameter(torch.from_numpy(layer.bias.copy()))
        params += [vals, bias]
        shapes.append((idx, layer.weight.shape))
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def epoch() -> float:
        t0 = time.perf_counter()
        for s in range(0, len(y), args.batch):
            h = xt[s:s + args.batch].t()
            for k, (idx, shape) in enumerate(shapes):
                w = torch.sparse_coo_tensor(idx, params[2 * k], shape, is_coalesced=True)
                h = torch.sparse.mm(w, h) + params[2 * k + 1][:, None]
                if k + 1 < len(shapes):
                    h = torch.relu(h)
            loss = torch.nn.functional.cross_entropy(h.t(), yt[s:s + args.batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return time.perf_counter() - t0

    epoch()
    return epoch(), None


def build(structure: str, hidden: int):  # noqa: ANN201
    if structure == "random":
        return random_network([4096, hidden, hidden, hidden], 32, seed=0, n_classes=10)
    return add_head(radixnet(hidden, 3, seed=0), 10, seed=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--structure", nargs="+", choices=["random", "radixnet"],
                    default=["random", "radixnet"])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows, notes = [], []
    for structure in args.structure:
        net = build(structure, args.hidden)
        r, note = bench(structure, net, args)
        rows += r
        notes.append(note)
    steps = -(-args.samples // args.batch)
    body = (f"Command: `python scripts/bench_train.py --hidden {args.hidden} --samples "
            f"{args.samples} --batch {args.batch} --structure {' '.join(args.structure)}`. "
            f"float32, batch {args.batch}, {steps} steps per epoch, the second epoch timed; "
            "faster of two interleaved rounds. " + " ".join(notes) + " The last column is "
            "where spdnn's time goes over both epochs (max over ranks, summed over layers): "
            "local kernels / packing and posting messages / waiting for messages.\n\n"
            + table(["network", "configuration", "s / epoch", "ms / step",
                     "speed vs spdnn P=1", "compute / post / wait"], rows))
    print(body)
    if not args.no_write:
        write_section("BENCH_TRAIN", "Training", body)
    return 0


def bench(structure: str, net, args) -> tuple[list[list[str]], str]:  # noqa: ANN001
    rng = np.random.default_rng(0)
    n_in = net.sizes[0]
    x = rng.random((args.samples, n_in), dtype=np.float32)
    y = rng.integers(0, 10, args.samples)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        save_network(net, work / "net.npz")
        np.savez(work / "data.npz", x_train=x, y_train=y)
        patterns = network_patterns(net)
        t0 = time.perf_counter()
        hyper = partition_network(patterns, 2, "hypergraph", fingerprint=net.fingerprint())
        print(f"hypergraph plan in {time.perf_counter() - t0:.0f} s", flush=True)
        block = partition_network(patterns, 2, "block", fingerprint=net.fingerprint())
        save_plan(hyper, work / "hyper.npz")
        save_plan(block, work / "block.npz")
        vol = {n: plan_statistics(patterns, p.owners, 2).volume
               for n, p in (("hyper", hyper), ("block", block))}
        runs = {
            "spdnn P=1": lambda: spdnn_epoch(1, work, None, args),
            "spdnn P=2, hypergraph plan": lambda: spdnn_epoch(2, work, "hyper.npz", args),
            "spdnn P=2, block plan": lambda: spdnn_epoch(2, work, "block.npz", args),
        }
        try:
            import torch  # noqa: F401

            runs["PyTorch sparse, 1 thread"] = lambda: torch_epoch(net, x, y, args, 1)
            runs["PyTorch sparse, 2 threads"] = lambda: torch_epoch(net, x, y, args, 2)
        except ImportError:
            print("torch not installed: PyTorch rows skipped", flush=True)
        secs: dict[str, float] = {}
        splits = {}
        for _ in range(2):  # two rounds, interleaved; the faster of the two is kept
            for name, fn in runs.items():
                s, split = fn()
                if s <= secs.get(name, s):
                    secs[name], splits[name] = s, split
                print(f"{structure}, {name}: {s:.2f} s/epoch", flush=True)
    base = secs["spdnn P=1"]
    steps = -(-args.samples // args.batch)
    for name, s in secs.items():
        split = splits[name]
        share = "" if split is None else " / ".join(
            f"{100 * split[k] / max(sum(split.values()), 1e-12):.0f}%"
            for k in ("compute", "comm", "wait"))
        rows.append([structure, name, f"{s:.2f}", f"{1000 * s / steps:.0f}",
                     f"{base / s:.2f}x", share])
    sizes = " -> ".join(str(n) for n in net.sizes)
    note = (f"`{structure}`: {sizes}, {net.nnz:,} weights; plan volume per minibatch: "
            f"hypergraph {vol['hyper']:,} rows, block {vol['block']:,} rows.")
    return rows, note


if __name__ == "__main__":
    sys.exit(main())
