"""Partition quality and time: plans against the block, cyclic and random baselines.

    python scripts/bench/bench_partition.py [--method sweep|hypergraph] [--quick]
                                      [--objective train|infer] [--networks ...] [--parts P ...]
    python scripts/bench/bench_partition.py --backends kahypar mtkahypar mtkahypar:2 \
                                      [--networks ...]
                                      [--parts ...]
    python scripts/bench/bench_partition.py --exact-sweeps 1 [--objective infer] [--networks ...]

Networks: the Graph Challenge 1024 network from ../shared/data (first 24 layers; all 120 at P=8),
a generated RadiX-Net 4096 network, an MNIST MLP pruned to 10% by magnitude (trained dense by
the serial engine for one epoch; needs ../shared/data/mnist) and a random fixed fan-in network.
Volumes are rows per minibatch, forward + backward with the forward part in parentheses; the
ratios compare the volume the objective minimises (train: forward + backward, the default;
infer: forward only), measured in the same run. Networks whose data is absent are listed as
skipped. The table replaces the section between the BENCH_PARTITION markers (BENCH_PARTITION_INFER
for --objective infer; _SWEEP appended for --method sweep, the default) in the output file.
``--backends`` instead times the hypergraph method
with each backend side by side (section BENCH_BACKENDS; NAME:N runs it on N threads),
``--exact-sweeps N`` plans without and
with N exact one-layer sweeps (section BENCH_EXACT); ``random16k``, the training benchmark's
network, is only run when named.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness import parser, publish, summary_row

from partition.methods import BASELINES, baseline_owners, partition_network
from spdnn.io.graphchallenge import read_graphchallenge
from spdnn.model.generate import prune_dense, radixnet, random_network
from spdnn.model.network import Layer, Network
from spdnn.model.plan import balance_limit, network_patterns, plan_statistics

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


def mnist_pruned() -> Network | None:
    from spdnn.io.loaders import load_mnist
    from spdnn.optim import SGDConfig
    from spdnn.reference import train

    if not (SHARED / "mnist").is_dir():
        return None
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    sizes = [784, 512, 512, 10]
    layers = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = rng.uniform(-1, 1, (n_out, n_in)) / np.sqrt(n_in)
        layers.append(Layer(sp.csr_matrix(w.astype(np.float32)), np.zeros(n_out, np.float32)))
    dense = Network(layers=tuple(layers))
    trained, _ = train(dense, load_mnist(SHARED / "mnist"), 1, 128, SGDConfig(0.05, 0.9))
    pruned = prune_dense([lay.weight.toarray() for lay in trained.layers],
                         [lay.bias for lay in trained.layers], density=0.1)
    return Network(layers=tuple(pruned))


NETWORKS = ("gc24", "radixnet", "mnist", "random", "gc120")
LARGE = ("random16k",)


def networks(quick: bool, chosen: Sequence[str]) -> list[tuple[str, Network | None, str]]:
    out: list[tuple[str, Network | None, str]] = []
    gc = SHARED / "graphchallenge" / "neuron1024"
    gc_net = read_graphchallenge(gc, -0.3, 32) if gc.is_dir() and (
        "gc24" in chosen or "gc120" in chosen) else None
    if "gc24" in chosen:
        out.append(("Graph Challenge 1024, 24 layers",
                    None if gc_net is None else Network(layers=gc_net.layers[:24]),
                        "../shared absent"))
    if "radixnet" in chosen:
        out.append(("RadiX-Net 4096, 12 layers (generated, seed 0)",
                    radixnet(4096, 12, seed=0), ""))
    if "mnist" in chosen:
        out.append(("MNIST MLP 784-512-512-10 pruned to 10%",
                    None if quick else mnist_pruned(), "../shared/data/mnist absent or --quick"))
    if "random" in chosen:
        out.append(("random fan-in 32, 4096-4096-4096-4096", random_network(
            [4096] * 4, 32, seed=0), ""))
    if "random16k" in chosen:
        out.append(("random fan-in 32, 4096-16384-16384-16384", random_network(
            [4096, 16384, 16384, 16384], 32, seed=0), ""))
    if "gc120" in chosen and not quick:
        out.append(("Graph Challenge 1024, all 120 layers (P = 8 only)", gc_net,
                    "../shared absent"))
    return out


def bench(name: str, net: Network, parts: list[int], objective: str,
          method: str = "hypergraph") -> list[str]:
    patterns = network_patterns(net)
    rows = []
    for nparts in parts:
        t0 = time.perf_counter()
        plan = partition_network(patterns, nparts, method=method, epsilon=0.03, seed=0,
                                 objective=objective)
        seconds = time.perf_counter() - t0
        st = {method: plan_statistics(patterns, plan.owners, parts=nparts)}
        for b in BASELINES:
            owners = baseline_owners(b, patterns, parts=nparts, seed=0)
            st[b] = plan_statistics(patterns, owners, parts=nparts)
        h = st[method]
        cost = {m: (s.volume if objective == "train" else s.forward_total) for m, s in st.items()}
        balanced = all(
            np.bincount(plan.owners[k], weights=np.diff(p[0]), minlength=nparts).max()
            <= balance_limit(p[0], nparts, 0.03) + 1e-9 for k, p in enumerate(patterns, 1))
        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1e6
        cells = [name, str(nparts)] + [f"{st[m].volume:,} ({st[m].forward_total:,})"
                                       for m in (method, *BASELINES)]
        hv = cost[method]
        cells += [f"{cost['block'] / hv:.2f}x" if hv else "-",
                  f"{cost['cyclic'] / hv:.2f}x" if hv else "-",
                  f"{max(h.sent):,}", f"{h.messages:,}", f"{100 * h.max_imbalance:.2f}%",
                  "yes" if balanced else "NO", f"{seconds:.1f}", f"{peak:.1f}",
                  plan.meta["chosen_start"]]
        row = "| " + " | ".join(cells) + " |"
        print(row, flush=True)
        rows.append(row)
    return rows


def bench_variants(name: str, net: Network, parts: list[int],
                   variants: Sequence[tuple[str, dict[str, Any]]], objective: str) -> list[str]:
    """The hypergraph method once per variant (label, partition_network keywords), one after
    the other on the same network; the first variant is the reference."""
    patterns = network_patterns(net)
    rows = []
    for nparts in parts:
        cells = [name, str(nparts)]
        cost, seconds = {}, {}
        for label, kwargs in variants:
            t0 = time.perf_counter()
            plan = partition_network(patterns, nparts, method="hypergraph", epsilon=0.03, seed=0,
                                     objective=objective, **kwargs)
            seconds[label] = time.perf_counter() - t0
            st = plan_statistics(patterns, plan.owners, parts=nparts)
            cost[label] = st.volume if objective == "train" else st.forward_total
            cells += [f"{cost[label]:,}", f"{seconds[label]:.1f}", plan.meta["chosen_start"]]
        (first, _), *others = variants
        for label, _ in others:
            cells += [f"{cost[label] / cost[first]:.3f}" if cost[first] else "-",
                      f"{seconds[first] / seconds[label]:.2f}x"]
        row = "| " + " | ".join(cells) + " |"
        print(row, flush=True)
        rows.append(row)
    return rows


def _at(rows: list[dict[str, str]], key: str) -> str:
    return " / ".join(r[key].split(" (")[0] for r in rows)


def volume_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network's rows per step under the hypergraph plan against the block plan, at
    every P of the run."""
    rows = []
    for network in dict.fromkeys(r["network"] for r in tables[0]):
        mine = [r for r in tables[0] if r["network"] == network]
        ratio = next(k for k in mine[0] if k.startswith("block / "))
        method = ratio.split()[2]
        forward = "forward" in ratio  # the inference objective counts forward rows only
        pick = 1 if forward else 0

        def volumes(key: str, mine: list[dict[str, str]] = mine, pick: int = pick) -> str:
            return " / ".join(r[key].split(" (")[pick].rstrip(")") for r in mine)

        rows.append(summary_row(
            f"{network}, {method} method: {'forward ' if forward else ''}rows per step at "
            f"P = {_at(mine, 'P')}",
            volumes(f"{method} volume (forward)") + f" ({_at(mine, 'partition s')} s)",
            volumes("block") + " (block plan)",
            _at(mine, ratio) + " fewer"))
    return rows


def backend_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each other backend's volume and time against KaHyPar's, network by network."""
    rows = []
    for r in tables[0]:
        for backend in [k.removesuffix(" volume") for k in r if k.endswith(" volume")
                        and k != "kahypar volume" and "/" not in k]:
            rows.append(summary_row(
                f"{r['network']}, P = {r['P']}: {backend} (rows per step, s)",
                f"{r[backend + ' volume']}, {r[backend + ' s']} s",
                f"{r['kahypar volume']}, {r['kahypar s']} s (kahypar)",
                f"{r[backend + ' / kahypar volume']}x the volume, "
                f"{r[backend + ' speed vs kahypar']} the speed"))
    return rows


def exact_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The exact one-layer sweep's forward volume against the plain plan's, at every P."""
    rows = []
    for network in dict.fromkeys(r["network"] for r in tables[0]):
        mine = [r for r in tables[0] if r["network"] == network]
        rows.append(summary_row(
            f"{network}: forward rows with one exact sweep, P = {_at(mine, 'P')}",
            _at(mine, "exact 1 volume") + f" ({_at(mine, 'exact 1 s')} s)",
            _at(mine, "plain volume") + f" ({_at(mine, 'plain s')} s, no sweep)",
            _at(mine, "exact 1 / plain volume") + "x the volume"))
    return rows


SUMMARIES = {"BENCH_PARTITION": volume_summary, "BENCH_PARTITION_INFER": volume_summary,
             "BENCH_PARTITION_SWEEP": volume_summary,
             "BENCH_PARTITION_INFER_SWEEP": volume_summary,
             "BENCH_BACKENDS": backend_summary, "BENCH_EXACT": exact_summary}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help="small P set, no MNIST, no 120 layers")
    ap.add_argument("--method", default="sweep", choices=["sweep", "hypergraph"],
                    help="the partitioner's method (default sweep)")
    ap.add_argument("--objective", default="train", choices=["train", "infer"],
                    help="what the plans minimise (spdnn-partition --objective)")
    ap.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=NETWORKS + LARGE,
                    metavar="NET", help=f"subset of {', '.join(NETWORKS + LARGE)} (default: all "
                    f"but {', '.join(LARGE)})")
    ap.add_argument("--parts", nargs="+", type=int, metavar="P",
                    help="numbers of parts (default 2 4 8 16 32 64; with --backends or "
                         "--exact-sweeps: 2 8 64)")
    ap.add_argument("--backends", nargs="+", type=backend_spec, metavar="NAME[:THREADS]",
                    help="compare these backends (kahypar, mtkahypar; the first is the "
                         "reference), e.g. mtkahypar:2 for two threads, instead of the baselines")
    ap.add_argument("--exact-sweeps", type=int, default=0, metavar="N",
                    help="compare plans without and with N exact one-layer sweeps "
                         "(spdnn-partition --exact-sweeps) instead of the baselines")
    args = ap.parse_args()
    if args.backends and args.exact_sweeps:
        ap.error("--backends and --exact-sweeps are separate comparisons: pass one")
    if args.backends or args.exact_sweeps:
        return main_variants(args)
    measure = "volume" if args.objective == "train" else "forward volume"
    m = args.method
    header = (f"| network | P | {m} volume (forward) | block | cyclic | random | "
              f"block / {m} {measure} | cyclic / {m} {measure} | max sent per rank | "
              "messages per step | max layer imbalance | every layer within limit | "
              "partition s | peak RSS GB | best start |\n"
              "|" + " --- |" * 15)
    print(header)
    rows: list[str] = []
    skipped = []
    for name, net, why in networks(args.quick, args.networks):
        if net is None:
            skipped.append(f"- {name}: skipped ({why})")
            continue
        parts = [8] if "120" in name else (args.parts or ([2, 8] if args.quick else
                                                          [2, 4, 8, 16, 32, 64]))
        rows += bench(name, net, parts, args.objective, m)
    cmd = command(args)
    marker = "BENCH_PARTITION" + ("" if args.objective == "train" else "_INFER") + \
        ("_SWEEP" if m == "sweep" else "")
    title = ("Partitioning" + ("" if args.objective == "train" else " for inference")
             + (", sweep method" if m == "sweep" else ", hypergraph method"))
    write_table(args, marker, title, cmd, f"method {m}, objective {args.objective}, "
                "epsilon 0.03, seed 0" + (", KaHyPar backend" if m == "hypergraph" else ""),
                header, rows, skipped)
    return 0


def main_variants(args: argparse.Namespace) -> int:
    if args.backends:
        variants = [(f"{b}:{t}" if t > 1 else b, {"backend": b, "threads": t})
                    for b, t in args.backends]
        marker, title = "BENCH_BACKENDS", "Partitioner backends"
    else:
        variants = [("plain", {}), (f"exact {args.exact_sweeps}",
                                    {"exact_sweeps": args.exact_sweeps})]
        marker, title = "BENCH_EXACT", "Exact one-layer sweeps"
    labels = [label for label, _ in variants]
    first, *others = labels
    header = "| network | P | " + " | ".join(
        f"{b} volume | {b} s | {b} best start" for b in labels) + "".join(
        f" | {b} / {first} volume | {b} speed vs {first}" for b in others) + " |\n|" + \
        " --- |" * (2 + 3 * len(labels) + 2 * len(others))
    print(header)
    rows: list[str] = []
    skipped = []
    for name, net, why in networks(False, args.networks):
        if net is None:
            skipped.append(f"- {name}: skipped ({why})")
            continue
        rows += bench_variants(name, net, [8] if "120" in name else (args.parts or [2, 8, 64]),
                               variants, args.objective)
    threads = "NAME:N on N threads, others on one" if args.backends and any(
        t > 1 for _, t in args.backends) else "one thread"
    write_table(args, marker, title, command(args),
                f"objective {args.objective}, epsilon 0.03, seed 0, {threads}", header, rows,
                skipped)
    return 0


def backend_spec(text: str) -> tuple[str, int]:
    """NAME or NAME:THREADS, e.g. mtkahypar:2."""
    name, _, threads = text.partition(":")
    if name not in ("kahypar", "mtkahypar") or not (threads or "1").isdigit() or \
            int(threads or "1") < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not kahypar or mtkahypar[:THREADS]")
    return name, int(threads or "1")


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, for the table's caption."""
    cmd = "python scripts/bench/bench_partition.py" + (" --quick" if args.quick else "")
    if args.method != "sweep" and not (args.backends or args.exact_sweeps):
        cmd += f" --method {args.method}"
    if args.backends:
        cmd += " --backends " + " ".join(f"{b}:{t}" if t > 1 else b for b, t in args.backends)
    if args.exact_sweeps:
        cmd += f" --exact-sweeps {args.exact_sweeps}"
    if args.objective != "train":
        cmd += f" --objective {args.objective}"
    if list(args.networks) != list(NETWORKS):
        cmd += " --networks " + " ".join(args.networks)
    if args.parts:
        cmd += " --parts " + " ".join(map(str, args.parts))
    return cmd


def write_table(args: argparse.Namespace, marker: str, title: str, cmd: str, setting: str,
                header: str, rows: list[str], skipped: list[str]) -> None:
    body = (f"Command: `{cmd}` (one run, {time.strftime('%Y-%m-%d')}, {setting}).\n\n"
            + header + "\n" + "\n".join(rows) + ("\n\n" + "\n".join(skipped) if skipped else ""))
    publish(args, marker, title, body, area="Partitioning", rows=SUMMARIES[marker],
            command=cmd)


if __name__ == "__main__":
    sys.exit(main())
