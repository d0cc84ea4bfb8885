"""Over a network: Graph Challenge inference under each plan on 2 emulated nodes (spdnn
emulate), beside shared memory.

    python scripts/bench/bench_challenge_link.py [--neurons 1024] [--layers 120] [--inputs 10000]
        [--links shm 100mbit 1gbit 10gbit] [--rounds 3] [--work DIR] [--no-write]

Network: RadiX-Net NEURONS x LAYERS with the challenge's bias and cap (as
scripts/bench/bench_challenge.py makes it); inputs: the first INPUTS MNIST training images made
challenge inputs (`spdnn generate challenge-images`, needs ../shared/data/mnist). Grids, one rank
per node: 2 parts under the hypergraph, block and cyclic plans, and 1 part x 2 replicas (each
replica its share of the inputs, nothing exchanged). `spdnn infer` as a user runs it (its
default sparse exchange, one thread per rank); the time is the inference loop's (slowest
rank), the bytes are those the ranks sent. Every grid's categories must equal the first's.
Rounds interleave the grids in rotated order; medians are kept. --work keeps the network,
images and plans for the next run.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_challenge import BIASES, ENV  # noqa: E402
from harness import SHARED, parser, publish, run_job, summary_row, table  # noqa: E402

BIN = Path(sys.executable).parent
GRIDS = [("2 parts, hypergraph plan", "hypergraph"), ("2 parts, block plan", "block"),
         ("2 parts, cyclic plan", "cyclic"), ("1 part x 2 replicas", None)]


def prepare(work: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Network, images and the three plans, made once into ``work``."""
    spdnn = str(BIN / "spdnn")
    side = int(round(args.neurons ** 0.5))
    files = {"net": work / f"rx{args.neurons}x{args.layers}.npz",
             "images": work / f"img{side}-{args.inputs}.npz"}
    if not files["net"].exists():
        subprocess.run([spdnn, "generate", "radixnet", "--neurons", str(args.neurons),
                        "--layers", str(args.layers), "--bias", str(BIASES[args.neurons]),
                        "--cap", "32", "--seed", "0", "-o", str(files["net"])], check=True,
                       env=ENV)
    if not files["images"].exists():
        subprocess.run([spdnn, "generate", "challenge-images", "--mnist", str(SHARED / "mnist"),
                        "--size", str(side), "--count", str(args.inputs), "-o",
                        str(files["images"])], check=True, env=ENV)
    for _, method in GRIDS:
        if method is None:
            continue
        plan = work / f"{files['net'].stem}-2-{method}.npz"
        files[method] = plan
        if not plan.exists():
            subprocess.run([str(BIN / "spdnn-partition"), str(files["net"]), "-P", "2",
                            "--method", method, "-o", str(plan), "--quiet"], check=True,
                           env=ENV)
    return files


def run_grid(files: dict[str, Path], method: str | None, emu: object | None,
             out: Path) -> dict:
    arguments = ["infer", "--network", str(files["net"]), "--inputs", str(files["images"]),
                 "--comm-timeout", "0", "--categories-out", str(out) + ".cats"]
    arguments += ["--plan", str(files[method])] if method else ["--replicas", "2"]
    m = run_job(arguments, 2, metrics=out, emulated=emu).metrics
    m["categories_digest"] = Path(str(out) + ".cats").read_text()
    return m


def bench_link(files: dict[str, Path], link: str, emu: object | None, rounds: int,
               tmp: Path) -> list[list[str]]:
    seconds: dict[str, list[float]] = {g: [] for g, _ in GRIDS}
    sent: dict[str, float] = {}
    first = None
    for r in range(rounds):
        for label, method in GRIDS[r % len(GRIDS):] + GRIDS[:r % len(GRIDS)]:
            m = run_grid(files, method, emu, tmp / "m.json")
            if first is None:
                first = m["categories_digest"]
            elif m["categories_digest"] != first:
                raise SystemExit(f"{label} over {link}: categories differ from the first grid's")
            seconds[label].append(m["seconds"])
            counted = m["traffic"]["counted"]
            sent[label] = sum(counted["forward_sent"]) / 1e6
            edges_inputs = m["rate"] * m["seconds"]
    rows = []
    base = statistics.median(seconds[GRIDS[0][0]])
    for label, _ in GRIDS:
        t = statistics.median(seconds[label])
        rows.append([link, label, f"{t:.3f}", f"{edges_inputs / t:.3g}", f"{sent[label]:.1f}",
                     f"{t / base:.2f}"])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Inference over each link: the hypergraph plan against the block plan and against
    replicas (which send nothing)."""
    rows = []
    for link in dict.fromkeys(r["link"] for r in tables[0]):
        mine = {r["grid (2 nodes x 1 rank)"]: r for r in tables[0] if r["link"] == link}
        hyper, block = mine["2 parts, hypergraph plan"], mine["2 parts, block plan"]
        rows.append(summary_row(
            f"Graph Challenge inference over {link}, 2 parts (s; MB sent)",
            f"{hyper['inference s']}; {hyper['MB sent']} (hypergraph plan)",
            f"{block['inference s']}; {block['MB sent']} (block plan)",
            f"{block['time / hypergraph']}x faster"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--neurons", type=int, choices=sorted(BIASES), default=1024)
    ap.add_argument("--layers", type=int, default=120)
    ap.add_argument("--inputs", type=int, default=10_000)
    ap.add_argument("--links", nargs="+", default=["shm", "100mbit", "1gbit", "10gbit"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", help="keep the network, images and plans here")
    args = ap.parse_args()
    if not (SHARED / "mnist").is_dir():
        ap.error(f"the challenge images are made from {SHARED / 'mnist'}, which is absent")
    from spdnn.emulate import Cluster as Emulated
    from spdnn.emulate import parse_rate

    rows, measured = [], []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        work = Path(args.work) if args.work else tmp
        work.mkdir(parents=True, exist_ok=True)
        files = prepare(work, args)
        for link in args.links:
            if link == "shm":
                rows += bench_link(files, link, None, args.rounds, tmp)
                continue
            with Emulated(nodes=2, rate_bps=parse_rate(link)) as emu:
                measured.append(f"- {link}: {emu.measure().describe(parse_rate(link))}")
                rows += bench_link(files, link, emu, args.rounds, tmp)
    body = table(["link", "grid (2 nodes x 1 rank)", "inference s", "edges/s",
                  "MB sent", "time / hypergraph"], rows)
    cmdline = " ".join(["python scripts/bench/bench_challenge_link.py", *sys.argv[1:]])
    publish(args, f"bench-network-challenge-{args.neurons}x{args.layers}",
            f"Over a network: Graph Challenge inference, {args.neurons} x {args.layers}",
            f"`{cmdline}` ({args.inputs:,} inputs, median of {args.rounds} rounds; every grid "
            f"found the same categories)\n\n{body}\n\nLinks as measured by the emulation:\n"
            + "\n".join(measured) + "\n", area="Over a network", rows=summary, command=cmdline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
