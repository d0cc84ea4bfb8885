"""The ``spdnn-partition`` command."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from spdnn import threads  # noqa: F401  (pins BLAS threads before numpy loads)
from spdnn.errors import SpdnnError
from spdnn.io.paths import check_outputs

from .budget import search_budget
from .inputs import load_network_patterns
from .reports import (
    format_compare,
    format_stats,
    format_step_values,
    named_stats,
    objective_volume,
)

EXAMPLES = """\
examples:
  spdnn-partition net.npz -P 8 -o plan.npz                 # hypergraph method, KaHyPar
  spdnn-partition net.npz -P 8 -o plan.npz --compare       # ... and the baselines beside it
  spdnn-partition net.npz -P 4 -o block.npz --method block
  spdnn-partition net.npz -P 8 -o infer.npz --objective infer   # inference-only plan
  spdnn-partition net.npz -P 8 -o plan.npz --exact-sweeps 1     # slower, exact polish
  spdnn-partition big.npz -P 64 -o plan.npz --time-limit 600 --jobs 2   # best plan in 10 min
  spdnn-partition big.npz -P 8 -o plan.npz --threads 2   # Mt-KaHyPar layers on 2 threads
  spdnn-partition stats net.npz plan.npz                   # the statistics table of a plan
  spdnn-partition export net.npz -o net.hgr                # hMETIS hypergraph for other tools
  spdnn-partition import net.npz net.hgr.part.8 -P 8 -o plan.npz
  spdnn-partition model net.npz --plans plan2.npz plan4.npz --batch-size 256 \\
      --calibration machine.json --replicas 1,2,4      # predicted time per step
"""


def _parser_partition() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spdnn-partition",
        description="Assign every neuron of every layer to one of P ranks, minimising the "
                    "communication volume with every layer balanced; writes a plan file. "
                    "Other forms: 'spdnn-partition stats|export|import|model ...'.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("network", help="network bundle (.npz)")
    p.add_argument("-P", "--nparts", type=int, required=True, help="number of ranks")
    p.add_argument("-o", "--output", required=True, help="plan file to write (.npz)")
    p.add_argument("--method", default="hypergraph",
                   choices=["hypergraph", "block", "cyclic", "random"])
    p.add_argument("--epsilon", type=float, default=0.03,
                   help="per-layer imbalance allowed (default 0.03)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto", choices=["auto", "kahypar", "mtkahypar"],
                   help="partitioner of the layer-by-layer runs. auto (default): KaHyPar on "
                        "layers made of groups of identical rows (RadiX-Net, Graph Challenge), "
                        "Mt-KaHyPar, if installed, on the others (faster and slightly better "
                        "on unstructured layers: docs/BENCHMARKS.md); or one of them everywhere")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="threads of the Mt-KaHyPar solves (default 1); the plan is the same "
                        "for any N. KaHyPar is sequential")
    p.add_argument("--objective", default="train", choices=["train", "infer"],
                   help="volume to minimise: train = forward + backward rows of a training "
                        "step (default), infer = forward rows only, for inference-only plans")
    p.add_argument("--exact-sweeps", type=int, default=0, metavar="N",
                   help="polish the plan by up to N sweeps of exact one-layer re-assignment "
                        "(MILP, HiGHS) of its groups of identical rows; default 0 = off. "
                        "Graph Challenge 1024 network, 24 layers, P=8: one sweep, -0.7%% "
                        "volume for ~3 min more (docs/BENCHMARKS.md)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="finish within SECONDS (the whole command): the search stops in "
                        "time to write the best complete plan so far, never worse than the best "
                        "balanced baseline; the output names the starts that did not finish. "
                        "Default: no limit")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="worker processes for independent starts and refinements (default 1); "
                        "the plan is the same for any N; memory grows with N")
    p.add_argument("--no-shortcuts", action="store_true",
                   help="run every start to the end, even the layer-by-layer run on a network "
                        "where its first layer shows it cannot beat the baselines")
    p.add_argument("--compare", action="store_true", help="print the baselines beside the plan")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _parser_stats() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spdnn-partition stats",
                                description="Print the statistics of a plan.")
    p.add_argument("network")
    p.add_argument("plan")
    p.add_argument("--compare", action="store_true", help="add the baselines")
    p.add_argument("--replicas", type=int, default=None, metavar="R",
                   help="also predict the values one training step moves on R replicas of "
                        "this plan (expand, fold and the gradient sums); needs --batch-size")
    p.add_argument("--batch-size", type=int, default=None, metavar="B")
    p.add_argument("--plot", metavar="FILE",
                   help="draw per-layer forward and backward volume beside the baselines, and "
                        "each rank's rows sent and received (.png/.pdf/.svg; needs matplotlib)")
    return p


def _parser_export() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spdnn-partition export",
                                description="Write the network's hypergraph in hMETIS format.")
    p.add_argument("network")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--objective", default="train", choices=["train", "infer"],
                   help="net weights: train = 1 for layer-0 nets, 2 otherwise (default); "
                        "infer = 1 for every net")
    return p


def _parser_import() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spdnn-partition import",
                                description="Turn a partition file (one block per line, hMETIS "
                                            "convention, vertices numbered layer after layer) "
                                            "into a plan.")
    p.add_argument("network")
    p.add_argument("partition")
    p.add_argument("-P", "--nparts", type=int, required=True)
    p.add_argument("-o", "--output", required=True)
    return p


def _check_nparts(nparts: int, sizes: Sequence[int]) -> None:
    if nparts < 1:
        raise SpdnnError(f"-P must be at least 1, not {nparts}")
    if nparts > max(sizes):
        # Arrays of P entries (loads, counts per part) are allocated: refuse a P that no layer
        # could use before sizing anything by it.
        raise SpdnnError(f"-P {nparts} exceeds the largest layer ({max(sizes)} neurons): every "
                         "part would own nothing in every layer")
    small = [k for k, n in enumerate(sizes) if n < nparts]
    if small:
        print(f"note: P={nparts} exceeds the neuron count of layer(s) "
              f"{', '.join(map(str, small[:5]))}: some ranks own no neuron there (allowed)",
              file=sys.stderr)


def cmd_partition(argv: Sequence[str]) -> None:
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import balance_report, imbalance_limits, plan_statistics

    from .methods import partition_network

    args = _parser_partition().parse_args(argv)
    check_outputs([("-o", args.output)])  # before any work
    if not 0 < args.epsilon < 1:
        raise SpdnnError(f"--epsilon must be in (0, 1), not {args.epsilon}")
    if args.exact_sweeps < 0:
        raise SpdnnError(f"--exact-sweeps must be at least 0, not {args.exact_sweeps}")
    if args.threads < 1:
        raise SpdnnError(f"--threads must be at least 1, not {args.threads}")
    if args.time_limit is not None and not 0 < args.time_limit < float("inf"):
        raise SpdnnError(f"--time-limit must be a positive number of seconds, not "
                         f"{args.time_limit}")
    if args.jobs < 1:
        raise SpdnnError(f"--jobs must be at least 1, not {args.jobs}")
    bundle, patterns = load_network_patterns(args.network)
    _check_nparts(args.nparts, bundle.sizes)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    plan = partition_network(patterns, args.nparts, args.method, args.epsilon, args.seed,
                             args.backend, bundle.fingerprint(), log,
                             objective=args.objective, exact_sweeps=args.exact_sweeps,
                             threads=args.threads, jobs=args.jobs,
                             shortcuts=not args.no_shortcuts,
                             time_limit=None if args.time_limit is None else
                             search_budget(args.time_limit))
    save_plan(plan, args.output)
    stats = plan_statistics(patterns, plan.owners, args.nparts)
    limits = imbalance_limits(patterns, args.nparts, args.epsilon)
    print(f"wrote {args.output}: P={args.nparts}, method {args.method}, "
          f"{objective_volume(stats, args.objective)}; "
          f"{balance_report(stats, limits)}; {plan.meta['partition_seconds']:.1f} s")
    for line in plan.meta.get("shortcuts") or []:
        print(f"shortcut: {line}")
    unfinished = plan.meta.get("unfinished") or []
    if unfinished:
        print(f"time limit {args.time_limit:g} s reached; not finished: "
              f"{'; '.join(unfinished)}")
    if args.compare:
        named = named_stats(patterns, plan.owners, args.nparts, args.method, args.seed)
        print(format_compare(named, "block"))


def cmd_stats(argv: Sequence[str]) -> None:
    from spdnn.io.planfile import load_plan
    from spdnn.model.plan import balance_report, imbalance_limits, plan_statistics, step_values

    args = _parser_stats().parse_args(argv)
    check_outputs([("--plot", args.plot)])
    bundle, patterns = load_network_patterns(args.network)
    plan = load_plan(args.plan)
    plan.check_for(bundle.sizes, bundle.fingerprint(), args.plan)
    stats = plan_statistics(patterns, plan.owners, plan.nparts)
    objective = plan.meta.get("objective", "train")
    epsilon = plan.meta.get("epsilon")
    limits = imbalance_limits(patterns, plan.nparts, float(epsilon)) \
        if isinstance(epsilon, (int, float)) else None
    print(f"plan {args.plan}: P={plan.nparts}, method {plan.meta.get('method', '?')}, "
          f"objective {objective}; {balance_report(stats, limits)}")
    print(format_stats(stats, bundle.sizes, limits, objective))
    if args.compare or args.plot:
        method = plan.meta.get("method", "plan")
        named = named_stats(patterns, plan.owners, plan.nparts, method,
                             int(plan.meta.get("seed", 0) or 0))
        if args.compare:
            print(format_compare(named, "block"))
        if args.plot:
            from spdnn.io.plots import plot_plan

            plot_plan(named, bundle.sizes, f"{os.path.basename(args.plan)}: P={plan.nparts}, "
                      f"{method} plan and baselines", args.plot)
            print(f"wrote {args.plot}")
    if args.replicas is not None or args.batch_size is not None:
        if not (args.replicas or 0) >= 1 or not (args.batch_size or 0) >= 1:
            raise SpdnnError("--replicas and --batch-size go together, each at least 1")
        print(format_step_values(step_values(stats, [len(p[1]) for p in patterns],
                                             bundle.sizes[1:], args.replicas,
                                             args.batch_size)))


def cmd_export(argv: Sequence[str]) -> None:
    from .hypergraph import build_hypergraph, write_hmetis

    args = _parser_export().parse_args(argv)
    check_outputs([("-o", args.output)])  # before any work
    _, patterns = load_network_patterns(args.network)
    hg = build_hypergraph(patterns, args.objective)
    write_hmetis(hg, args.output)
    print(f"wrote {args.output}: {hg.n_nets:,} nets, {hg.n_vertices:,} vertices (layer k's "
          f"neuron i is vertex offset_k + i + 1, offsets {hg.offsets[:-1].tolist()[:6]}...)")


def cmd_import(argv: Sequence[str]) -> None:
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import Plan, plan_statistics

    from .hypergraph import build_hypergraph, read_partition

    args = _parser_import().parse_args(argv)
    check_outputs([("-o", args.output)])  # before any work
    bundle, patterns = load_network_patterns(args.network)
    _check_nparts(args.nparts, bundle.sizes)
    hg = build_hypergraph(patterns)
    parts = read_partition(args.partition, hg.n_vertices, args.nparts)
    owners = hg.split(parts)
    stats = plan_statistics(patterns, owners, args.nparts)
    plan = Plan(args.nparts, tuple(owners), {
        "method": "imported", "source": args.partition, "fingerprint": bundle.fingerprint(),
        "epsilon": None, "seed": None, "backend": None, "partition_seconds": 0.0,
        "stats": stats.summary()})
    save_plan(plan, args.output)
    print(f"wrote {args.output}: volume {stats.volume:,} rows, max imbalance "
          f"{100 * stats.max_imbalance:.2f}%")


def cmd_model(argv: Sequence[str]) -> None:
    from .model import cmd_model as run

    run(argv)


SUBCOMMANDS = {"stats": cmd_stats, "export": cmd_export, "import": cmd_import,
               "model": cmd_model}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = SUBCOMMANDS.get(argv[0]) if argv else None
    try:
        if command:
            command(argv[1:])
        else:
            cmd_partition(argv)
    except SpdnnError as exc:
        print(f"spdnn-partition: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("spdnn-partition: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
