"""The plan as the topology drifts: RigL's (or SET's) updates on the random 4096 -> 16384 x 3
network, the rows a step moves under the first plan kept, against a fresh plan of the final
topology, and what the updates cost.

    python scripts/bench/bench_drift.py [--mode rigl|set] [--ranks 2] [--updates 100]
                                        [--work DIR] [--no-write]

The network is `spdnn generate random --sizes 4096,16384,16384,16384 --fan-in 32 --head 10`,
trained with SGD (lr 0.05, momentum 0.9) in batches of 256 on 12,800 synthetic samples (4,096
random features, 10 classes), float32, under a hypergraph plan of its first topology on
--ranks ranks, with `--sparse-update MODE --update-every 100 --drop-fraction 0.3
--update-until 1.0` for --updates x 100 steps (and one more epoch's worth, so the last update
falls inside the job): once with the first plan kept (`--replan never`), once maintained
(`--replan auto`). The final network is partitioned afresh (`spdnn-partition`, the same P and
seed) and its volume counted by the plan statistics. Record dynamic-sparsity-drift-MODE.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import parser, publish, run_job, spdnn_tool, summary_row, table  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPDNN_THREADS": "1"}
SAMPLES, BATCH = 12_800, 256


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    r = tables[0][0]
    name = r["mode"]
    kept, kept_up, fresh = (float(r[f"rows a step, {c}"].replace(",", ""))
                            for c in ("first plan kept", "maintained plan", "fresh plan"))
    return [
        summary_row(f"{name} on 4096 -> 16384 x 3 (fan-in 32), {r['updates']} updates at P = "
                    f"{r['P']}: rows a step at the end",
                    f"{r['rows a step, maintained plan']} (maintained, --replan auto); "
                    f"{r['rows a step, first plan kept']} (the first plan kept)",
                    f"{r['rows a step, fresh plan']} (a fresh plan of the final topology)",
                    f"maintained {kept_up / fresh:.2f}x, kept {kept / fresh:.2f}x of fresh"),
        summary_row(f"{name} on 4096 -> 16384 x 3, {r['updates']} updates at P = {r['P']}: the "
                    "updates' share of the training time",
                    f"{r['update share, maintained']} (maintained; of it the replans "
                    f"{r['replan share']}, {r['checks']} checks); "
                    f"{r['update share, kept']} (kept)", "-", "-"),
    ]


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--mode", choices=("rigl", "set"), default="rigl")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        net, plan, data = work / "random.npz", work / f"random-p{args.ranks}.npz", \
            work / "data.npz"
        final, fresh = work / "final.npz", work / f"final-p{args.ranks}.npz"
        if not net.exists():
            spdnn_tool("spdnn", "generate", "random", "--sizes", "4096,16384,16384,16384",
                       "--fan-in", "32", "--head", "10", "--seed", "0", "-o", net, env=ENV)
        if not data.exists():
            rng = np.random.default_rng(0)
            np.savez(data, x_train=rng.random((SAMPLES, 4096), dtype=np.float32),
                     y_train=rng.integers(0, 10, SAMPLES),
                     x_test=rng.random((512, 4096), dtype=np.float32),
                     y_test=rng.integers(0, 10, 512))
        if not plan.exists():
            spdnn_tool("spdnn-partition", net, "-P", args.ranks, "--seed", "0", "-o", plan,
                       env=ENV)
        per_epoch = SAMPLES // BATCH
        steps = args.updates * 100 + per_epoch
        epochs = -(-steps // per_epoch)
        runs = {}
        for replan in ("never", "auto"):
            final = work / f"final-{replan}.npz"
            job = run_job(["train", "--network", str(net), "--plan", str(plan), "--data",
                           f"npz:{data}", "--epochs", str(epochs), "--max-steps", str(steps),
                           "--batch-size", str(BATCH), "--lr", "0.05", "--momentum", "0.9",
                           "--sparse-update", args.mode, "--update-every", "100",
                           "--drop-fraction", "0.3", "--update-until", "1.0", "--replan",
                           replan, "--save", str(final)], args.ranks,
                          metrics=work / "m.json", env=ENV, timeout=6 * 3600)
            runs[replan] = (job.metrics, final)
            print(f"  --replan {replan}: {job.seconds:.0f} s", flush=True)
        from spdnn.io.bundle import load_network
        from spdnn.io.planfile import load_plan
        from spdnn.model.plan import network_patterns, plan_statistics

        final = runs["never"][1]  # the same topology either way: the plan changes no result
        fresh = work / f"final-p{args.ranks}.npz"
        spdnn_tool("spdnn-partition", final, "-P", args.ranks, "--seed", "0", "-o", fresh,
                   env=ENV)
        stats = plan_statistics(network_patterns(load_network(final)),
                                load_plan(fresh).owners, parts=args.ranks)
        fresh_rows = stats.forward_total + stats.backward_total
    kept, kept_final = runs["never"]
    kept_ups, kept_train = kept["topology_updates"], sum(e["seconds"] for e in kept["epochs"])
    kept_up = sum(u["seconds"] for u in kept_ups)
    upkeep, _ = runs["auto"]
    ups = upkeep["topology_updates"]
    up_train = sum(e["seconds"] for e in upkeep["epochs"])
    up_s = sum(u["seconds"] for u in ups)
    replan_s = sum(u["replan_seconds"] for u in ups)
    name = {"rigl": "RigL", "set": "SET"}[args.mode]
    row = [name, str(args.ranks), str(len(kept_ups)), f"{kept_ups[0]['rows_before']:,}",
           f"{kept_ups[-1]['rows_per_step']:,}", f"{ups[-1]['rows_per_step']:,}",
           f"{fresh_rows:,}", str(sum(u["replanned"] for u in ups)),
           str(sum(1 for u in ups if u["rows_moved"])),
           f"{sum(u['rows_moved'] for u in ups):,}",
           f"{100 * kept_up / kept_train:.1f}%", f"{100 * up_s / up_train:.1f}%",
           f"{100 * replan_s / up_train:.2f}%"]
    body = ("Command: `python scripts/bench/bench_drift.py --mode " + args.mode + " --ranks "
            + str(args.ranks) + " --updates " + str(args.updates) + "`. " + name
            + " every 100 steps (fraction 0.3, cosine to zero at the last step), batch 256, "
            "SGD; rows a step: the expand and the fold of every layer over the ranks; kept: the "
            "first plan in force throughout "
            "(`--replan never`); maintained: `--replan auto`; fresh: `spdnn-partition` of the "
            "final network; update share: the updates' seconds (with their replans) over the "
            "training's; replan share: the replans' seconds (`replan_seconds`: gathering the "
            "patterns, the refinement, the move) over the training's, in the maintained run. "
            f"float32, one thread per rank, on {os.cpu_count()} cores.\n\n"
            + table(["mode", "P", "updates", "rows a step, start", "rows a step, first plan kept",
                     "rows a step, maintained plan", "rows a step, fresh plan", "checks",
                     "moves", "neurons moved", "update share, kept",
                     "update share, maintained", "replan share"],
                    [row]))
    publish(args, f"dynamic-sparsity-drift-{args.mode}",
            f"The plan as {name} drifts the topology", body,
            area="Dynamic sparsity", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
