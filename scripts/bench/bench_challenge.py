"""The Sparse DNN Graph Challenge at every size: spdnn against SuiteSparse:GraphBLAS and the
scipy CSR loop, side by side on the same inputs, with peak memory and how the cost grows.

    python scripts/bench/bench_challenge.py --networks 1024x120,4096x120 [--inputs 60000]
        [--baseline-inputs M] [--rounds 3] [--work challenge-work] [--no-write]

Networks: RadiX-Net (spdnn generate radixnet) with the challenge's sizes and biases (1024:
-0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45; cap 32). Inputs: the MNIST training images
resized to sqrt(N) x sqrt(N) and made binary (spdnn generate challenge-images; the IDX files
from ../shared/data/mnist). Engines, each a process of its own (peak memory: the largest sum
of resident memory over its process tree, sampled every 100 ms): spdnn at P = 1, 1 rank x 2
threads, 2 ranks with a hypergraph plan, 2 ranks of data parallelism (--replicas 2);
GraphBLAS at 1 and 2 threads and the scipy loop (scripts/bench/challenge_engines.py). Rounds are
interleaved; rates (inputs x edges / seconds of the inference loop) are medians. Every engine
must find the same categories before a rate is printed. With --baseline-inputs M, the other
engines run on the first M inputs and spdnn P = 1 runs on those too, for the ratio.
Results accumulate in WORK/results.json (one invocation per network is fine); the section of
docs/BENCHMARKS.md is written from all of them, with the fitted growth exponents and a plot.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, SHARED, number, parser, publish, summary_row  # noqa: E402

from spdnn.io.atomic import write_text  # noqa: E402

BIN = Path(sys.executable).parent
BIASES = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}
BYTES_PER_EDGE = 8.5  # float32 value + int32 index + row pointers, one copy of the network
_WARM: list[bool] = []
# the engines that run on --baseline-inputs when that is a subset
SUBSET_ENGINES = ("GraphBLAS 1 thread", "GraphBLAS 2 threads", "scipy loop",
                  "spdnn P=1 (baseline inputs)")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "SPDNN_THREADS": "1"}


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants, found through each task's
    ``children`` file: a few reads per sample (0.16 ms), not a scan of all of /proc."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def measured(cmd: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``cmd``; its result and the peak memory of its process tree."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return done, peak[0]


def edges_of(n: int, layers: int) -> int:
    return 32 * n * layers


def prepare(n: int, layers: int, inputs: int, work: Path,
            max_plan_edges: float) -> dict[str, Path]:
    """Network, images and a P = 2 hypergraph plan in WORK (kept between runs)."""
    size = int(round(n ** 0.5))
    files = {"net": work / f"rx{n}x{layers}.npz", "images": work / f"img{size}-{inputs}.npz",
             "plan": work / f"rx{n}x{layers}-plan2.npz"}
    spdnn = str(BIN / "spdnn")
    if not files["net"].exists():
        subprocess.run([spdnn, "generate", "radixnet", "--neurons", str(n), "--layers",
                        str(layers), "--bias", str(BIASES[n]), "--cap", "32", "--seed", "0",
                        "-o", str(files["net"])], check=True, env=ENV)
    if not files["images"].exists():
        subprocess.run([spdnn, "generate", "challenge-images", "--mnist", str(SHARED / "mnist"),
                        "--size", str(size), "--count", str(inputs), "-o",
                        str(files["images"])], check=True, env=ENV)
    if edges_of(n, layers) > max_plan_edges:
        files.pop("plan")
    elif not files["plan"].exists():
        t0 = time.perf_counter()
        subprocess.run([str(BIN / "spdnn-partition"), str(files["net"]), "-P", "2", "-o",
                        str(files["plan"]), "--quiet"], check=True, env=ENV)
        print(f"  hypergraph plan for P = 2 in {time.perf_counter() - t0:.0f} s", flush=True)
    return files


def engines(files: dict[str, Path], subset: Path | None, tmp: Path,
            only: str | None = None) -> dict[str, list[str]]:
    """The command of every engine; ``only`` = "spdnn" drops the other engines, "baselines"
    keeps them and spdnn's run on their inputs (the one their ratio needs)."""
    infer = [str(BIN / "spdnn"), "infer", "--network", str(files["net"]), "--comm-timeout", "0"]
    mpi = [str(BIN / "mpiexec"), "-n", "2"]
    images = str(files["images"])
    other = str(subset or files["images"])
    out = {} if only == "baselines" else {
        "spdnn P=1": infer + ["--inputs", images],
        "spdnn 1 rank x 2 threads": infer + ["--inputs", images, "--threads", "2"],
        "spdnn 2 ranks, data parallel": mpi + infer + ["--inputs", images, "--replicas", "2"],
    }
    if "plan" in files and only != "baselines":
        out["spdnn 2 ranks, hypergraph plan"] = mpi + infer + ["--inputs", images, "--plan",
                                                               str(files["plan"])]
    if subset is not None:
        out["spdnn P=1 (baseline inputs)"] = infer + ["--inputs", other]
    elif only == "baselines":  # the baselines' categories are checked against spdnn's
        out["spdnn P=1"] = infer + ["--inputs", images]
    worker = [sys.executable, str(ROOT / "scripts" / "bench" / "challenge_engines.py")]
    for threads in () if only == "spdnn" else (1, 2):
        out[f"GraphBLAS {threads} thread{'s' * (threads > 1)}"] = worker + [
            "graphblas", "--network", str(files["net"]), "--inputs", other, "--threads",
            str(threads)]
    if only != "spdnn":
        out["scipy loop"] = worker + ["scipy", "--network", str(files["net"]), "--inputs",
                                      other]
    for name, cmd in out.items():
        result = tmp / f"{len(name)}-{abs(hash(name))}.json"
        cmd += (["--metrics-out", str(result), "--categories-out", str(result) + ".cats"]
                if "spdnn" in name else ["--out", str(result)])
    return out


def run_once(cmd: list[str]) -> dict:
    proc, peak = measured(cmd)
    result = Path(cmd[cmd.index("--metrics-out" if "--metrics-out" in cmd else "--out") + 1])
    m = json.loads(result.read_text())
    if "--categories-out" in cmd:
        cats = Path(cmd[cmd.index("--categories-out") + 1]).read_text().split()
        m["categories"] = [int(c) for c in cats]
    m["peak"] = peak
    return m


def bench(n: int, layers: int, args: argparse.Namespace, work: Path,
          before: dict | None = None) -> dict:
    """One network, every engine; with ``args.only`` one side only, the other side's figures
    kept from ``before`` (an earlier run of the same network and inputs)."""
    edges = edges_of(n, layers)
    need = 3 * BYTES_PER_EDGE * edges / 2**30
    if need > args.memory_gb:
        return {"network": f"{n}x{layers}", "skipped": f"needs about {need:.0f} GB (three "
                f"copies of {edges:,} edges), more than --memory-gb {args.memory_gb:g}"}
    print(f"{n} x {layers}: {edges:,} edges", flush=True)
    files = prepare(n, layers, args.inputs, work, args.max_plan_edges)
    subset = None
    if args.baseline_inputs and args.baseline_inputs < args.inputs:
        from spdnn.io.images import read_images, write_image_npz

        subset = work / f"{files['images'].stem}-first{args.baseline_inputs}.npz"
        if not subset.exists():
            write_image_npz(subset, read_images(files["images"], n)[:args.baseline_inputs])
    with tempfile.TemporaryDirectory() as tmp:
        cmds = engines(files, subset, Path(tmp), args.only)
        runs: dict[str, list[dict]] = {k: [] for k in cmds}
        if not _WARM and args.warm_up:  # numba compiles (and caches) the kernels on a first run
            for name in ("spdnn P=1", "spdnn 1 rank x 2 threads"):
                if name in cmds:
                    run_once(cmds[name])
            _WARM.append(True)
        for r in range(args.rounds):
            for name, cmd in cmds.items():
                runs[name].append(run_once(cmd))
                print(f"  round {r + 1}: {name}: {runs[name][-1]['rate']:.3g} edges/s, "
                      f"{runs[name][-1]['peak'] / 2**30:.2f} GB", flush=True)
    subset_names = {k for k in cmds if k in SUBSET_ENGINES}
    kept = {k: v for k, v in (before or {}).get("engines", {}).items() if k not in cmds}
    # on one set of inputs every engine run must agree; on two, each set's engines
    for group in (subset_names, set(cmds) - subset_names) if subset else (set(cmds),):
        cats = {k: runs[k][0]["categories"] for k in group}
        if not cats:  # --only-spdnn with the baselines on every input: one group
            continue
        first = next(iter(cats.values()))
        if any(c != first for c in cats.values()):
            raise SystemExit(f"{n}x{layers}: the engines disagree on the categories: "
                             + ", ".join(f"{k} {len(v)}" for k, v in cats.items()))
    # engines kept from the earlier run: spdnn's categories on their inputs must equal theirs
    # (the count, and the digest where the earlier run stored it)
    same = runs["spdnn P=1 (baseline inputs)" if subset else "spdnn P=1"][0]["categories"]
    count = args.baseline_inputs if subset else args.inputs
    for k, v in kept.items():
        want = count if k in SUBSET_ENGINES else args.inputs
        if v["inputs"] != want:
            raise SystemExit(f"{n}x{layers}: the earlier {k} ran {v['inputs']:,} inputs, not "
                             f"{want:,} (--inputs, --baseline-inputs)")
        if want != count:  # spdnn's runs on every input, kept by --only-baselines: checked
            continue       # against each other when they ran
        if v["categories"] != len(same) or v.get("categories_sha", _digest(same)) != \
                _digest(same):
            raise SystemExit(f"{n}x{layers}: spdnn's categories differ from those {k} found "
                             "in the earlier run")
    return {"network": f"{n}x{layers}", "edges": edges, "inputs": args.inputs,
            "plan": "plan" in files,
            "baseline_inputs": count, "rounds": args.rounds,
            "live_fraction": (before or {}).get("live_fraction") if args.only == "spdnn"
            else runs["scipy loop"][0].get("live_fraction"),
            "engines": kept | {k: {"rate": statistics.median(m["rate"] for m in v),
                                   "seconds": statistics.median(m["seconds"] for m in v),
                                   "peak": max(m["peak"] for m in v),
                                   "inputs": count if k in subset_names else args.inputs,
                                   "categories": len(v[0]["categories"]),
                                   "rounds": len(v),
                                   "categories_sha": _digest(v[0]["categories"])}
                               for k, v in runs.items()}}


def _digest(categories: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, categories)).encode()).hexdigest()[:16]


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network's spdnn rate on 1 and 2 cores against the better baseline (the ratios
    of the report's second table)."""
    rates, ratios = tables[0], tables[1]
    rows = []
    for row in ratios:
        mine = [r for r in rates if r["network"] == row["network"]]
        ours = next(r for r in mine if r["engine"] == "spdnn P=1")
        peers = [r for r in mine if r["engine"] in ("GraphBLAS 1 thread", "scipy loop")]
        peer = max(peers, key=lambda r: number(r["rate (edges/s)"]))
        rows.append(summary_row(
            f"Graph Challenge {row['network']} ({row['edges']} edges), "
            f"{ours['inputs']} inputs (edges/s)",
            f"{ours['rate (edges/s)']} (1 core)",
            f"{peer['rate (edges/s)']} ({peer['engine']})",
            f"{row['1 core vs best baseline']} on 1 core, {row['2 cores vs GraphBLAS 2t']} on "
            f"2 (against GraphBLAS 2 threads); categories equal"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--networks", default="1024x120,1024x480,1024x1920,4096x120,4096x480,"
                    "4096x1920,16384x120,16384x480,16384x1920,65536x120,65536x480,65536x1920")
    ap.add_argument("--inputs", type=int, default=60_000)
    ap.add_argument("--baseline-inputs", type=int, help="the other engines' inputs (a subset)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-gb", type=float, default=22.0)
    ap.add_argument("--max-plan-edges", type=float, default=1.5e8,
                    help="no hypergraph plan (and no run with it) for larger networks")
    ap.add_argument("--work", type=Path, default=Path("challenge-work"))
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--only-spdnn", dest="only", action="store_const", const="spdnn",
                      help="rerun spdnn's engines only; the other engines' figures (and "
                           "categories) are kept from WORK/results.json")
    only.add_argument("--only-baselines", dest="only", action="store_const", const="baselines",
                      help="rerun the other engines and spdnn P=1 on their inputs; spdnn's "
                           "figures on every input are kept from WORK/results.json")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="skip the two untimed spdnn runs before the first network (numba's "
                         "cache is already warm from an earlier invocation)")
    ap.add_argument("--report-only", action="store_true",
                    help="write the section from WORK/results.json without running anything")
    args = ap.parse_args()
    if not (SHARED / "mnist").is_dir():
        raise SystemExit(f"needs the MNIST IDX files in {SHARED / 'mnist'}")
    args.work.mkdir(parents=True, exist_ok=True)
    store = args.work / "results.json"
    results = json.loads(store.read_text()) if store.exists() else {}
    for spec in [] if args.report_only else args.networks.split(","):
        n, layers = (int(t) for t in spec.split("x"))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip() or "unknown"
        results[spec] = bench(n, layers, args, args.work, results.get(spec)) | {
            "command": " ".join(sys.argv[1:]), "commit": commit}
        write_text(store, json.dumps(results, indent=1), "the results store")
    from challenge_report import report

    body = report(results, ROOT / "docs" / "figures" / "challenge_growth.png")
    publish(args, "BENCH_CHALLENGE", "Graph Challenge at every size", body, area="Inference",
            rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
