"""Before/after: the same `spdnn train` and `spdnn infer` command lines run against two source
trees (this checkout and another, e.g. a `git worktree` of an earlier commit), interleaved round
by round, so that the ratio of their times comes from one run on one machine state.

    git worktree add /tmp/before a57faad
    python scripts/bench/bench_ab.py --before /tmp/before [--rounds 3] [--hidden 16384]
    python scripts/bench/bench_ab.py --before /tmp/before --steps [--rounds 3]

Cases (float32, one thread per rank): training the `random` 4096 -> H -> H -> H network with a
dense 10-way head and the first 3 RadiX-Net layers of H neurons (2,048 synthetic samples, batch
256, the second epoch's seconds from --metrics-out) at P = 1 and P = 2 with a block plan; Graph
Challenge inference (`seconds` of the inference loop from --metrics-out) on the official network
and 1,200-image subset from ../shared (skipped when absent) and on a RadiX-Net 4096 x 120 with
random inputs, at P = 1 and P = 2 with a cyclic plan. Each tree imports its own spdnn through
PYTHONPATH. Writes the table to docs/BENCHMARKS.md ("Before and after").

``--steps`` times the training step itself instead, in one process per tree (P = 1, batch 256,
the minimum and median of 10 steps after 2 warm-up steps): far less noisy than whole runs; and
likewise the inference forward pass (dead samples dropped) of a RadiX-Net 4096 x 120 over 256
random 0/1 inputs. The
tree before the runtime was split (a57faad) is driven through its own API.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, SHARED, parser, publish, run_job, table  # noqa: E402

from partition.methods import partition_network  # noqa: E402
from spdnn.io.bundle import save_network  # noqa: E402
from spdnn.io.formats import write_mtx  # noqa: E402
from spdnn.io.graphchallenge import read_graphchallenge  # noqa: E402
from spdnn.io.planfile import save_plan  # noqa: E402
from spdnn.model.generate import add_head, radixnet, random_network  # noqa: E402
from spdnn.model.plan import network_patterns

BIN = Path(sys.executable).parent


def run(tree: Path, ranks: int, args: list[str], metrics: Path) -> dict:
    # cwd=tree: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH,
    # so run from anywhere else both trees would import the spdnn found there.
    return run_job(args, ranks, metrics=metrics, command=[sys.executable, "-m", "spdnn"],
                   env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree).metrics


def prepare(work: Path, hidden: int) -> list[tuple[str, int, list[str], str]]:
    """(label, ranks, spdnn arguments, metric) of every case; writes the files they need."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 4096)).astype(np.float32)
    np.savez(work / "data.npz", x_train=x, y_train=rng.integers(0, 10, 2048))
    cases = []
    nets = {"random": random_network([4096, hidden, hidden, hidden], 32, seed=0, head=10),
            "radixnet": add_head(radixnet(hidden, 3, seed=0), 10)}
    for name, net in nets.items():
        if net.sizes[0] != 4096:  # RadiX-Net's input is H wide: its own data
            xs = rng.standard_normal((2048, net.sizes[0])).astype(np.float32)
            np.savez(work / f"data-{name}.npz", x_train=xs, y_train=rng.integers(0, 10, 2048))
            data = work / f"data-{name}.npz"
        else:
            data = work / "data.npz"
        save_network(net, work / f"{name}.npz")
        save_plan(partition_network(network_patterns(net), 2, method="block",
                                    fingerprint=net.fingerprint()), work / f"{name}-2.npz")
        base = ["train", "--network", str(work / f"{name}.npz"), "--data", f"npz:{data}",
                "--epochs", "2", "--batch-size", "256", "--lr", "0.01", "--momentum", "0.9"]
        cases.append((f"train {name} {net.sizes[1]}x3, P=1", 1, base, "epoch2"))
        cases.append((f"train {name} {net.sizes[1]}x3, P=2", 2,
                      base + ["--plan", str(work / f"{name}-2.npz")], "epoch2"))
    infer = {}
    gc = SHARED / "graphchallenge"
    if (gc / "neuron1024" / "n1024-l1.tsv").is_file():
        infer["gc1024"] = (read_graphchallenge(gc / "neuron1024", -0.3, 32),
                           gc / "sparse-images-1024_subset.mtx")
    rx = radixnet(4096, 120, seed=0, bias=-0.35)
    images = sp.random(256, 4096, density=0.5, random_state=1, format="csr")
    images.data[:] = 1
    write_mtx(work / "rx-inputs.mtx", images)
    infer["radixnet4096x120"] = (rx, work / "rx-inputs.mtx")
    for name, (net, inputs) in infer.items():
        save_network(net, work / f"{name}.npz")
        save_plan(partition_network(network_patterns(net), 2, method="cyclic",
                                    fingerprint=net.fingerprint()), work / f"{name}-2.npz")
        base = ["infer", "--network", str(work / f"{name}.npz"), "--inputs", str(inputs)]
        cases.append((f"infer {name}, P=1", 1, base, "seconds"))
        cases.append((f"infer {name}, P=2", 2, base + ["--plan", str(work / f"{name}-2.npz")],
                      "seconds"))
    return cases


STEP = """
import json, os, sys, time
import numpy as np
path, n0 = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
x = rng.standard_normal((256, n0)).astype(np.float32)
y = rng.integers(0, 10, 256)
from spdnn.comm.mpi import Communicator
comm = Communicator()
if os.path.exists(os.path.join(os.environ["PYTHONPATH"], "spdnn", "runtime", "session.py")):
    from spdnn.runtime.session import open_network
    dnet = open_network(comm, path, None).dnet
elif os.path.exists(os.path.join(os.environ["PYTHONPATH"], "spdnn", "session.py")):
    from spdnn.session import open_network
    dnet = open_network(comm, path, None).dnet
else:  # before the split: spdnn.runtime
    from spdnn.runtime import open_network
    dnet = open_network(comm, path, None)[2]
times = []
x0 = np.ascontiguousarray(x[:, dnet.input_rows].T)
if len(sys.argv) > 3:  # inference: 0/1 inputs, dead samples dropped, 12 repeats
    x0 = (x0 > 0).astype(np.float32)
for _ in range(12):
    t0 = time.perf_counter()
    if len(sys.argv) > 3:
        dnet.forward(x0, keep=False, drop_dead=True)
    else:
        dnet.backward(dnet.forward(x0), y, "cross_entropy")
    times.append(time.perf_counter() - t0)
times = sorted(times[2:])
print(json.dumps([times[0], times[len(times) // 2]]))
"""


def steps(trees: dict[str, Path], rounds: int, hidden: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        nets = {"random": random_network([4096, hidden, hidden, hidden], 32, seed=0,
                                         head=10),
                "radixnet": add_head(radixnet(hidden, 3, seed=0), 10),
                "infer radixnet4096x120": radixnet(4096, 120, seed=0, bias=-0.35)}
        times: dict[tuple[str, str], list[list[float]]] = {}
        for name, net in nets.items():
            save_network(net, Path(tmp) / f"{name}.npz")
        for r in range(rounds):
            for name, net in nets.items():
                for which, tree in trees.items():
                    extra = ["infer"] if name.startswith("infer") else []
                    out = subprocess.run([sys.executable, "-c", STEP, str(Path(tmp) /
                                          f"{name}.npz"), str(net.sizes[0]), *extra], check=True,
                                         capture_output=True, text=True, cwd=tmp,
                                         env={**os.environ, "PYTHONPATH": str(tree)}).stdout
                    times.setdefault((name, which), []).append(json.loads(out))
                    print(f"round {r + 1} {name} {which}: {out.strip()}", flush=True)
    rows = []
    for name in nets:
        b = min(t[0] for t in times[(name, "before")])
        a = min(t[0] for t in times[(name, "after")])
        bm = statistics.median(t[1] for t in times[(name, "before")])
        am = statistics.median(t[1] for t in times[(name, "after")])
        label = (f"{name}, forward over 256 0/1 inputs, P=1" if name.startswith("infer")
                 else f"{name} {hidden}x3 step, P=1")
        rows.append([label, f"{b * 1e3:.0f} / {bm * 1e3:.0f}",
                     f"{a * 1e3:.0f} / {am * 1e3:.0f}", f"{b / a:.2f}x / {bm / am:.2f}x"])
    return (f"Command: `python scripts/bench/bench_ab.py --before BEFORE --steps --rounds {rounds} "
            f"--hidden {hidden}` (one process per tree and round, 10 timed steps each; best "
            "and median over all rounds).\n\n"
            + table(["case", "before, ms best / median", "after, ms best / median",
                     "before / after"], rows))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--before", type=Path, required=True, help="the other source tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--steps", action="store_true", help="time the training step in-process")
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": ROOT}
    if args.steps:
        body = steps(trees, args.rounds, args.hidden)
        publish(args, "bench-ab-steps", "Before and after: the training step", body,
                area=None, rows=None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = prepare(work, args.hidden)
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for label, ranks, cmd, metric in cases:
                for which, tree in (trees.items() if r % 2 == 0 else
                                    reversed(list(trees.items()))):
                    m = run(tree, ranks, cmd, work / "m.json")
                    sec = m["epochs"][1]["seconds"] if metric == "epoch2" else m["seconds"]
                    times.setdefault((label, which), []).append(sec)
                    print(f"round {r + 1} {label} {which}: {sec:.3f} s", flush=True)
    rows = []
    for label, *_ in cases:
        b = statistics.median(times[(label, "before")])
        a = statistics.median(times[(label, "after")])
        rows.append([label, f"{b:.3f}", f"{a:.3f}", f"{b / a:.2f}x"])
    body = (f"Command: `python scripts/bench/bench_ab.py --before BEFORE --rounds {args.rounds} "
            f"--hidden {args.hidden}` (median seconds over the rounds, the two trees "
            "alternating within each round; training: the second epoch; inference: the "
            "inference loop).\n\n"
            + table(["case", "before (s)", "after (s)", "before / after"], rows))
    publish(args, "bench-ab", "Before and after", body, area=None, rows=None)


if __name__ == "__main__":
    main()
