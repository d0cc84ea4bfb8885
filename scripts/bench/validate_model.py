"""The cost model against measured training steps on this machine, side by side.

    python scripts/bench/validate_model.py [--rounds 3] [--steps 20] [--calibration FILE]
                                     [--batch 32 256] [--networks mlp random radixnet]
                                     [--optimizer sgd|adam|...] [--dtype bfloat16]
                                     [--no-write]
                                     [--save-measurements FILE]
    python scripts/bench/validate_model.py --measurements FILE [--calibration FILE] --no-write

Networks (float32, a dense 10-way head, synthetic inputs and labels): `mlp`, the MNIST MLP
784 -> 1024 -> 1024 (fan-in 32); `random`, 4096 -> 16384 x 3 (fan-in 32); `radixnet`, the first
3 RadiX-Net layers of 16384 neurons. Grids: P = 1; P = 2 as 2 parts x 1 replica under the
hypergraph and the block plan; and 1 part x 2 replicas. Each configuration runs in a fresh
process (mpiexec for P = 2) that times `steps` steps of the optimizer (SGD with momentum 0.9
by default; `--optimizer` another at its defaults, a section of its own) with `--exchange
dense`, which the model assumes, after 2 warm-up steps and reports the median of the slowest
rank's step (`--dtype bfloat16`: steps in bfloat16, a section of its own); rounds are
interleaved (each runs a network's configurations in a rotated order), each predicted from a
calibration taken just before it (this host's speed drifts), and the median kept. When the
hypergraph search keeps the block plan, the two rows are one configuration measured twice: the
order is judged on distinct configurations, and their difference is
reported as the resolution of the measurements. Writes the table to docs/SCALING.md.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, Ranks, number, parser, publish, summary_row, table  # noqa: E402

from spdnn.io.atomic import write_text  # noqa: E402

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve()
SCALING = ROOT / "docs" / "SCALING.md"
MEASUREMENTS_FORMAT = "spdnn-validation/1"  # {"steps": {case: [s per round]}, "calibrations"}
CONFIGS = (("1x1", None, 1), ("2x1", "hypergraph", 1), ("2x1", "block", 1), ("1x2", None, 2))


def worker(args: argparse.Namespace) -> None:
    """One configuration's median step (the parent imported spdnn first, so BLAS and numba
    run one thread per rank here too: the pinned variables are inherited)."""
    from spdnn.comm.mpi import Communicator
    from spdnn.kernels.update import PARALLEL
    from spdnn.optim import interleave, load_kernels, make
    from spdnn.runtime.session import open_network

    comm = Communicator()
    batch = args.batch[0]
    dnet = open_network(comm, args.net, args.plan, args.dtype, args.replicas, "dense").dnet
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, dnet.sizes[0])).astype(np.float32)
    y = rng.integers(0, 10, batch)
    mine = np.arange(batch)[dnet.grid.share(batch)]
    xs = np.ascontiguousarray(x[mine][:, dnet.input_rows].T)
    load_kernels((args.optimizer,), (dnet.dtype.type,), parallel=PARALLEL)
    # the fused updates, as `spdnn train` runs them (the model's calibration times those)
    opt = make(optimizer_of(args.optimizer), dnet.parameters(), parallel=PARALLEL)

    def timed() -> float:
        comm.barrier()
        t0 = time.perf_counter()
        fwd = dnet.forward(xs)
        _, _, gw, gb = dnet.backward(fwd, y[mine], "cross_entropy", batch)
        opt.step(interleave(gw, gb))
        dnet.weights_updated()  # bfloat16: the products' rounded copy, as training does
        return float(comm.allreduce(np.array([time.perf_counter() - t0]), "max")[0])

    for _ in range(2):
        timed()
    times = [timed() for _ in range(args.steps)]
    if comm.rank == 0:
        print(json.dumps({"median": statistics.median(times)}))


def optimizer_of(name: str):  # noqa: ANN201
    """The optimizer's config a run times: SGD at lr 0.001 with momentum 0.9 (the calibration's
    own), any other at its defaults."""
    from spdnn.optim import config_of

    return config_of(name, lr=0.001, momentum=0.9) if name == "sgd" else config_of(name)


def measure(runner: Ranks, work: Path, net: str, plan: str | None, replicas: int, batch: int,
            steps: int, optimizer: str, dtype: str) -> float:
    """One configuration in a fresh job (2 ranks: on this node, or on 2 emulated nodes)."""
    cmd = [sys.executable, str(HERE), "--worker", "--net", str(work / net), "--batch",
           str(batch), "--steps", str(steps), "--replicas", str(replicas), "--optimizer",
           optimizer, "--dtype", dtype]
    if plan:
        cmd += ["--plan", str(work / plan)]
    out = runner.run(cmd, 2 if plan or replicas > 1 else 1, timeout=1200)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median"])


def build(name: str):  # noqa: ANN201
    from spdnn.model.generate import add_head, radixnet, random_network

    if name == "mlp":
        return random_network([784, 1024, 1024], 32, seed=0, head=10)
    if name == "random":
        return random_network([4096, 16384, 16384, 16384], 32, seed=0, head=10)
    return add_head(radixnet(16384, 3, seed=0), 10, seed=0)


def summary_rows(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each network and batch: the predicted step against the measured one over every grid
    and plan of the run (the range of the errors)."""
    rows = []
    for key in dict.fromkeys((r["network"], r["batch"]) for r in tables[0]):
        mine = [r for r in tables[0] if (r["network"], r["batch"]) == key
                and r["error"] not in ("", "-")]
        if not mine:
            continue
        errors = [number(r["error"]) for r in mine]
        rows.append(summary_row(
            f"{key[0]}, batch {key[1]}: step time over {len(mine)} grids and plans (ms)",
            f"{min(number(r['predicted ms']) for r in mine):g} to "
            f"{max(number(r['predicted ms']) for r in mine):g} (predicted)",
            f"{min(number(r['measured ms']) for r in mine):g} to "
            f"{max(number(r['measured ms']) for r in mine):g} (measured)",
            f"error {min(errors):+.0f}% to {max(errors):+.0f}%"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--calibration", help="one calibration for every round (default: run "
                                          "mpiexec -n 2 spdnn calibrate before each round)")
    ap.add_argument("--networks", nargs="+", choices=["mlp", "random", "radixnet"],
                    default=["mlp", "random", "radixnet"])
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--optimizer", default="sgd", help="the optimizer the steps run (spdnn.optim; "
                                                       "sgd: momentum 0.9)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the value type the steps run in (bfloat16: a section of its own)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--save-measurements", metavar="FILE",
                    help="write the measured step times and each round's calibration (JSON), "
                         "to predict them again later")
    ap.add_argument("--measurements", metavar="FILE",
                    help="predict these saved measurements instead of measuring, each round "
                         "from its saved calibration (or from --calibration: a model change "
                         "or another calibration against the same runs)")
    ap.add_argument("--emulate", metavar="RATE",
                    help="run the 2-rank configurations, and each round's calibration, on 2 "
                         "emulated nodes linked at RATE (spdnn emulate; needs root); with "
                         "--measurements: predict them as taken on such a link (one rank per "
                         "node), building no emulation")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--net", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    from partition.methods import partition_network
    from spdnn.cost.cluster import Machine
    from spdnn.cost.costmodel import predict, single_part
    from spdnn.cost.machine import load_calibration
    from spdnn.cost.workload import workload
    from spdnn.io.bundle import save_network
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import network_patterns

    rows, misses, orders, pairs = [], [], [], [0, 0, 0]
    identical: dict[str, bool] = {}
    cases = [(name, batch, c) for name in args.networks for batch in args.batch for c in CONFIGS]
    measured: dict[tuple, list[float]] = {case: [] for case in cases}
    saved, saved_cals = None, None
    if args.measurements:
        saved = json.loads(Path(args.measurements).read_text())
        if saved.get("format") == MEASUREMENTS_FORMAT:
            saved, saved_cals = saved["steps"], saved["calibrations"]
        if saved_cals is None and not args.calibration:  # written before 2026-11-25
            ap.error(f"{args.measurements} holds no calibrations: give --calibration")
        args.rounds = min(len(saved[repr(case)]) for case in cases)
    calibrations: list[dict] = []
    predicted: dict[tuple, list] = {case: [] for case in cases}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        emulated = None
        if args.emulate and saved is None:  # saved measurements: predicted as on the link
            from spdnn.emulate import Cluster as Emulated
            from spdnn.emulate import parse_rate

            emulated = stack.enter_context(Emulated(nodes=2, rate_bps=parse_rate(args.emulate)))
            print(emulated.measure().describe(emulated.rate_bps), flush=True)
        runner = Ranks(emulated)
        works, owners = {}, {}
        for name in args.networks:
            net = build(name)
            save_network(net, work / f"{name}.npz")
            pats = network_patterns(net)
            works[name, None] = workload(pats, single_part(net.sizes))
            for method in ("hypergraph", "block"):
                plan = partition_network(pats, 2, method=method, seed=0,
                                         fingerprint=net.fingerprint())
                save_plan(plan, work / f"{name}-{method}.npz")
                works[name, method] = workload(pats, plan)
                owners[name, method] = plan.owners
            # The search keeps the best of its candidates, the block plan among them: when it
            # wins, the two rows are one configuration measured twice (the noise floor).
            identical[name] = all(np.array_equal(a, b) for a, b in zip(
                owners[name, "hypergraph"], owners[name, "block"]))
        for r in range(args.rounds):
            # This host's speed drifts by up to 2.5x over minutes (a shared virtual machine):
            # each round is predicted from a calibration taken just before it.
            path = args.calibration
            if path is None:
                path = str(work / f"calibration-{r}.json")
                if saved_cals is not None:
                    write_text(path, json.dumps(saved_cals[r]))
                else:
                    runner.run([str(BIN / "spdnn"), "calibrate", "-o", path, "--dtype",
                                args.dtype], 2, timeout=600)
            calibrations.append(json.loads(Path(path).read_text()))
            machine = Machine(load_calibration(path))
            if args.emulate:  # ranks on separate nodes: messages overlap with work
                from spdnn.cost.cluster import Cluster

                net = machine.calibration.network
                machine = Machine(machine.calibration, Cluster(
                    name="2 emulated nodes", ranks_per_node=1, intra=net, inter=net,
                    sources=("spdnn calibrate on the emulated nodes",),
                    assumptions="one rank per node"))
            # Each round runs a (network, batch)'s configurations in another order: a position
            # in the sequence (what ran just before) must not favour one of them every time.
            for case in sorted(cases, key=lambda c: (
                    c[0], c[1], (CONFIGS.index(c[2]) - r) % len(CONFIGS))):
                name, batch, (grid, method, replicas) = case
                plan = f"{name}-{method}.npz" if method else None
                if saved is not None:
                    measured[case].append(saved[repr(case)][r])
                else:
                    measured[case].append(measure(runner, work, f"{name}.npz", plan, replicas,
                                                  batch, args.steps, args.optimizer,
                                                  args.dtype))
                predicted[case].append(predict(works[name, method], machine, batch, replicas,
                                               dtype=args.dtype,
                                               optimizer=optimizer_of(args.optimizer)))
            print(f"round {r + 1} of {args.rounds} done", flush=True)
    if args.save_measurements:
        write_text(args.save_measurements, json.dumps({
            "format": MEASUREMENTS_FORMAT, "steps": {
                repr(case): times for case, times in measured.items()},
            "calibrations": calibrations}, separators=(",", ":")), "the measurements")
    noise: list[float] = []
    ms = lambda t: f"{1e3 * t:.3g}"  # noqa: E731 (0.687 and 102 alike)
    label = lambda c: f"{c[0]} {c[1] or ''}".strip()  # noqa: E731
    for name in args.networks:
        for batch in args.batch:
            meas, pred = {}, {}
            for c in CONFIGS:
                case = (name, batch, c)
                meas[c] = statistics.median(measured[case])
                pred[c] = statistics.median(p.seconds for p in predicted[case])
                err = statistics.median(p.seconds / m for p, m in
                                        zip(predicted[case], measured[case])) - 1
                misses.append(abs(err))
                p = predicted[case][0]
                lo, hi = min(measured[case]), max(measured[case])
                method = c[1] or "-"
                if c[1] == "hypergraph" and identical[name]:
                    method = "hypergraph = block"
                rows.append([name, str(batch), c[0], method, ms(meas[c]),
                             f"{ms(lo)}-{ms(hi)}", ms(pred[c]),
                             f"{100 * err:+.0f}%",
                             f"{100 * p.compute / p.seconds:.0f} / "
                             f"{100 * p.exchange / p.seconds:.0f} / "
                             f"{100 * p.gradient / p.seconds:.0f}"])
                print(" | ".join(rows[-1]), flush=True)
            distinct = [c for c in CONFIGS if not (c[1] == "hypergraph" and identical[name])]
            if len(distinct) < len(CONFIGS):
                twice = [statistics.median(measured[name, batch, c]) for c in CONFIGS[1:3]]
                noise.append(max(twice) / min(twice) - 1)
            by_meas = sorted(distinct, key=lambda c: meas[c])
            by_pred = sorted(distinct, key=lambda c: pred[c])
            same = by_meas == by_pred
            orders.append(same)
            for a, b in itertools.combinations(distinct, 2):
                signs = {x < y for x, y in zip(measured[name, batch, a], measured[name, batch, b])}
                pairs[0] += 1
                if len(signs) == 1:  # every round measured the pair the same way round
                    pairs[1] += 1
                    pairs[2] += (pred[a] < pred[b]) in signs
            print(f"{name}, batch {batch}: measured order {', '.join(map(label, by_meas))}; "
                  f"predicted {', '.join(map(label, by_pred))} "
                  f"({'same' if same else 'DIFFERENT'})", flush=True)
    worst = max(misses)
    verdict = (f"Largest miss {100 * worst:.0f}% over {len(misses)} cases; the model ranks "
               f"the grids and plans as measured (median over rounds) in {sum(orders)} of "
               f"{len(orders)} (network, batch) cases. Of the {pairs[0]} pairs of distinct "
               f"configurations, {pairs[1]} were measured in the same order in every round; "
               f"the model orders {pairs[2]} of these {pairs[1]} as measured.")
    if noise:
        verdict += (" Where the hypergraph plan is the block plan, the same configuration "
                    f"measured twice per round differs by up to {100 * max(noise):.0f}% "
                    "(medians): the resolution of these measurements.")
    print(verdict)
    cal = "a calibration before each round (`mpiexec -n 2 spdnn calibrate --dtype " \
          f"{args.dtype}`)" if args.calibration is None else f"`{args.calibration}`"
    cmd = (f"python scripts/bench/validate_model.py --rounds {args.rounds} "
           f"--steps {args.steps} "
           f"--networks {' '.join(args.networks)}"
           + (f" --emulate {args.emulate}" if args.emulate else "")
           + (f" --optimizer {args.optimizer}" if args.optimizer != "sgd" else "")
           + (f" --dtype {args.dtype}" if args.dtype != "float32" else ""))
    if args.save_measurements:
        cmd += f" --save-measurements {args.save_measurements}"
    if args.measurements:  # the steps are not in the file: --steps must be given as measured
        cmd += f" --measurements {args.measurements}"
    body = (f"Command: `{cmd}`: {cal}; {args.dtype}, {args.optimizer}, `--exchange dense`, "
            f"{args.rounds} "
            f"interleaved rounds of {args.steps} steps (median step of the slowest rank), the "
            "configurations in a rotated order each round. "
            "`measured ms`: median over the rounds, with their range; `error`: the median "
            "over rounds of predicted / measured - 1, each round against its own "
            "calibration. Share: compute / exchange / gradient sum of the predicted step, "
            "on the rank that finishes last.\n\n"
            + table(["network", "batch", "grid", "plan", "measured ms", "range ms",
                     "predicted ms", "error", "share %"], rows) + "\n\n" + verdict)
    if args.emulate:
        body = body.replace("mpiexec -n 2", f"spdnn emulate --nodes 2 --link {args.emulate} "
                            "-n 2 --")
        body = body.replace("Command:", f"On 2 emulated nodes linked at {args.emulate} "
                            "(one rank each; the 1x1 rows run alone). Command:")
        # one section per link and set of networks (each set is run on its own for time)
        nets = "-".join(args.networks)
        publish(args, f"validation-{args.emulate}-{nets}", "Validation over an emulated "
                f"{args.emulate} link: {', '.join(args.networks)}", body, page="SCALING",
                area="Cost model", rows=summary_rows, command=cmd)
    elif args.dtype != "float32":  # a section of its own
        publish(args, f"validation-{args.dtype}", f"Validation on this machine: {args.dtype}",
                body, page="SCALING", area="Cost model", rows=summary_rows, command=cmd)
    elif args.optimizer != "sgd":  # a section of its own
        publish(args, f"validation-{args.optimizer}", f"Validation on this machine: "
                f"{args.optimizer}", body, page="SCALING", area="Cost model", rows=summary_rows,
                command=cmd)
    else:
        publish(args, "validation", "Validation on this machine", body, page="SCALING",
                area="Cost model", rows=summary_rows, command=cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
