"""A roofline of the training step's sparse products on this machine: its bandwidths measured
(read and gather, at working sets that live in L1, L2, L3 and memory), one-thread SGEMM as the
compute ceiling, and each kernel of spdnn, PyTorch and SparseProp placed under them.

    python scripts/bench/bench_roofline.py [--sizes 4096 16384] [--batch 256] [--repeats 7]
    .venv-torch/bin/python scripts/bench/bench_roofline.py   # with PyTorch and SparseProp

Kernels (the products of scripts/bench/bench_kernels.py, float32, one thread): W X, W^T G, the
weight gradient (SDDMM) and the backward pass of a hidden layer (W^T G and the SDDMM), for an
n x n W with 32 nonzeros per row and blocks of n x batch. PyTorch (`pip install torch==2.13.0`)
and SparseProp (`pip install sparseprop`, ICML'23; its forward and its one-pass backward, called
as its autograd function calls them) join when they import; neither is a dependency of spdnn.

Bytes: every product gathers nnz x batch values (a row of the block per nonzero: 4 bytes each)
from wherever the gathered block lives (L3 for both sizes at batch 256 on a 512 KB L2), and
reads W (8 bytes a nonzero) and the dense blocks once from memory. Flops: 2 per gathered value
(a fused multiply-add), 4 in the backward pass (each gathered row serves both products). So
every kernel has the same arithmetic intensity over gathered bytes (0.5 flop/byte; 1 for the
one-pass backward), and the roof that applies is the bandwidth at which the block can be read
at all: a sequential read of a working set of the block's size, measured (no gather can read
its rows faster). ``of bound``: achieved GFLOP/s over that roof. The gather lines of the plot
(random 1 KB rows summed by a plain loop) show what a simple gather reaches at each level.
The whole training step is timed too, against the bound of its gathered bytes, and split by
phase (where the distance is). Writes the tables, docs/roofline.png and docs/roofline-step.png.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import time
from pathlib import Path

import numba as nb
import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernels import candidates, case, gather_rows, torch_ops  # noqa: E402
from bench_train import build as train_network  # noqa: E402
from bench_train import run as train_step
from harness import ROOT, interleaved, number, parser, publish, summary_row, table  # noqa: E402

from spdnn.io.atomic import atomic_path  # noqa: E402
from spdnn.kernels import products as kernels  # noqa: E402

LEVELS = {"L1": 16 << 10, "L2": 256 << 10, "L3": 8 << 20, "memory": 512 << 20}
FIGURE = ROOT / "docs" / "roofline.png"
PHASES_FIGURE = ROOT / "docs" / "roofline-step.png"


@nb.njit(cache=True, fastmath=True, nogil=True)
def read_sum(a, reps):  # noqa: ANN001, ANN201
    """Sum of a float32 array, ``reps`` times (vectorized, several accumulators)."""
    s = np.float32(0)
    for _ in range(reps):
        for i in range(a.size):
            s += a[i]
    return s


def best_seconds(fn, repeats: int) -> float:  # noqa: ANN001
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes per second of summing an array of ``nbytes`` (repeated to about 64 MB a run)."""
    a = np.ones(nbytes // 4, np.float32)
    reps = max(1, (64 << 20) // nbytes)
    return reps * nbytes / best_seconds(lambda: read_sum(a, reps), repeats)


def gather_bandwidth(nbytes: int, batch: int, repeats: int) -> float:
    """Gathered bytes per second: 4,096 output rows, each summing 32 rows of ``batch`` float32
    picked at random from a block of ``nbytes`` (the gather of W X, without the arithmetic)."""
    rng = np.random.default_rng(1)
    rows = max(32, nbytes // (4 * batch))
    x = np.ones((rows, batch), np.float32)
    out_rows = 4096
    indices = rng.integers(0, rows, out_rows * 32).astype(np.int32)
    indptr = np.arange(0, out_rows * 32 + 1, 32, dtype=np.int32)
    out = np.empty((out_rows, batch), np.float32)
    seconds = best_seconds(lambda: gather_rows(indptr, indices, x, out), repeats)
    return indices.size * batch * 4 / seconds


def sgemm_flops(repeats: int) -> float:
    a = np.ones((1024, 1024), np.float32)
    out = np.empty_like(a)
    return 2 * 1024**3 / best_seconds(lambda: np.matmul(a, a, out=out), repeats)


def sparseprop_ops(w: sp.csr_matrix, x: np.ndarray, d: np.ndarray) -> tuple[dict, str] | None:
    """SparseProp's forward and one-pass backward kernels on W, as its SparseLinearFunction
    calls them (blocks features x batch, as spdnn's)."""
    try:
        import torch
        from sparseprop import backend as sppb
    except ImportError:
        return None
    from importlib.metadata import version

    torch.set_num_threads(1)
    indptr = torch.from_numpy(w.indptr.astype(np.int32))
    indices = torch.from_numpy(w.indices.astype(np.int32))
    vals = torch.from_numpy(w.data.copy())
    tx, td = torch.from_numpy(x), torch.from_numpy(d)
    out = torch.zeros(w.shape[0], x.shape[1])
    grad_in = torch.zeros(w.shape[1], x.shape[1])
    grad_w = torch.zeros_like(vals)

    def forward() -> None:
        out.zero_()
        sppb.sparse_linear_vectorized_forward(tx, indptr, indices, vals, out)

    def backward() -> None:
        grad_in.zero_()
        grad_w.zero_()
        sppb.sparse_linear_vectorized_backward(tx, indptr, indices, vals, td, grad_in, grad_w)

    return ({"W X/SparseProp": forward, "W^T G + SDDMM/SparseProp, one pass": backward},
            version("sparseprop"))


def plot(ceilings: dict[str, float], peak: float, points: list[tuple[str, str, float, float]],
         output: Path) -> None:
    """Log-log roofline: the measured ceilings as lines (named at their right end), and each
    kernel a point: colour the implementation, marker the kernel, hollow for n = 16384."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    ai = np.logspace(-1, 1, 50)
    for name, bw in ceilings.items():
        ys = np.minimum(ai * bw / 1e9, peak / 1e9)
        ax.plot(ai, ys, "-" if name.startswith("gather") else ":", color="grey", lw=0.8)
        ax.annotate(f"{name} {bw / 1e9:.0f} GB/s", (ai[0], ys[0]), fontsize=6, color="dimgrey",
                    xytext=(2, 2), textcoords="offset points")
    ax.axhline(peak / 1e9, color="black", lw=1.2)
    ax.annotate(f"SGEMM, 1 thread: {peak / 1e9:.0f} GFLOP/s", (ai[0], peak / 1e9), fontsize=7,
                xytext=(2, 3), textcoords="offset points")
    colours = {"spdnn": "tab:blue", "torch": "tab:red", "SparseProp": "tab:green"}
    shift = {"spdnn": 0.9, "torch": 1.0, "SparseProp": 1.1}  # side by side at one intensity
    shapes = {"W X": "o", "W^T G": "s", "SDDMM": "D", "W^T G + SDDMM": "^"}
    for impl, label, intensity, gflops in points:
        kernel = label.split(" ", 1)[1].split(" spdnn")[0].split(" torch")[0].split(
            " SparseProp")[0]
        colour = colours.get(impl, "black")
        ax.plot(intensity * shift.get(impl, 1.0), gflops, shapes.get(kernel, "x"), ms=7,
                color=colour, mfc="none" if "16384" in label else colour, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.1, 10)
    ax.set_ylim(0.5, 2 * peak / 1e9)
    ax.set_xlabel("flops per gathered byte")
    ax.set_ylabel("GFLOP/s (one thread)")
    ax.set_title("Sparse products of a training step on this CPU (colour: implementation; "
                 "marker: kernel; hollow: n = 16384)", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    with atomic_path(output, "the figure") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    plt.close(fig)


def whole_step(batch: int, steps: int, block_bw: float
               ) -> tuple[list[list[str]], list[tuple[str, float, float]], float | None]:
    """The SGD step of the random network 4096 -> 16384 x 3 -> 10 (fan-in 32, a dense head;
    scripts/bench/bench_train.py's worker, fresh process, 1 thread): spdnn, and PyTorch's
    fastest formulation when this Python has torch. Its bound: every sparse layer gathers its
    nnz x batch values twice (forward; the backward pass, or the first layer's weight
    gradient), at the read bandwidth of a working set of one block (``block_bw``). Returns
    the rows, spdnn's step by phase (``phases``) and PyTorch's step in seconds (or None)."""
    import tempfile

    from spdnn.io.bundle import save_network

    net = train_network("random", 16384)
    sparse = [layer for layer in net.layers if layer.weight.nnz < np.prod(layer.weight.shape)]
    gathered = sum(2 * layer.weight.nnz * batch * 4 for layer in sparse)
    level = level_of(16384 * batch * 4)
    bound = gathered / block_bw
    have_torch = _has("torch")
    rows, split, peer = [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        save_network(net, Path(tmp) / "net.npz")
        kinds = ["spdnn"] + (["embedding_bag"] if have_torch else [])
        for kind in kinds:
            out = train_step(kind, 1, 1, Path(tmp), None, steps, batch)
            median = float(np.median(out["times"]))
            if kind == "spdnn":  # the timers hold means: the rest is against the mean step
                split = phases(net, batch, out, float(np.mean(out["times"])), block_bw)
            else:
                peer = median
            rows.append(["whole step", "spdnn" if kind == "spdnn" else
                         "torch embedding_bag + sampled_addmm", f"{median * 1e3:.1f}",
                         f"{gathered / 1e6:.0f}", level, f"{bound * 1e3:.1f}",
                         f"{bound / median:.2f}"])
            print(" | ".join(rows[-1]), flush=True)
    return rows, split, peer


def phases(net, batch: int, out: dict, step: float,  # noqa: ANN001
           block_bw: float) -> list[tuple[str, float, float]]:
    """(phase, measured seconds, bound seconds) of spdnn's step: each layer's forward and
    backward products (the worker's per-layer compute timers), the update, and the rest of
    the step (the loss, the calls between the products). A sparse layer's bound is its
    gathered bytes (nnz x batch float32) at ``block_bw``; the dense head, the update and the
    rest are outside the step's bound (0), so all of their time is distance."""
    split = []
    for direction in ("forward", "backward"):
        for k, layer in enumerate(net.layers):
            w = layer.weight
            dense = w.nnz == np.prod(w.shape)
            name = f"layer {k + 1} " + ("weight gradient" if direction == "backward" and k == 0
                                        else direction) + (" (dense head)" if dense else "")
            split.append((name, float(out[direction][k]),
                          0.0 if dense else w.nnz * batch * 4 / block_bw))
    split.append(("update", float(out["parts"][2]), 0.0))
    split.append(("the rest (loss, calls)", max(step - sum(t for _, t, _ in split), 0.0), 0.0))
    return split


def plot_phases(split: list[tuple[str, float, float]], peer: float | None,
                output: Path) -> None:
    """Stacked bars of the step by phase: its bound, spdnn's measured time, and PyTorch's
    whole step (not split): the distance is where a phase's segment outgrows its bound's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    colours = plt.get_cmap("tab20").colors
    bars = ["bound", "spdnn"]
    for i, (name, measured, bound) in enumerate(split):
        left = [sum(b for _, _, b in split[:i]), sum(m for _, m, _ in split[:i])]
        ax.barh(bars, [1e3 * bound, 1e3 * measured], left=[1e3 * v for v in left],
                color=colours[i % len(colours)], label=name, edgecolor="white", lw=0.5)
    if peer is not None:
        ax.barh(["PyTorch (whole step)"], [1e3 * peer], color="lightgrey", edgecolor="grey")
    ax.set_xlabel("ms per step (one thread)")
    ax.set_title("The SGD step of 4096 -> 16384 x 3 -> 10 by phase, against its memory bound",
                 fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.invert_yaxis()
    fig.tight_layout()
    with atomic_path(output, "the figure") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    plt.close(fig)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def level_of(nbytes: int) -> str:
    """The level a block of ``nbytes`` lives in (this machine's caches, from sysfs)."""
    sizes = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if "Instruction" in (index / "type").read_text():
                continue
            size = (index / "size").read_text().strip()
            sizes[f"L{(index / 'level').read_text().strip()}"] = int(size[:-1]) << (
                20 if size.endswith("M") else 10)
        except (OSError, ValueError):
            continue
    for level in ("L1", "L2", "L3"):
        if level in sizes and nbytes <= sizes[level]:
            return level
    return "memory"


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """How near its memory bound each kernel runs, spdnn against PyTorch; the whole step."""
    kernels, step = tables[0], tables[1]
    rows = []
    for n in dict.fromkeys(r["n"] for r in kernels):
        mine = [r for r in kernels if r["n"] == n]
        names = list(dict.fromkeys(r["kernel"] for r in mine))

        def bound(prefix: str, mine: list[dict[str, str]] = mine,
                  names: list[str] = names) -> str:
            return " / ".join(next((r["of bound"] for r in mine if r["kernel"] == k
                                    and r["implementation"].startswith(prefix)), "-")
                              for k in names)
        rows.append(summary_row(f"n = {n}: share of the memory bound, {' / '.join(names)}",
                                bound("spdnn"), bound("torch") + " (PyTorch)", "-"))
    ours, peer = step[0], step[1]
    rows.append(summary_row("whole training step against its memory bound (ms)",
                            f"{ours['ms']} ({ours['of bound']} of bound)",
                            f"{peer['ms']} ({peer['implementation']}, {peer['of bound']})",
                            f"{number(peer['ms']) / number(ours['ms']):.2f}x faster"))
    if len(tables) > 2:  # where the distance is
        top = sorted(tables[2], key=lambda r: number(r["distance"]), reverse=True)[:3]
        rows.append(summary_row("the step's distance to its bound by phase (largest shares)",
                                ", ".join(f"{r['phase']}: {r['distance']}" for r in top)))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--figure", default=str(FIGURE), help="where the plot goes")
    ap.add_argument("--steps", type=int, default=10, help="timed steps of the whole step")
    args = ap.parse_args()
    kernels.set_threads(1)
    peak = sgemm_flops(args.repeats)
    reads = {f"read {k}": read_bandwidth(v, args.repeats) for k, v in LEVELS.items()}
    gathers = {k: gather_bandwidth(v, args.batch, args.repeats) for k, v in LEVELS.items()}
    ceilings = {**reads, **{f"gather {k}": v for k, v in gathers.items()}}
    print({k: f"{v / 1e9:.1f} GB/s" for k, v in ceilings.items()}, f"SGEMM {peak / 1e9:.0f} "
          "GFLOP/s", flush=True)
    rng = np.random.default_rng(0)
    rows, points, versions, block_bw = [], [], {}, {}
    for n in args.sizes:
        w, x, d, outs = case(n, args.batch, rng)
        fns = {k: v for k, v in candidates(w, x, d, outs).items() if "scipy" not in k
               and not k.startswith("gather")}
        for name, extra in (("torch", torch_ops(w, x, d)), ("SparseProp", sparseprop_ops(w, x, d))):
            if extra is not None:
                fns.update({k: v for k, v in extra[0].items() if "CSR mm" not in k})
                versions[name] = extra[1]
        times = interleaved(fns, repeats=args.repeats)
        level = level_of(n * args.batch * 4)
        block_bw[n] = read_bandwidth(n * args.batch * 4, args.repeats)
        gathered = w.nnz * args.batch * 4
        for key, seconds in times.items():
            kernel, impl = key.split("/", 1)
            both = kernel.startswith("W^T G +")
            flops = (4 if both else 2) * w.nnz * args.batch
            moved = gathered + w.nnz * 8 + 2 * n * args.batch * 4
            roof = min(peak, flops / gathered * block_bw[n])
            gflops = flops / seconds / 1e9
            rows.append([str(n), kernel, impl, f"{seconds * 1e3:.2f}", f"{gflops:.1f}",
                         f"{gathered / seconds / 1e9:.1f}", f"{moved / 1e6:.0f}", level,
                         f"{roof / 1e9:.1f}", f"{gflops * 1e9 / roof:.2f}"])
            owner = impl.split()[0].rstrip(",")
            points.append((owner, f"n={n} {kernel} {impl}", flops / gathered, gflops))
            print(" | ".join(rows[-1]), flush=True)
    step_bw = block_bw.get(16384) or read_bandwidth(16384 * args.batch * 4, args.repeats)
    step_rows, split, peer = whole_step(args.batch, args.steps, step_bw)
    if not args.no_write:
        plot(ceilings, peak, points, Path(args.figure))
        plot_phases(split, peer, Path(args.figure).with_name(PHASES_FIGURE.name))
    distance = sum(max(m - b, 0.0) for _, m, b in split)
    phase_rows = [[name, f"{m * 1e3:.1f}", f"{b * 1e3:.1f}", f"{b / m:.2f}" if b else "-",
                   f"{100 * max(m - b, 0.0) / distance:.0f}%"] for name, m, b in split]
    for row in phase_rows:
        print(" | ".join(row), flush=True)
    body = (f"Command: `{' '.join(['python scripts/bench/bench_roofline.py', *sys.argv[1:]])}`"
            f" (float32, one thread, median of {args.repeats} interleaved repeats; batch "
            f"{args.batch}; "
            + (", ".join(f"{k} {v}" for k, v in versions.items()) or "without PyTorch and "
               "SparseProp") + "). Ceilings measured in the same run: "
            + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in ceilings.items())
            + f", one-thread SGEMM {peak / 1e9:.0f} GFLOP/s; read at each block's size: "
            + ", ".join(f"n = {n}: {bw / 1e9:.1f} GB/s" for n, bw in block_bw.items())
            + ". Figure: `docs/roofline.png`.\n\n"
            + table(["n", "kernel", "implementation", "ms", "GFLOP/s", "gathered GB/s",
                     "MB moved (gathered + W + blocks)", "block in", "roof GFLOP/s",
                     "of bound"], rows)
            + "\n\nThe whole SGD step (random 4096 -> 16384 x 3 -> 10, fan-in 32, a dense "
            f"head; batch {args.batch}, median of {args.steps} steps in a fresh process, "
            "1 thread): its bound is the gathered bytes at the read bandwidth of a 16 MB "
            "block.\n\n"
            + table(["", "implementation", "ms", "MB gathered", "blocks in", "bound ms",
                     "of bound"], step_rows)
            + "\n\nWhere the distance is: spdnn's step by phase (the worker's per-layer compute "
            "timers; the rest is the step's time outside them), each sparse layer's products "
            "against the bound of their gathered bytes; the dense head, the update and the "
            "rest are outside the bound (all of their time is distance). `distance`: the "
            "phase's share of the sum of (measured - bound). Figure: "
            "`docs/roofline-step.png`.\n\n"
            + table(["phase", "ms", "bound ms", "of bound", "distance"], phase_rows))
    publish(args, "BENCH_ROOFLINE", "Roofline", body, area="Kernels", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
