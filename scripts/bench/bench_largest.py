"""The three largest Graph Challenge networks on one machine, under a memory limit per rank
(issue 48): 16384 x 1920, 65536 x 480 (1.0e9 edges each) and 65536 x 1920 (4.0e9).

    python scripts/bench/bench_largest.py --networks 16384x1920,65536x480 --work /work/big \\
        [--inputs 60000] [--check-inputs 2000] [--memory-limit 6G] [--configs block] [--no-write]

Each network (RadiX-Net, `spdnn generate radixnet`, written layer by layer; the challenge's
bias per size, cap 32) runs `spdnn infer` on the MNIST images made challenge inputs, under
`--memory-limit` for every rank: at P = 1, with 2 ranks as data-parallel replicas, and with 2
ranks under a block plan (written directly: the partitioner holds the whole hypergraph, which
these networks do not allow); `whole`: P = 1 with `--memory-limit none`. A network whose
predicted peak passes the limit streams its layers in blocks (docs/memory.md). Every
configuration must find the same categories, and on the first --check-inputs inputs they must
equal those of the scipy reference loop run one layer at a time from the file
(spdnn.reference.challenge_infer). Peak memory: each rank's
`/usr/bin/time -f %M`. Writes the record "largest" (Inference) unless --no-write; with
`--configs p1,whole` the record "memory-streamed" (Memory: the peak streamed under the limit
against in memory), e.g.

    python scripts/bench/bench_largest.py --networks 16384x1920 --inputs 2000 \
        --check-inputs 2000 --configs p1,whole --work /work/big
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHARED, number, parser, publish, run_job, summary_row, table  # noqa: E402

from spdnn.io.atomic import write_text  # noqa: E402
from spdnn.io.bundle import NetworkBundle  # noqa: E402
from spdnn.io.images import read_images, write_image_npz  # noqa: E402
from spdnn.io.planfile import save_plan  # noqa: E402
from spdnn.model.plan import Plan  # noqa: E402
from spdnn.model.reports import ChallengeResult  # noqa: E402
from spdnn.reference import challenge_infer  # noqa: E402

BIN = Path(sys.executable).parent
BIASES = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}
# P = 1, 2 data-parallel ranks, 2 ranks under a block plan; P = 1 with no limit (in memory)
CONFIGS = ("p1", "replicas", "block", "whole")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPDNN_THREADS": "1"}


class StreamedNetwork:
    """A bundle read through ``spdnn.reference.challenge_infer``'s interface, one layer at a
    time (``layers`` is read again on each pass: never more than one layer in memory)."""

    def __init__(self, path: Path) -> None:
        self.bundle = NetworkBundle(path)
        self.cap = self.bundle.meta["cap"]
        self.dtype = np.float32
        self.nnz = sum(self.bundle.nnz(k) for k in range(1, self.bundle.n_layers + 1))

    @property
    def layers(self):  # noqa: ANN201
        return self.bundle.layers("float32")


def prepare(n: int, layers: int, inputs: int, check: int, work: Path) -> dict[str, Path]:
    size = int(round(n ** 0.5))
    files = {"net": work / f"rx{n}x{layers}.npz", "all": work / f"img{size}.npz",
             "images": work / f"img{size}-first{inputs}.npz",
             "check": work / f"img{size}-first{check}.npz",
             "plan": work / f"block2-{n}x{layers}.npz"}  # one per depth: a plan has its layers
    if not files["net"].exists():
        subprocess.run([str(BIN / "spdnn"), "generate", "radixnet", "--neurons", str(n),
                        "--layers", str(layers), "--bias", str(BIASES[n]), "--cap", "32",
                        "--seed", "0", "-o", str(files["net"])], check=True, env=ENV)
    if not files["all"].exists():
        subprocess.run([str(BIN / "spdnn"), "generate", "challenge-images", "--mnist",
                        str(SHARED / "mnist"), "--size", str(size), "-o", str(files["all"])],
                       check=True, env=ENV)
    for key, count in (("images", inputs), ("check", check)):
        if not files[key].exists():
            write_image_npz(files[key], read_images(files["all"], n)[:count])
    if not files["plan"].exists():  # the block plan: rows split in two halves per layer
        owners = tuple((np.arange(n) >= n // 2).astype(np.int32) for _ in range(layers + 1))
        save_plan(Plan(2, owners, {"method": "block"}), files["plan"])
    return files


def run(cmd: list[str], ranks: int, metrics: Path) -> dict:
    """One spdnn job; its metrics and each rank's peak from /usr/bin/time."""
    job = run_job(cmd[1:], ranks, metrics=metrics, command=cmd[:1], env=ENV, peaks=True,
                  timeout=6 * 3600)
    m = job.metrics
    m["rank_peaks"], m["wall"] = job.peaks, job.seconds
    m["streaming"] = next((ln for ln in job.stdout.splitlines()
                           if ln.startswith("streaming")), "in memory")
    return m


def bench(n: int, layers: int, args: argparse.Namespace) -> dict:
    files = prepare(n, layers, args.inputs, args.check_inputs, args.work)
    infer = [str(BIN / "spdnn"), "infer", "--network", str(files["net"]), "--comm-timeout", "0",
             "--memory-limit", args.memory_limit]
    every = {
        "P=1": (1, infer + ["--inputs", str(files["images"])]),
        "2 ranks, data parallel": (2, infer + ["--inputs", str(files["images"]),
                                               "--replicas", "2"]),
        "2 ranks, block plan": (2, infer + ["--inputs", str(files["images"]), "--plan",
                                            str(files["plan"])]),
        "P=1, no limit": (1, infer[:-1] + ["none", "--inputs", str(files["images"])]),
    }
    configs = {name: every[name] for name, key in zip(every, CONFIGS) if key in args.configs}
    out: dict = {"network": f"{n}x{layers}", "edges": 32 * n * layers, "configs": {}}
    cats: dict[str, list[int]] = {}
    for name, (ranks, cmd) in configs.items():
        cat_file = args.work / "cats.tsv"
        m = run(cmd + ["--categories-out", str(cat_file)], ranks, args.work / "m.json")
        cats[name] = [int(c) for c in cat_file.read_text().split()]
        out["configs"][name] = {k: m[k] for k in ("rate", "seconds", "inputs", "rank_peaks",
                                                  "wall", "streaming", "load_seconds")
                                if k in m} | {"categories": len(cats[name])}
        print(f"  {name}: {m['rate']:.3g} edges/s, {m['seconds']:.0f} s, peaks "
              f"{[round(p / 1e9, 2) for p in m['rank_peaks']]} GB; {m['streaming']}",
              flush=True)
    first_run = cats[next(iter(cats))]
    if any(c != first_run for c in cats.values()):
        raise SystemExit(f"{n}x{layers}: the configurations disagree on the categories")
    first = [c for c in first_run if c <= args.check_inputs]  # a sample's fate is its own
    checked = checked_file(n, layers, args)
    if checked.exists():  # --check-only ran: its categories equal the scipy loop's
        if [int(c) for c in checked.read_text().split()] != first:
            raise SystemExit(f"{n}x{layers}: the categories differ from those of {checked}, "
                             "which equal the scipy loop's")
        out["reference"] = {"inputs": args.check_inputs, "categories": len(first),
                            "from": checked.name}
        print(f"  first {args.check_inputs:,}: equal to {checked.name} (--check-only: equal "
              "to the scipy loop's)", flush=True)
        return out
    t0 = time.perf_counter()
    ref: ChallengeResult = challenge_infer(StreamedNetwork(files["net"]),
                                           read_images(files["check"], n))
    if ref.categories.tolist() != first:
        raise SystemExit(f"{n}x{layers}: spdnn's categories differ from the scipy loop's on "
                         f"the first {args.check_inputs} inputs")
    out["reference"] = {"seconds": time.perf_counter() - t0, "inputs": args.check_inputs,
                        "categories": len(ref.categories), "rate": ref.rate}
    print(f"  scipy loop, one layer at a time, first {args.check_inputs:,}: "
          f"{len(ref.categories)} categories, equal to spdnn's", flush=True)
    return out


def checked_file(n: int, layers: int, args: argparse.Namespace) -> Path:
    """Where --check-only keeps the categories it found equal to the scipy loop's; a later
    full run compares its first --check-inputs inputs with them instead of running the loop
    again (65536 x 1920: 11 minutes)."""
    return args.work / f"cats-checked-{n}x{layers}-first{args.check_inputs}.tsv"


def check_only(n: int, layers: int, args: argparse.Namespace) -> dict:
    """spdnn at P = 1 and the scipy loop (one layer at a time) on the first --check-inputs
    inputs alone: the categories must be equal."""
    files = prepare(n, layers, args.check_inputs, args.check_inputs, args.work)
    cat_file = args.work / "cats-check.tsv"
    checked_file(n, layers, args).unlink(missing_ok=True)
    m = run([str(BIN / "spdnn"), "infer", "--network", str(files["net"]), "--comm-timeout", "0",
             "--memory-limit", args.memory_limit, "--inputs", str(files["check"]),
             "--categories-out", str(cat_file)], 1, args.work / "m.json")
    mine = [int(c) for c in cat_file.read_text().split()]
    t0 = time.perf_counter()
    ref = challenge_infer(StreamedNetwork(files["net"]), read_images(files["check"], n))
    seconds = time.perf_counter() - t0
    if ref.categories.tolist() != mine:
        raise SystemExit(f"{n}x{layers}: spdnn's categories differ from the scipy loop's")
    cat_file.replace(checked_file(n, layers, args))
    print(f"  spdnn P = 1: {m['rate']:.3g} edges/s, {m['seconds']:.0f} s; scipy loop: "
          f"{ref.rate:.3g} edges/s, {seconds:.0f} s; {len(mine)} categories, equal", flush=True)
    return {"network": f"{n}x{layers}", "inputs": args.check_inputs, "categories": len(mine),
            "spdnn": {k: m[k] for k in ("rate", "seconds", "rank_peaks", "wall", "streaming",
                                        "load_seconds") if k in m},
            "reference": {"rate": ref.rate, "seconds": seconds}}


def report(results: list[dict], args: argparse.Namespace) -> str:
    rows = []
    for r in results:
        for name, c in r["configs"].items():
            rows.append([r["network"], name, f"{c['inputs']:,}", f"{c['rate']:.3g}",
                         f"{c['seconds']:.1f}", f"{c.get('load_seconds', 0):.1f}",
                         " / ".join(f"{p / 1e9:.2f}" for p in c["rank_peaks"]),
                         f"{c['categories']:,}", c["streaming"].split(" (")[0]])
        ref = r["reference"]
        if "rate" not in ref:  # compared with the categories a --check-only run checked
            rows.append([r["network"], f"scipy loop (`--check-only`: {ref['from']})",
                         f"{ref['inputs']:,}", "", "", "", "", f"{ref['categories']:,}",
                         "equal to spdnn's"])
            continue
        rows.append([r["network"], "scipy loop, one layer at a time", f"{ref['inputs']:,}",
                     f"{ref['rate']:.3g}", f"{ref['seconds']:.1f}", "", "",
                     f"{ref['categories']:,}", "equal to spdnn's"])
    return (f"Command: `python scripts/bench/bench_largest.py --networks "
            f"{args.networks} --inputs {args.inputs} --check-inputs {args.check_inputs} "
            f"--memory-limit {args.memory_limit} --configs {','.join(args.configs)}`. "
            "Rate = inputs x edges / seconds of the passes (reading the blocks of a streamed "
            "run not included: its own column); "
            "peak per rank from `/usr/bin/time -f %M`; float32, one thread per rank.\n\n"
            + table(["network", "run", "inputs", "rate (edges/s)", "passes (s)",
                     "reading blocks (s)", "peak per rank (GB)", "categories", "weights"],
                    rows))


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network's fastest run on the most inputs against the scipy loop's rate (which
    runs on the first inputs only)."""
    rows = []
    every = [r for t in tables for r in t if "network" in r and "rate (edges/s)" in r]
    for network in dict.fromkeys(r["network"] for r in every):
        mine = [r for r in every if r["network"] == network]
        loop = [r for r in mine if r["run"].startswith("scipy")]
        runs = [r for r in mine if not r["run"].startswith("scipy")]
        most = max(number(r["inputs"]) for r in runs)
        best = max((r for r in runs if number(r["inputs"]) == most),
                   key=lambda r: number(r["rate (edges/s)"]))
        peer = max(loop, key=lambda r: number(r["rate (edges/s)"])) if loop else None
        rows.append(summary_row(
            f"Graph Challenge {network}, {best['inputs'].replace('**', '')} inputs (edges/s)",
            f"{best['rate (edges/s)'].replace('**', '')} "
            f"({best['run'].replace('**', '').split(',')[0]})",
            f"{peer['rate (edges/s)']} (scipy loop, {peer['inputs']} inputs)" if peer else "-",
            (f"{number(best['rate (edges/s)']) / number(peer['rate (edges/s)']):.2f}x faster"
             if peer else "-")))
    return rows


def streamed_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network's peak and rate streamed under the limit against in memory."""
    rows = []
    every = [r for t in tables for r in t if "network" in r and "rate (edges/s)" in r]
    for network in dict.fromkeys(r["network"] for r in every):
        limited = next(r for r in every if r["network"] == network and r["run"] == "P=1")
        whole = next(r for r in every if r["network"] == network and r["run"] == "P=1, no limit")
        same = "the same" if limited["categories"] == whole["categories"] else "other"
        rows.append(summary_row(
            f"{network}, {limited['inputs']} inputs: peak (GB); edges/s",
            f"{limited['peak per rank (GB)']}; {limited['rate (edges/s)']} "
            f"({limited['weights']})",
            f"{whole['peak per rank (GB)']}; {whole['rate (edges/s)']} ({whole['weights']})",
            f"{number(limited['peak per rank (GB)']) / number(whole['peak per rank (GB)']):.2f}x"
            f" the memory, {same} {limited['categories']} categories"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--networks", default="16384x1920,65536x480,65536x1920")
    ap.add_argument("--inputs", type=int, default=60_000)
    ap.add_argument("--check-inputs", type=int, default=2_000)
    ap.add_argument("--memory-limit", default="6G")
    ap.add_argument("--configs", default=",".join(CONFIGS[:3]),
                    type=lambda v: [c for c in v.split(",") if c],
                    help=f"which runs, of {','.join(CONFIGS)} (default: the first three; each "
                         "must find the same categories)")
    ap.add_argument("--work", type=Path, default=Path("largest-work"))
    ap.add_argument("--check-only", action="store_true",
                    help="only spdnn at P = 1 against the scipy loop on --check-inputs inputs "
                         "(prints; writes nothing to BENCHMARKS.md)")
    args = ap.parse_args()
    if not args.configs or set(args.configs) - set(CONFIGS):
        ap.error(f"--configs: a list of {','.join(CONFIGS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in args.networks.split(","):
        n, layers = (int(v) for v in spec.split("x"))
        print(f"{n} x {layers}: {32 * n * layers:,} edges", flush=True)
        if args.check_only:
            write_text(args.work / f"check-{spec}.json",
                       json.dumps(check_only(n, layers, args), indent=1))
            continue
        results.append(bench(n, layers, args))
        write_text(args.work / f"result-{spec}.json", json.dumps(results[-1], indent=1))
    if args.check_only:
        return 0
    body = report(results, args)
    if set(args.configs) == {"p1", "whole"}:  # the memory a streamed run saves
        publish(args, "memory-streamed", "Inference beyond the limit: layers streamed", body,
                area="Memory", rows=streamed_summary)
    else:
        publish(args, "largest", "Graph Challenge: the largest networks", body,
                area="Inference", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
