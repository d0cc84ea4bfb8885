"""Over a network: training steps under each plan on emulated nodes (spdnn emulate), beside
shared memory, measured and predicted by the cost model.

    python scripts/bench/bench_network.py [--networks main mlp radixnet] [--links shm 100mbit 1gbit
        10gbit] [--layouts 2x1 2x2] [--batch 32] [--steps 10] [--rounds 3]
        [--radixnet-layers 120] [--calibration FILE] [--torch-python PY] [--no-write]

Networks (float32): `main`, the main job's (8x8 digits -> 16x16 -> 16x16 locally connected,
radius 1, shuffled neurons, 10-way head); `mlp`, the MNIST MLP 784 -> 1024 -> 1024 (fan-in 32)
+ head; `radixnet`, RadiX-Net 4096 x L + head; `random` and `radixnet16384`, the cost model's
validation networks (scripts/bench/validate_model.py: 4096 -> 16384 x 3, fan-in 32; RadiX-Net
16384 x 3). Layouts: `2x1`, 2 nodes x 1 rank (grids: 2 parts
under the hypergraph, block and cyclic plans; 1 part x 2 replicas); `2x2`, 2 nodes x 2 ranks,
oversubscribed on this 2-core machine (4 parts under each plan; 2 parts x 2 replicas under the
hypergraph plan; 4 replicas). Links: `shm` is plain mpiexec on one node (shared memory); a rate
is 2 emulated nodes whose links are shaped to it. Each configuration times `steps` SGD steps
after 2 warm-up steps (scripts/bench/validate_model.py's worker: the slowest rank's median step,
`--exchange dense`, which the model assumes) in a fresh job; rounds interleave the
configurations of a network and link in rotated order; medians are kept. Predictions: the cost
model with this machine's calibration (taken first, unless given) and, over a link, with a
calibration taken on the link (`spdnn calibrate` on 2 emulated nodes: its network part is the
link's); for 2 nodes x 2 ranks, a cluster of the two (shared memory within a node). With a Python
that has torch (`--torch-python`, default ./.venv-torch: `cp -a .venv .venv-torch;
.venv-torch/bin/python -m pip install torch==2.13.0`; the copied `pip` script would install into
.venv), each layout adds PyTorch DistributedDataParallel
(scripts/bench/torch_ddp.py: gloo over TCP, the same global batch; on 2x2, 4 DDP ranks, 2 per node)
and the ratio of the grid that `--replicas auto` would pick (the model's faster of the
hypergraph partition and pure data parallelism) to it.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Ranks, number, parser, publish, summary_row, table  # noqa: E402

BIN = Path(sys.executable).parent
WORKER = Path(__file__).resolve().parent / "validate_model.py"
TORCH_DDP = Path(__file__).resolve().parent / "torch_ddp.py"
METHODS = ("hypergraph", "block", "cyclic")


DDP = "PyTorch DDP (gloo)"


def layouts(name: str, ddp: bool = False) -> tuple[int, list[tuple[str, int, str | None]]]:
    """Ranks per node, and the grids: (label, replicas, plan method or None)."""
    if name == "2x1":
        return 1, [*((f"2x1 {m}", 1, m) for m in METHODS), ("1x2", 2, None),
                   *([(DDP, 2, "ddp")] if ddp else [])]
    return 2, [*((f"4x1 {m}", 1, m) for m in METHODS), ("2x2 hypergraph", 2, "hypergraph"),
               ("1x4", 4, None), *([(DDP, 4, "ddp")] if ddp else [])]


def build(name: str, layers: int):  # noqa: ANN201
    from spdnn.model.generate import add_head, local_network, radixnet, random_network

    if name == "main":
        return local_network("8x8", ["16x16", "16x16"], radius=1, seed=0, head=10)
    if name == "mlp":
        return random_network([784, 1024, 1024], 32, seed=0, head=10)
    if name in ("random", "radixnet16384"):  # the validation networks, built as it builds them
        from validate_model import build as validation_network

        return validation_network("random" if name == "random" else "radixnet")
    return add_head(radixnet(4096, layers, seed=0), 10, seed=0)


def worker_command(work: Path, net: str, plan: str | None, replicas: int, batch: int,
                   steps: int) -> list[str]:
    cmd = [sys.executable, str(WORKER), "--worker", "--net", str(work / f"{net}.npz"),
           "--batch", str(batch), "--steps", str(steps), "--replicas", str(replicas)]
    return cmd + (["--plan", str(work / plan)] if plan else [])


def ddp_step(args: argparse.Namespace, net: Path, emu: object | None, ranks: int = 2) -> float:
    """PyTorch DDP's median step on ``ranks`` ranks; a fresh port each time (a port of the
    run before may linger), and one more try if gloo fails to start."""
    for attempt in range(2):
        with socket.socket() as s:  # a free port here; in a fresh namespace any is
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [args.torch_python, "-W", "ignore", str(TORCH_DDP), "--net", str(net), "--batch",
               str(args.batch), "--steps", str(args.steps), "--port", str(port),
               *(["--master", "127.77.0.1", "--iface", "eth0"] if emu is not None else [])]
        try:
            return median_step(Ranks(emu).run(cmd, ranks))
        except SystemExit as exc:
            if attempt:
                raise
            print(f"PyTorch DDP failed once, trying again: {str(exc)[-200:]}", flush=True)
    raise AssertionError("unreachable")


def median_step(proc: subprocess.CompletedProcess) -> float:
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["median"])


def run_layout(work: Path, args: argparse.Namespace, works: dict, layout: str,
               emu: object | None, machine: object, link: str = "shm") -> list[list[str]]:
    """Every network's grids on one link and layout: interleaved rounds, medians, beside the
    model's predictions; ratios to the layout's first grid (2 or 4 parts, hypergraph)."""
    from spdnn.cost.costmodel import predict

    per_node, grids = layouts(layout, bool(args.torch_python))
    ranks, rows = 2 * per_node, []
    for name in args.networks:
        measured: dict[str, list[float]] = {g[0]: [] for g in grids}
        for r in range(args.rounds):
            for label, replicas, method in grids[r % len(grids):] + grids[:r % len(grids)]:
                parts = ranks // replicas
                plan = f"{name}-{parts}-{method}.npz" if parts > 1 else None
                cmd = worker_command(work, name, plan, replicas, args.batch, args.steps)
                if method == "ddp":
                    measured[label].append(ddp_step(args, work / f"{name}.npz", emu, ranks))
                    continue
                measured[label].append(median_step(Ranks(emu).run(cmd, ranks)))
        base = pbase = None
        preds = {}
        over = " (oversubscribed)" * (per_node > 1)
        for label, replicas, method in grids:
            parts = ranks // replicas
            t = statistics.median(measured[label])
            base = base or t
            if method == "ddp":
                rows.append([name, link, f"{layout}{over}", label, f"{t * 1e3:.2f}", "-",
                             f"{t / base:.2f}", "-"])
            else:
                pred = predict(works[name, parts, method if parts > 1 else None], machine,
                               args.batch, replicas).seconds
                pbase, preds[label] = pbase or pred, pred
                rows.append([name, link, f"{layout}{over}", label, f"{t * 1e3:.2f}",
                             f"{pred * 1e3:.2f}", f"{t / base:.2f}", f"{pred / pbase:.2f}"])
            print(" | ".join(rows[-1]), flush=True)
        # What --replicas auto runs with every plan as a candidate: the grid the model predicts
        # fastest; beside the measured fastest, and PyTorch DDP.
        auto = min(preds, key=preds.get)
        fastest = min(preds, key=lambda g: statistics.median(measured[g]))
        t = statistics.median(measured[auto])
        note = f"auto picks {auto}: {t / statistics.median(measured[fastest]):.2f}x the " \
               f"measured fastest ({fastest})"
        if DDP in measured:
            note += f"; {t / statistics.median(measured[DDP]):.2f}x DDP's time"
        rows.append([name, link, f"{layout}{over}", note, "", "", "", ""])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network, link by link: the fastest spdnn grid against PyTorch DDP, and the
    hypergraph plan against the block plan (measured ms per step)."""
    rows = []
    every = tables[0]
    for network in dict.fromkeys(r["network"] for r in every):
        mine = [r for r in every if r["network"] == network and r["measured ms/step"]]
        links = list(dict.fromkeys(r["link"] for r in mine))
        layout = mine[0]["nodes x ranks"]

        def at(link: str, test: Callable[[str], bool],
               mine: list[dict[str, str]] = mine) -> dict[str, str] | None:
            found = [r for r in mine if r["link"] == link and test(r["grid, plan"])]
            return min(found, key=lambda r: number(r["measured ms/step"])) if found else None

        ours = [at(link, lambda g: not g.startswith("PyTorch")) for link in links]
        ddp = [at(link, lambda g: g.startswith("PyTorch")) for link in links]
        hyper = [at(link, lambda g: g.endswith("hypergraph") and not g.startswith("1x"))
                 for link in links]
        block = [at(link, lambda g: g.endswith(" block")) for link in links]
        where = f"{network}, {layout}, over {' / '.join(links)} (ms per step)"
        if any(ddp):
            rows.append(summary_row(
                f"{where}: the fastest grid",
                " / ".join(f"{o['measured ms/step']} ({o['grid, plan']})" for o in ours),
                " / ".join(d["measured ms/step"] if d else "-" for d in ddp) + " (PyTorch DDP)",
                " / ".join(f"{number(o['measured ms/step']) / number(d['measured ms/step']):.2f}x"
                           if d else "-" for o, d in zip(ours, ddp)) + " the time"))
        if all(hyper) and all(block):
            rows.append(summary_row(
                f"{where}: hypergraph plan",
                " / ".join(h["measured ms/step"] for h in hyper),
                " / ".join(b["measured ms/step"] for b in block) + " (block plan)",
                " / ".join(f"{number(b['measured ms/step']) / number(h['measured ms/step']):.2f}x"
                           for h, b in zip(hyper, block)) + " faster"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--networks", nargs="+", choices=["main", "mlp", "radixnet", "random",
                                                      "radixnet16384"],
                    default=["main", "mlp"])
    ap.add_argument("--links", nargs="+", default=["shm", "100mbit", "1gbit", "10gbit"])
    ap.add_argument("--layouts", nargs="+", choices=["2x1", "2x2"], default=["2x1"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--radixnet-layers", type=int, default=120)
    ap.add_argument("--calibration", help="calibration file (default: mpiexec -n 2 spdnn "
                                          "calibrate first)")
    ap.add_argument("--torch-python", default=str(Path(__file__).resolve().parents[2]
                                                  / ".venv-torch" / "bin" / "python"),
                    help="a Python with torch==2.13.0 and spdnn, for the PyTorch DDP rows "
                         "(every layout; skipped when absent)")
    args = ap.parse_args()
    if not Path(args.torch_python).exists():
        print(f"no {args.torch_python}: no PyTorch DDP rows", flush=True)
        args.torch_python = None

    from partition.methods import partition_network
    from spdnn.cost.cluster import Cluster, Machine
    from spdnn.cost.costmodel import single_part
    from spdnn.cost.machine import load_calibration
    from spdnn.cost.workload import workload
    from spdnn.emulate import Cluster as Emulated
    from spdnn.emulate import parse_rate
    from spdnn.io.bundle import save_network
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import network_patterns
    from spdnn.model.reports import short_sizes

    rows: list[list[str]] = []
    links_seen: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cal_path = args.calibration or str(work / "calibration.json")
        if not args.calibration:
            print("calibrating (mpiexec -n 2 spdnn calibrate) ...", flush=True)
            subprocess.run([str(BIN / "mpiexec"), "-n", "2", str(BIN / "spdnn"), "calibrate",
                            "-o", cal_path, "--dtype", "float32"], check=True,
                           capture_output=True, timeout=900)
        cal = load_calibration(cal_path)
        works = {}
        for name in args.networks:
            net = build(name, args.radixnet_layers)
            save_network(net, work / f"{name}.npz")
            pats = network_patterns(net)
            works[name, 1, None] = workload(pats, single_part(net.sizes))
            for parts in sorted({2} | ({4, 2} if "2x2" in args.layouts else set())):
                for m in METHODS:
                    plan = partition_network(pats, parts, method=m, seed=0,
                                             fingerprint=net.fingerprint())
                    save_plan(plan, work / f"{name}-{parts}-{m}.npz")
                    works[name, parts, m] = workload(pats, plan)
            print(f"{name}: {short_sizes(net.sizes)}, plans made", flush=True)
        for link in args.links:
            if link == "shm":
                for layout in args.layouts:
                    rows += run_layout(work, args, works, layout, None, Machine(cal))
                continue
            with Emulated(nodes=2, rate_bps=parse_rate(link)) as emu:
                links_seen[link] = emu.measure().describe(parse_rate(link))
                # The link's own calibration: 1 rank per node, so its network part (latency,
                # ping-pong and all-reduce curves, costs per message) is the link's.
                path = work / f"calibration-{link}.json"
                print(f"calibrating over {link} ...", flush=True)
                Ranks(emu).run([str(BIN / "spdnn"), "calibrate", "-o", str(path), "--dtype",
                                "float32"], 2, timeout=900)
                over = load_calibration(path)
                assert cal.network is not None and over.network is not None
                for layout in args.layouts:
                    # A cluster, so that the model knows the ranks are on separate nodes
                    # (messages overlap with work instead of being copied by a CPU): shared
                    # memory within a node, the link between them, each as calibrated.
                    per_node = layouts(layout)[0]
                    machine = Machine(over if per_node == 1 else cal, Cluster(
                        name=f"emulated {link}", ranks_per_node=per_node, intra=cal.network,
                        inter=over.network, sources=("spdnn calibrate",),
                        assumptions="the calibrated shared memory and link"))
                    rows += run_layout(work, args, works, layout, emu, machine, link)
    header = ["network", "link", "nodes x ranks", "grid, plan", "measured ms/step",
              "predicted ms/step", "measured / first row", "predicted / first row"]
    body = table(header, rows)
    notes = "\n".join(f"- {k}: {v}" for k, v in links_seen.items())
    cmdline = " ".join(["python scripts/bench/bench_network.py", *sys.argv[1:]])
    nets = ", ".join(args.networks)
    tag = "-".join(args.networks) + ("" if args.batch == 32 else f"-batch{args.batch}")
    title = nets + ("" if args.batch == 32 else f", batch {args.batch}")
    if args.layouts == ["2x2"]:  # its own section beside the one with both layouts
        tag, title = f"{tag}-2x2", f"{title}, 2 nodes x 2 ranks"
    publish(args, f"bench-network-{tag}", f"Over a network: {title}",
            f"`{cmdline}` (batch {args.batch}, median of {args.rounds} rounds of {args.steps} "
            f"steps)\n\n{body}\n\nLinks as measured by the emulation:\n{notes}\n",
            area="Over a network", rows=summary, command=cmdline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
