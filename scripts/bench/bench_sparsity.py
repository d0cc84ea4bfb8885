"""Dynamic sparsity on MNIST: SET and RigL against static sparse training at equal density,
the same network, recipe and seed, and what the updates cost.

    python scripts/bench/bench_sparsity.py [--epochs 10] [--work DIR] [--no-write]
    python scripts/bench/bench_sparsity.py --locality [--epochs 3] [--ranks 4 8]

The network is the SET-MLP of the Truly Sparse code's set_mlp_sequential.py: 784 -> 1000 ->
1000 -> 1000 -> 10, its hidden layers at SET's density for epsilon 20 (fan-in 36, 40, 40:
epsilon (n_in + n_out) / n_in per row), a dense head, All-ReLU (leaky_relu slopes -0.6, 0.6,
-0.6). Training: SGD lr 0.01, momentum 0.9, weight decay 2e-4, dropout 0.3, batch 128, float32,
on the MNIST under ../shared/data/mnist. Static keeps the first topology; SET updates after
every epoch (469 steps) with fraction 0.3 to the end; RigL every 100 steps with 0.3 to 0.75
of the job. Each runs on 1 process, and SET again on 2 ranks under a hypergraph plan (the rows
a step moves as the topology drifts).

`--locality`: growth that knows the plan. RigL (every 100 steps, 0.3 to 0.75) with
`--grow-locality 1` and `8` on --ranks ranks (hypergraph plans; more ranks than cores is fine
for the counts): the rows a step moves at the end and the test accuracy (record
dynamic-sparsity-locality).

`--peer CHECKOUT`: SET against the Truly Sparse code (a checkout of
github.com/SelimaC/large-scale-sparse-neural-networks), its SET_MLP class driven by
truly_sparse.py with the settings of its set_mlp_sequential.py on the same MNIST, beside
spdnn's SET at P = 1 and 2, the same epochs (record dynamic-sparsity-truly-sparse). CHECKOUT:
`git clone https://github.com/SelimaC/large-scale-sparse-neural-networks CHECKOUT`.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    parser,
    publish,
    run_job,
    shared_mnist,
    spdnn_tool,
    summary_row,
    table,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPDNN_THREADS": "1"}
RECIPE = ["--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9", "--weight-decay", "2e-4",
          "--dropout", "0.3", "--batch-size", "128"]
MODES = {"static": [],
         "SET": ["--sparse-update", "set", "--update-every", "469", "--drop-fraction", "0.3",
                 "--update-until", "1.0"],
         "RigL": ["--sparse-update", "rigl", "--update-every", "100", "--drop-fraction", "0.3",
                  "--update-until", "0.75"]}


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    rows = {(r["training"], r["ranks"]): r for r in tables[0]}
    static = rows[("static", "1")]
    out = []
    for mode in ("SET", "RigL"):
        r = rows[(mode, "1")]
        diff = 100 * (float(r["test accuracy"]) - float(static["test accuracy"]))
        out.append(summary_row(
            f"{mode} on MNIST, SET-MLP 784-1000x3-10 (epsilon 20), {r['epochs']} epochs: test "
            "accuracy", f"{r['test accuracy']} ({r['updates']} updates, "
            f"{r['update share']} of the time)", f"{static['test accuracy']} (static, same "
            "density)", f"{diff:+.2f} points"))
    two = rows.get(("SET", "2"))
    if two is not None:
        out.append(summary_row(
            "SET at P = 2 (hypergraph plan of the first topology): rows a step moves",
            f"{two['rows a step, last']} after the last update",
            f"{two['rows a step, first']} before the first", f"{float(two['drift']):.2f}x"))
    return out


def locality_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    rows = {(r["ranks"], r["W"]): r for r in tables[0]}
    out = []
    for ranks in dict.fromkeys(r["ranks"] for r in tables[0]):
        near, plain = rows[(ranks, "8")], rows[(ranks, "1")]
        last = float(near["rows a step, last"].replace(",", ""))
        base = float(plain["rows a step, last"].replace(",", ""))
        diff = 100 * (float(near["test accuracy"]) - float(plain["test accuracy"]))
        out.append(summary_row(
            f"RigL with --grow-locality 8 at P = {ranks}, SET-MLP on MNIST, "
            f"{near['epochs']} epochs: rows a step at the end; test accuracy",
            f"{near['rows a step, last']}; {near['test accuracy']}",
            f"{plain['rows a step, last']}; {plain['test accuracy']} (W = 1)",
            f"{last / base:.2f}x the rows; {diff:+.2f} points"))
    return out


def locality(args, net: Path, mnist: Path, work: Path) -> int:  # noqa: ANN001
    rows = []
    for ranks in args.ranks:
        plan = work / f"set-mlp-p{ranks}.npz"
        spdnn_tool("spdnn-partition", net, "-P", ranks, "-o", plan, env=ENV)
        for w in ("1", "8"):
            m = run_job(["train", "--network", str(net), "--plan", str(plan), "--data",
                         f"mnist:{mnist}", "--epochs", str(args.epochs), *RECIPE,
                         *MODES["RigL"], "--grow-locality", w], ranks, metrics=work / "m.json",
                        env=ENV).metrics
            ups = m["topology_updates"]
            rows.append([str(ranks), w, str(len(m["epochs"])),
                         f"{m['epochs'][-1]['test_accuracy']:.4f}", f"{ups[0]['rows_before']:,}",
                         f"{ups[-1]['rows_per_step']:,}"])
            print(" | ".join(rows[-1]), flush=True)
    body = ("Command: `python scripts/bench/bench_sparsity.py --locality --epochs "
            f"{args.epochs} --ranks {' '.join(map(str, args.ranks))}`. RigL `"
            + " ".join(MODES["RigL"]) + "` with `--grow-locality W`, the recipe of the main "
            "table, hypergraph plans of the first topology; rows a step: before the first "
            "update and after the last. float32, one thread per rank.\n\n"
            + table(["ranks", "W", "epochs", "test accuracy", "rows a step, first",
                     "rows a step, last"], rows))
    publish(args, "dynamic-sparsity-locality", "Growth that knows the plan", body,
            area="Dynamic sparsity", rows=locality_summary)
    return 0


def peer_summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    rows = {(r["code"], r["ranks"]): r for r in tables[0]}
    peer, one = rows[("Truly Sparse", "1")], rows[("spdnn", "1")]
    two = rows.get(("spdnn", "2"))
    diff = 100 * (float(one["test accuracy"]) - float(peer["test accuracy"]))
    speed = float(peer["epoch s (mean)"]) / float(one["epoch s (mean)"])
    at_two = (f"; P = 2: {two['epoch s (mean)']} s, {two['test accuracy']}" if two else "")
    return [summary_row(
        f"SET-MLP on MNIST (set_mlp_sequential.py's settings), {one['epochs']} epochs, against "
        "the Truly Sparse code: epoch seconds; test accuracy",
        f"{one['epoch s (mean)']} s; {one['test accuracy']}{at_two}",
        f"{peer['epoch s (mean)']} s; {peer['test accuracy']}",
        f"{speed:.1f}x faster; {diff:+.2f} points")]


def against_peer(args, net: Path, mnist: Path, work: Path) -> int:  # noqa: ANN001
    """SET in spdnn at P = 1 and 2 beside the Truly Sparse code's SET_MLP, one run."""
    plan = work / "set-mlp-p2.npz"
    spdnn_tool("spdnn-partition", net, "-P", "2", "-o", plan, env=ENV)
    rows = []
    out = work / "peer.json"
    driver = Path(__file__).with_name("truly_sparse.py")
    subprocess.run([sys.executable, str(driver), str(args.peer), str(mnist), str(args.epochs),
                    str(out)], check=True, env={**ENV, "NUMBA_NUM_THREADS": "1"})
    p = json.loads(out.read_text())
    rows.append(["Truly Sparse", "1", str(p["epochs"]), f"{p['test_accuracy']:.4f}",
                 f"{p['seconds'] / p['epochs']:.2f}"])
    print(" | ".join(rows[-1]), flush=True)
    for ranks in (1, 2):
        cmd = ["train", "--network", str(net), "--data", f"mnist:{mnist}", "--epochs",
               str(args.epochs), *RECIPE, *MODES["SET"],
               *(["--plan", str(plan)] if ranks > 1 else [])]
        epochs = run_job(cmd, ranks, metrics=work / "m.json", env=ENV).metrics["epochs"]
        rows.append(["spdnn", str(ranks), str(len(epochs)),
                     f"{epochs[-1]['test_accuracy']:.4f}",
                     f"{sum(e['seconds'] for e in epochs) / len(epochs):.2f}"])
        print(" | ".join(rows[-1]), flush=True)
    commit = subprocess.run(["git", "-C", str(args.peer), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown commit"
    body = ("Command: `python scripts/bench/bench_sparsity.py --peer CHECKOUT --epochs "
            f"{args.epochs}` (the Truly Sparse code at {commit}). Both train 784 -> 1000 x 3 "
            "-> 10 with All-ReLU (-0.6, 0.6, -0.6), epsilon 20, SET with zeta 0.3 after every "
            "epoch, SGD lr 0.01 momentum 0.9, weight decay 2e-4, dropout 0.3, batch 128, "
            "float32, on x / 255 of the MNIST under ../shared/data/mnist, one thread. "
            "What differs, as each code defines it: the Truly Sparse code decays every weight "
            "and bias by 2e-4 of itself each step outside the momentum (spdnn, as torch.optim.SGD,"
            " adds 2e-4 w to the gradient); it initialises He-uniform over the dense fan-in "
            "(spdnn: normal over the row's own fan-in); it ranks and regrows a whole layer "
            "(spdnn: `--update-scope row`); it drops the last partial batch. Its epoch: `fit` "
            "with testing off, the evolution included; spdnn's: the epoch's seconds of "
            "--metrics-out, the update included.\n\n"
            + table(["code", "ranks", "epochs", "test accuracy", "epoch s (mean)"], rows))
    publish(args, "dynamic-sparsity-truly-sparse", "SET against the Truly Sparse code", body,
            area="Dynamic sparsity", rows=peer_summary,
            command="python scripts/bench/bench_sparsity.py --peer CHECKOUT --epochs "
            f"{args.epochs}")
    return 0


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--locality", action="store_true")
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--peer", type=Path, help="a checkout of the Truly Sparse code")
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    args.epochs = args.epochs or (3 if args.locality else 10)
    mnist = shared_mnist()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        net, plan = work / "set-mlp.npz", work / "set-mlp-p2.npz"
        spdnn_tool("spdnn", "generate", "random", "--sizes", "784,1000,1000,1000", "--fan-in",
                   "36,40,40", "--head", "10", "--activations",
                   "leaky_relu:-0.6,leaky_relu:0.6,leaky_relu:-0.6", "--seed", "0", "-o", net,
                   env=ENV)
        if args.locality:
            return locality(args, net, mnist, work)
        if args.peer:
            return against_peer(args, net, mnist, work)
        spdnn_tool("spdnn-partition", net, "-P", "2", "-o", plan, env=ENV)
        for mode, ranks in (("static", 1), ("SET", 1), ("RigL", 1), ("SET", 2)):
            cmd = ["train", "--network", str(net), "--data", f"mnist:{mnist}", "--epochs",
                   str(args.epochs), *RECIPE, *MODES[mode],
                   *(["--plan", str(plan)] if ranks > 1 else [])]
            job = run_job(cmd, ranks, metrics=work / "m.json", env=ENV)
            m = job.metrics
            epochs = m["epochs"]
            ups = m["topology_updates"]
            train_s = sum(e["seconds"] for e in epochs)
            up_s = sum(u["seconds"] for u in ups)
            rows.append([mode, str(ranks), str(len(epochs)), f"{epochs[-1]['test_accuracy']:.4f}",
                         f"{statistics.median(e['seconds'] for e in epochs):.2f}",
                         str(len(ups)), f"{up_s:.2f}",
                         f"{100 * up_s / train_s:.1f}%" if ups else "-",
                         f"{ups[0]['rows_before']:,}" if ups else "-",
                         f"{ups[-1]['rows_per_step']:,}" if ups else "-",
                         f"{ups[-1]['rows_per_step'] / max(ups[0]['rows_before'], 1):.3f}"
                         if ups else "-"])
            print(" | ".join(rows[-1]), flush=True)
    body = ("Command: `python scripts/bench/bench_sparsity.py --epochs " + str(args.epochs)
            + "`. `spdnn train --network set-mlp.npz --data mnist:../shared/data/mnist "
            + " ".join(RECIPE) + "`, and for SET `" + " ".join(MODES["SET"]) + "`, for RigL `"
            + " ".join(MODES["RigL"]) + "`. The epoch's seconds include the updates that "
            "follow its steps; `update share`: the updates' seconds over the epochs'; rows a "
            "step: under the plan in force, before the first update and after the last. "
            "float32, one thread per rank.\n\n"
            + table(["training", "ranks", "epochs", "test accuracy", "epoch s (median)",
                     "updates", "update s", "update share", "rows a step, first",
                     "rows a step, last", "drift"], rows))
    publish(args, "dynamic-sparsity-mnist", "Dynamic sparsity on MNIST", body,
            area="Dynamic sparsity", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
