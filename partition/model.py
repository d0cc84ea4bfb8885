"""``spdnn-partition model``: predicted time per training step (or inference batch) of a network
under plans and grids, from a calibration (spdnn.cost.machine, spdnn.cost.costmodel)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from spdnn.cli.options import OneLineParser, positive_int
from spdnn.errors import SpdnnError
from spdnn.io.paths import check_outputs
from spdnn.model.choices import VALUE_TYPES

EXAMPLES = """\
examples:
  mpirun -n 2 spdnn calibrate -o machine.json
  spdnn-partition net.npz -P 2 -o plan2.npz; spdnn-partition net.npz -P 4 -o plan4.npz
  spdnn-partition model net.npz --plans plan2.npz plan4.npz --batch-size 256 \\
      --calibration machine.json --replicas 1,2,4 --plot scaling.png
  spdnn-partition model net.npz --plans plan4.npz --batch-size 256 --calibration machine.json \\
      --cluster docs/cluster-hdr-infiniband.json --replicas 1,16,256 --json model.json
"""


def _replicas(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--replicas: integers, comma-separated: {text}") \
            from None
    if not values or values[0] < 1 or values[-1] > 2**20:
        raise argparse.ArgumentTypeError(f"--replicas: each from 1 to 2**20: {text}")
    return values


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="spdnn-partition model",
        description="Predict the time of one training step (forward, loss, backward with the "
                    "expand and fold messages overlapped as the runtime overlaps them, the "
                    "gradient sums over replicas, the update) for every plan and replica "
                    "count, from a calibration (spdnn calibrate) and optionally a cluster "
                    "description. Prints P, grid (parts x replicas), ms per step, speed-up "
                    "over one rank and the shares of compute, exchange and gradient sums. "
                    "Bytes are those of --exchange dense.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("network", help="network bundle (.npz)")
    p.add_argument("--plans", nargs="+", required=True, metavar="PLAN",
                   help="plans from spdnn-partition (any methods and part counts)")
    p.add_argument("--batch-size", type=positive_int, required=True, metavar="B",
                   help="samples per step (split between replicas)")
    p.add_argument("--calibration", required=True, help="from spdnn calibrate")
    p.add_argument("--cluster", help="cluster description: its network replaces the "
                                     "calibration's (docs/cost-model.md)")
    p.add_argument("--replicas", type=_replicas, default=[1], metavar="R,R,...",
                   help="replica counts to try with every plan (default: 1)")
    p.add_argument("--dtype", choices=VALUE_TYPES, default="float32",
                   help="the run's value type (default float32; bfloat16 is timed from the "
                        "calibration's bfloat16 tables, float32's when it has none)")
    p.add_argument("--infer", action="store_true",
                   help="predict an inference batch instead of a training step")
    p.add_argument("--plot", metavar="FILE", help="draw predicted speed-up against P per plan "
                                                  "method and the best grid (needs matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write every prediction as JSON")
    return p


def cmd_model(argv: Sequence[str]) -> None:
    from spdnn.cost.cluster import load_machine
    from spdnn.cost.costmodel import predict, single_part
    from spdnn.cost.workload import workload
    from spdnn.io.planfile import load_plan

    from .inputs import load_network_patterns

    args = parser().parse_args(argv)
    check_outputs([("--plot", args.plot), ("--json", args.json)])
    machine = load_machine(args.calibration, args.cluster)
    bundle, patterns = load_network_patterns(args.network)
    fingerprint = bundle.fingerprint()
    works = []
    for path in args.plans:
        plan = load_plan(path)
        plan.check_for(bundle.sizes, fingerprint, path)
        works.append((path, workload(patterns, plan)))
    single = workload(patterns, single_part(bundle.sizes))
    base = predict(single, machine, args.batch_size, 1, args.dtype, not args.infer)
    # Pure data parallelism (no plan) beside the plans, for every replica count above 1.
    works.append(("no plan", single))
    rows = []
    for path, w in works:
        for r in args.replicas:
            if r > args.batch_size:
                raise SpdnnError(f"--replicas {r}: more replicas than the {args.batch_size} "
                                 "samples of a batch")
            if w is not single or r > 1:
                rows.append((path, predict(w, machine, args.batch_size, r, args.dtype,
                                           not args.infer)))
    rows.sort(key=lambda pr: (pr[1].ranks, pr[1].seconds))
    what = "inference batch" if args.infer else "training step"
    where = f"cluster {machine.cluster.name}" if machine.cluster else \
        f"this host's calibration ({machine.calibration.host}, {machine.calibration.ranks} ranks)"
    print(f"predicted {what}, batch {args.batch_size}, {args.dtype}, on {where}; one rank: "
          f"{1e3 * base.seconds:.2f} ms")
    print(format_model(rows, base.seconds))
    if args.json:
        from spdnn.io.atomic import write_text

        payload = {"batch": args.batch_size, "dtype": args.dtype, "training": not args.infer,
                   "one_rank": base.to_json(),
                   "predictions": [{"plan": path, **p.to_json()} for path, p in rows]}
        write_text(args.json, json.dumps(payload, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        from spdnn.io.plots import plot_scaling

        best: dict[str, dict[int, float]] = {}  # per method, the fastest grid at each P
        for _, p in rows:
            at = best.setdefault("data parallel" if p.method == "single" else p.method, {1: 1.0})
            at[p.ranks] = max(at.get(p.ranks, 0.0), base.seconds / p.seconds)
        curves = {f"{method} (best grid)": sorted(at.items()) for method, at in best.items()}
        plot_scaling(curves, f"predicted {what}, batch {args.batch_size}", args.plot)
        print(f"wrote {args.plot}")


def format_model(rows: list, one_rank: float) -> str:  # noqa: ANN001
    from spdnn.io.plots import best_by_ranks

    lines = [f"{'P':>6}  {'grid':>11}  {'plan':<24} {'ms/step':>9}  {'speed-up':>8}  "
             f"{'compute':>7}  {'exchange':>8}  {'grad sum':>8}"]
    best = best_by_ranks([(p.ranks, p.seconds) for _, p in rows])
    for path, p in rows:
        mark = " *" if best.get(p.ranks) == p.seconds else ""
        name = "no plan (data parallel)" if p.method == "single" else \
            f"{path.rsplit('/', 1)[-1]} ({p.method})"[:24]
        lines.append(f"{p.ranks:6d}  {p.parts:>5} x {p.replicas:<3}  {name:<24} "
                     f"{1e3 * p.seconds:9.2f}  {one_rank / p.seconds:7.2f}x  "
                     f"{100 * p.compute / p.seconds:6.0f}%  {100 * p.exchange / p.seconds:7.0f}%"
                     f"  {100 * p.gradient / p.seconds:7.0f}%{mark}")
    lines.append("* the fastest grid for its P; shares are of the step on the rank that "
                 "finishes last")
    return "\n".join(lines)
