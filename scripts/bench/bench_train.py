"""The SGD training step: spdnn against the fastest PyTorch formulations we know, side by side.

    python scripts/bench/bench_train.py [--hidden 16384] [--batch 256] [--steps 10] [--rounds 3]
                                  [--structure random radixnet] [--no-write]
    python scripts/bench/bench_train.py --recipes | --activations | --dtypes [--hidden ...]

Networks (float32, a dense 10-way head, synthetic inputs and labels): `random`, fixed fan-in 32,
4096 -> H -> H -> H (the worst case for partitioning: almost every row is cut); `radixnet`, the
first 3 RadiX-Net layers of H neurons (structured sparsity, 32 nonzeros per row).

One SGD step (forward, cross-entropy, backward, SGD with momentum 0.9 and its update) is timed in
a fresh process per configuration and round, rounds interleaved, after 2 warm-up steps:
spdnn at P = 1 with 1 and 2 kernel threads and at P = 2 (hypergraph and block plans, 1 thread
per rank; the step time is the slowest rank's), and PyTorch (`pip install torch==2.13.0`, not
a dependency of spdnn) with 1 and 2 threads in the three formulations of
scripts/bench/torch_baselines.py:
embedding_bag + sampled_addmm (the fastest), CSR + sampled_addmm, and the naive COO one (2
steps, one round: it is far slower); and SparseProp (`pip install sparseprop`, as its authors
ship it; its OpenMP pool of 1 or 2 threads) when it imports. Each variant is first checked
against spdnn's serial reference (float64; SparseProp, float32 only, within 1e-4). The last
table is where spdnn's P = 1 step goes, per layer. Writes the tables to docs/BENCHMARKS.md.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import median_of, number, parser, publish, summary_row, table  # noqa: E402

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve()


def worker(args: argparse.Namespace) -> None:
    """One configuration's step times (and spdnn's per-layer split) as JSON on stdout."""
    rng = np.random.default_rng(0)
    from spdnn.io.bundle import load_network

    if args.worker == "spdnn":
        from spdnn.comm.mpi import Communicator
        from spdnn.kernels import products as kernels
        from spdnn.kernels.update import PARALLEL
        from spdnn.optim import config_of, interleave, make
        from spdnn.runtime.session import open_network

        kernels.set_threads(args.threads)
        comm = Communicator()
        dnet = open_network(comm, args.net, args.plan, args.dtype, 1).dnet
        n0 = dnet.sizes[0]
        x = rng.standard_normal((args.batch, n0)).astype(np.float32)
        y = rng.integers(0, 10, args.batch)
        xs = np.ascontiguousarray(x[:, dnet.input_rows].T)
        # as `spdnn train` makes it: SGD with momentum 0.9, or another optimizer's defaults
        config = config_of("sgd", lr=0.01, momentum=0.9) if args.optimizer == "sgd" else \
            config_of(args.optimizer)
        opt = make(config, dnet.parameters(), parallel=PARALLEL)
        parts = []

        def step() -> None:
            t0 = time.perf_counter()
            fwd = dnet.forward(xs)
            t1 = time.perf_counter()
            _, _, gw, gb = dnet.backward(fwd, y, "cross_entropy")
            t2 = time.perf_counter()
            opt.step(interleave(gw, gb))
            dnet.weights_updated()  # bfloat16: the products' copy of the weights
            parts.append([t1 - t0, t2 - t1, time.perf_counter() - t2])

        def timed() -> float:
            comm.barrier()
            t0 = time.perf_counter()
            step()
            return float(comm.allreduce(np.array([time.perf_counter() - t0]), "max")[0])
    else:
        import torch
        import torch_baselines as tb

        torch.set_num_threads(args.threads)
        # spdnn flushes its softmax gradient's subnormals (spdnn.kernels.softmax); PyTorch
        # flushes them in every operation here (FTZ/DAZ on its threads): the faster choice a
        # user on an Intel CPU would make (steadier step times on one thread there).
        torch.set_flush_denormal(True)
        net = load_network(args.net)
        n0 = net.sizes[0]
        x = rng.standard_normal((args.batch, n0)).astype(np.float32)
        y = rng.integers(0, 10, args.batch)
        model = tb.TorchNet(net, args.worker)

        def timed() -> float:
            t0 = time.perf_counter()
            model.step(x, y)
            return time.perf_counter() - t0
        comm = dnet = None
    for _ in range(2):
        timed()
    if dnet is not None:
        dnet.timers.compute[:] = 0
        parts.clear()
    times = [timed() for _ in range(args.steps)]
    out = {"times": times}
    if dnet is not None:
        out["forward"] = (dnet.timers.compute[0] / args.steps).tolist()
        out["backward"] = (dnet.timers.compute[1] / args.steps).tolist()
        out["parts"] = np.median(np.array(parts), axis=0).tolist()
    if comm is None or comm.rank == 0:
        print(json.dumps(out))


def run(kind: str, threads: int, ranks: int, work: Path, plan: str | None, steps: int,
        batch: int, optimizer: str = "sgd", net: str = "net.npz",
        dtype: str = "float32") -> dict:
    cmd = [sys.executable, str(HERE), "--worker", kind, "--threads", str(threads), "--net",
           str(work / net), "--steps", str(steps), "--batch", str(batch),
           "--optimizer", optimizer, "--dtype", dtype]
    if plan:
        cmd += ["--plan", str(work / plan)]
    if ranks > 1:
        cmd = [str(BIN / "mpiexec"), "-n", str(ranks)] + cmd
    # This process pinned every pool to 1 when it imported spdnn. A worker sizes numba's pool
    # (what `spdnn --threads N` does) and torch sets its own; BLAS stays at 1 thread: OpenBLAS
    # workers spin after each call and took a core from the numba threads (2 threads gained
    # almost nothing over 1 when BLAS had 2 as well).
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "NUMBA_NUM_THREADS": str(threads)}
    if kind == "sparseprop":  # its kernels' OpenMP pool (its own libgomp, not torch's)
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def configurations(have_torch: bool, variants: tuple[str, ...] = ()
                   ) -> list[tuple[str, str, int, int, str | None]]:
    """(label, worker kind, threads per rank, ranks, plan) of every configuration."""
    out = [("spdnn P=1", "spdnn", 1, 1, None),
           ("spdnn P=1, 2 threads", "spdnn", 2, 1, None),
           ("spdnn P=2, hypergraph plan", "spdnn", 1, 2, "hyper.npz"),
           ("spdnn P=2, block plan", "spdnn", 1, 2, "block.npz")]
    if have_torch:
        for variant, name in (("embedding_bag", "embedding_bag + sampled_addmm"),
                              ("csr", "CSR mm + sampled_addmm"),
                              ("coo (naive)", "naive: COO rebuilt each step")):
            out += [(f"PyTorch {name}, 1 thread", variant, 1, 1, None),
                    (f"PyTorch {name}, 2 threads", variant, 2, 1, None)]
    if "sparseprop" in variants:  # the specialist library, as its authors ship it
        out += [("SparseProp, 1 thread", "sparseprop", 1, 1, None),
                ("SparseProp, 2 threads", "sparseprop", 2, 1, None)]
    return out


def bench(structure: str, net, args) -> tuple[list[list[str]], list[list[str]], str]:  # noqa: ANN001
    from partition.methods import partition_network
    from spdnn.io.bundle import save_network
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import network_patterns, plan_statistics

    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        print("torch not installed: PyTorch rows skipped", flush=True)
        have_torch = False
    times: dict[str, list[float]] = {}
    info: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        save_network(net, work / "net.npz")
        t0 = time.perf_counter()
        hyper = partition_network(network_patterns(net), 2, method="hypergraph",
                                  fingerprint=net.fingerprint())
        save_plan(hyper, work / "hyper.npz")
        print(f"{structure}: hypergraph plan in {time.perf_counter() - t0:.0f} s", flush=True)
        block = partition_network(network_patterns(net), 2, method="block",
                                  fingerprint=net.fingerprint())
        save_plan(block, work / "block.npz")
        volume = {name: plan_statistics(network_patterns(net), p.owners, parts=2).volume
                  for name, p in (("hypergraph", hyper), ("block", block))}
        import torch_baselines as tb

        configs = configurations(have_torch, tb.available() if have_torch else ())
        for r in range(args.rounds):
            for label, kind, threads, ranks, plan in configs:
                naive = kind == "coo (naive)"
                if naive and r > 0:
                    continue
                out = run(kind, threads, ranks, work, plan, 2 if naive else args.steps,
                          args.batch)
                times.setdefault(label, []).extend(out["times"])
                if label in ("spdnn P=1", "spdnn P=1, 2 threads"):
                    info.setdefault(label, []).append(out)
                print(f"round {r + 1} {structure}, {label}: median "
                      f"{1e3 * statistics.median(out['times']):.0f} ms", flush=True)
    best_torch = {}
    for label, kind, threads, _, _ in configs:
        if kind in ("embedding_bag", "csr"):
            med = statistics.median(times[label])
            best_torch[threads] = min(best_torch.get(threads, med), med)
    rows = []
    for label, _kind, threads, ranks, _ in configs:
        t = times[label]
        cores = threads * ranks
        ratio = (f"{statistics.median(t) / best_torch[cores]:.2f}" if cores in best_torch
                 else "")
        rows.append([structure, label, str(cores), f"{1e3 * min(t):.0f} / "
                     f"{1e3 * statistics.median(t):.0f}", ratio])
    # Where spdnn's P = 1 step goes at 1 and 2 threads: the median over rounds of each layer's
    # compute time, and what the second thread gains on each.
    med = {label: {key: np.median([o[key] for o in info[label]], axis=0) * 1e3
                   for key in ("forward", "backward", "parts")} for label in info}
    one, two = med["spdnn P=1"], med["spdnn P=1, 2 threads"]

    def cells(a: float, b: float) -> list[str]:
        return [f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}x" if b > 0 else ""]

    split = [[structure, f"layer {k + 1} ({net.layers[k].weight.shape[0]} x "
              f"{net.layers[k].weight.shape[1]}, {net.layers[k].weight.nnz:,} nnz)"]
             + cells(one["forward"][k], two["forward"][k])
             + cells(one["backward"][k], two["backward"][k]) for k in range(net.n_layers)]
    for name, k in (("forward", 0), ("backward", 1), ("SGD update and refresh", 2)):
        split.append([structure, f"whole step: {name}"] + cells(one["parts"][k],
                                                              two["parts"][k]) + ["", "", ""])
    sizes = " -> ".join(str(n) for n in net.sizes)
    return rows, split, (f"`{structure}`: {sizes}, {net.nnz:,} weights; rows exchanged per "
                         f"minibatch at P = 2: hypergraph plan {volume['hypergraph']:,}, "
                         f"block plan {volume['block']:,}.")


def side_by_side(nets: dict, args, optimizers: dict | None = None,  # noqa: ANN001
                 dtypes: dict | None = None, splits: dict | None = None) -> list[list[str]]:
    """The step of each variant (its network, its optimizer from ``optimizers`` and its value
    type from ``dtypes``) at P = 1, one thread, one process per variant and round, rounds
    interleaved: rows of the variant, ms best / median, and the ratio of medians to the first
    variant's. ``splits``: filled with each variant's per-layer forward and backward times
    and its phases (forward, backward, update), lists over the rounds."""
    from spdnn.io.bundle import save_network

    times: dict[str, list[float]] = {name: [] for name in nets}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, net in nets.items():
            save_network(net, work / f"{name}.npz")
        for r in range(args.rounds):
            for name in nets:
                out = run("spdnn", 1, 1, work, None, args.steps, args.batch,
                          (optimizers or {}).get(name, "sgd"), net=f"{name}.npz",
                          dtype=(dtypes or {}).get(name, "float32"))
                times[name] += out["times"]
                if splits is not None:
                    splits.setdefault(name, []).append(out)
                print(f"round {r + 1}, {name}: median "
                      f"{1e3 * statistics.median(out['times']):.0f} ms", flush=True)
    base = statistics.median(next(iter(times.values())))
    return [[name, f"{1e3 * min(t):.0f} / {1e3 * statistics.median(t):.0f}",
             f"{statistics.median(t) / base:.3f}"] for name, t in times.items()]


def _setup(flag: str, net, args) -> str:  # noqa: ANN001
    sizes = " -> ".join(str(n) for n in net.sizes)
    return (f"Command: `python scripts/bench/bench_train.py {flag} --hidden {args.hidden} "
            f"--batch {args.batch} --steps {args.steps} --rounds {args.rounds}`. The random "
            f"network {sizes} ({net.nnz:,} weights), float32, batch {args.batch}, P = 1, one "
            f"thread; one process per variant and round, {args.steps} timed steps after 2 "
            f"warm-up steps, {args.rounds} interleaved rounds.")


def recipes(net, args) -> str:  # noqa: ANN001
    """The step of each optimizer against SGD with momentum (the table's ratio)."""
    names = ("sgd", "adam", "adamw")
    rows = side_by_side({n: net for n in names}, args, {n: n for n in names})
    return (_setup("--recipes", net, args) + " sgd: momentum 0.9; adam, adamw: torch's "
            "defaults.\n\n"
            + table(["optimizer", "ms / step, best / median", "vs SGD with momentum"], rows))


ACTIVATIONS = ("relu", "leaky_relu", "tanh", "sigmoid", "gelu", "gelu_tanh")


def activations(net, args) -> str:  # noqa: ANN001
    """The SGD step of the same network with each hidden activation, against ReLU."""
    rows = side_by_side({a: net.with_activations(a) for a in ACTIVATIONS}, args)
    return (_setup("--activations", net, args) + " The one activation on every hidden "
            "layer; SGD with momentum 0.9.\n\n"
            + table(["activation", "ms / step, best / median", "vs ReLU"], rows))


def value_types(args) -> str:  # noqa: ANN001
    """The step in bfloat16 against float32, on each network (SGD with momentum 0.9)."""
    parts, rows, phases = [], [], []
    for structure in args.structure:
        net = build(structure, args.hidden)
        variants = {f"{structure}, {dt}": net for dt in ("float32", "bfloat16")}
        splits: dict = {}
        got = side_by_side(variants, args, dtypes={f"{structure}, {dt}": dt
                                                   for dt in ("float32", "bfloat16")},
                           splits=splits)
        rows += got
        phases += _phases(structure, net, splits)
        parts.append(f"`{structure}`: {' -> '.join(str(n) for n in net.sizes)}, "
                     f"{net.nnz:,} weights.")
    return (f"Command: `python scripts/bench/bench_train.py --dtypes --hidden {args.hidden} "
            f"--batch {args.batch} --steps {args.steps} --rounds {args.rounds} --structure "
            f"{' '.join(args.structure)}`. " + " ".join(parts) + f" Batch {args.batch}, "
            "P = 1, one thread, SGD with momentum 0.9 (its update and, in bfloat16, the "
            f"rounding of the weights' copy included); one process per variant and round, "
            f"{args.steps} timed steps after 2 warm-up steps, {args.rounds} interleaved "
            "rounds.\n\n"
            + table(["network, value type", "ms / step, best / median", "vs float32"],
                    _against_float32(rows))
            + "\n\nWhere the step goes (ms per step, median over the rounds; a layer's "
            "forward is its product with the activation, its backward W^T G with the slope "
            "and the weight and bias gradients, and in bfloat16 the rounding of its error "
            "block; the update includes the rounding of the weights' copy):\n\n"
            + table(["network", "part", "float32", "bfloat16", "bfloat16 / float32"], phases))


def _phases(structure: str, net, splits: dict) -> list[list[str]]:  # noqa: ANN001
    """Per layer and phase: the median over the rounds of each type's time."""
    def med(dtype: str, pick) -> float:  # noqa: ANN001
        return 1e3 * statistics.median(pick(out) for out in splits[f"{structure}, {dtype}"])

    rows = []
    picks = [(f"layer {k + 1} ({net.layers[k].weight.shape[0]} x "
              f"{net.layers[k].weight.shape[1]}), {what}",
              lambda out, k=k, what=what: out[what][k])
             for k in range(net.n_layers) for what in ("forward", "backward")]
    picks += [(f"whole step: {name}", lambda out, i=i: out["parts"][i])
              for i, name in enumerate(("forward", "backward", "update"))]
    for label, pick in picks:
        a, b = med("float32", pick), med("bfloat16", pick)
        rows.append([structure, label, f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}"])
    return rows


def _against_float32(rows: list[list[str]]) -> list[list[str]]:
    """Each row's median over its network's float32 row's (rows come in pairs)."""
    out = []
    for f32, bf16 in zip(rows[::2], rows[1::2]):
        base = number(f32[2])
        out += [[f32[0], f32[1], "1.000"], [bf16[0], bf16[1], f"{number(bf16[2]) / base:.3f}"]]
    return out


def dtype_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """bfloat16's step against float32's, per network."""
    rows = tables[0]
    return [summary_row(f"training step, {b['network, value type']} (ms, median)",
                        f"{median_of(b['ms / step, best / median']):.0f}",
                        f"{median_of(f['ms / step, best / median']):.0f} (float32)",
                        f"{number(b['vs float32']):.2f}x the time")
            for f, b in zip(rows[::2], rows[1::2])]


def build(structure: str, hidden: int):  # noqa: ANN201
    from spdnn.model.generate import add_head, radixnet, random_network

    if structure == "random":
        return random_network([4096, hidden, hidden, hidden], 32, seed=0, head=10)
    return add_head(radixnet(hidden, 3, seed=0), 10, seed=0)


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """spdnn's step against the fastest PyTorch formulation, on 1 and on 2 cores."""
    rows = []
    steps = tables[0]
    for network in dict.fromkeys(r["network"] for r in steps):
        for cores in ("1", "2"):
            mine = [r for r in steps if r["network"] == network and r["cores"] == cores]
            ours = min((r for r in mine if r["configuration"].startswith("spdnn")),
                       key=lambda r: median_of(r["ms / step, best / median"]))
            peer = min((r for r in mine if r["configuration"].startswith("PyTorch")),
                       key=lambda r: median_of(r["ms / step, best / median"]))
            rows.append(summary_row(
                f"training step, {network}, {cores} core{'s' if cores == '2' else ''} "
                "(ms, median)",
                f"{median_of(ours['ms / step, best / median']):.0f} "
                f"({ours['configuration'].removeprefix('spdnn ')})",
                f"{median_of(peer['ms / step, best / median']):.0f} "
                f"({peer['configuration'].removeprefix('PyTorch ')})",
                f"{ours['vs best PyTorch, same cores']}x the time"))
    return rows


def recipe_summary(column: str, baseline: str) -> Callable[[list], list[dict[str, str]]]:
    """Each optimizer's (or activation's) step against the baseline's, as the table has it."""
    def rows(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
        base = next(r for r in tables[0] if r[column] == baseline)
        ratio = next(k for k in tables[0][0] if k.startswith("vs "))
        return [summary_row(f"training step, random 16384 x 3, {r[column]} (ms, median)",
                            f"{median_of(r['ms / step, best / median']):.0f}",
                            f"{median_of(base['ms / step, best / median']):.0f} ({baseline})",
                            f"{number(r[ratio]):.2f}x the time")
                for r in tables[0] if r[column] != baseline]
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--structure", nargs="+", choices=["random", "radixnet"],
                    default=["random", "radixnet"])
    ap.add_argument("--recipes", action="store_true",
                    help="time each optimizer's step instead (the random network)")
    ap.add_argument("--activations", action="store_true",
                    help="time the step with each hidden activation instead (the random "
                         "network)")
    ap.add_argument("--dtypes", action="store_true",
                    help="time the step in bfloat16 against float32 instead")
    ap.add_argument("--optimizer", default="sgd", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--net", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.recipes:
        publish(args, "BENCH_RECIPES", "Training recipes: optimizers",
                recipes(build("random", args.hidden), args), area="Training",
                rows=recipe_summary("optimizer", "sgd"))
        return 0
    if args.dtypes:
        publish(args, "BENCH_BFLOAT16_STEP", "bfloat16: the training step",
                value_types(args), area="Training", rows=dtype_summary)
        return 0
    if args.activations:
        publish(args, "BENCH_ACTIVATIONS", "Training recipes: activations",
                activations(build("random", args.hidden), args), area="Training",
                rows=recipe_summary("activation", "relu"))
        return 0
    try:
        import torch_baselines as tb

        for variant in tb.available():
            print(f"PyTorch {variant}: gradients within {tb.check(variant):.1e} of spdnn's "
                  "serial reference", flush=True)
    except ImportError:
        pass
    rows, split, notes = [], [], []
    for structure in args.structure:
        r, s, note = bench(structure, build(structure, args.hidden), args)
        rows += r
        split += s
        notes.append(note)
    body = (f"Command: `python scripts/bench/bench_train.py --hidden {args.hidden} --batch "
            f"{args.batch} --steps {args.steps} --rounds {args.rounds} --structure "
            f"{' '.join(args.structure)}`. float32, batch {args.batch}; one process per "
            f"configuration and round, {args.steps} timed steps each after 2 warm-up steps, "
            f"{args.rounds} interleaved rounds (the naive COO row: 2 steps, 1 round). "
            + " ".join(notes) + " The last column is the median step time over that of the "
            "faster of the two well-written PyTorch formulations on the same number of "
            "cores (below 1: spdnn is faster).\n\n"
            + table(["network", "configuration", "cores", "ms / step, best / median",
                     "vs best PyTorch, same cores"], rows)
            + "\n\nWhere spdnn's P = 1 step goes at 1 and 2 threads (its own timers, ms per "
            "step, median over rounds; a layer's backward is its weight gradient with the "
            "bias gradient, its W^T G and the activation mask; `gain`: 1 thread's time over "
            "2 threads'):\n\n"
            + table(["network", "layer", "forward 1t", "forward 2t", "gain", "backward 1t",
                     "backward 2t", "gain"], split))
    publish(args, "BENCH_TRAIN", "Training", body, area="Training", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
