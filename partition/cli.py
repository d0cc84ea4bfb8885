"""The ``spdnn-partition`` command."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import spdnn.cli.thread_pools  # noqa: F401  (one BLAS thread, before numpy loads)
from spdnn.errors import OptionError, SpdnnError, say_error
from spdnn.io.paths import check_outputs
from spdnn.schema import from_args

from .inputs import load_network_patterns
from .options import PartitionOptions
from .parsers import (
    check_nparts,
    parser_export,
    parser_import,
    parser_partition,
    parser_stats,
)
from .time_budget import process_seconds

if TYPE_CHECKING:
    from spdnn.model.plan import Plan

from .reports import (
    format_compare,
    format_stats,
    format_step_values,
    named_stats,
    objective_volume,
)


def cmd_partition(argv: Sequence[str]) -> None:
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import PlanStats, balance_report, imbalance_limits

    from .methods import partition_network

    args = parser_partition().parse_args(argv)
    check_outputs([("-o", args.output)], inputs=[("NETWORK", args.network)])  # before any work
    # --memory-limit chooses windows here (``windowed``), not in the options' search
    options = from_args(PartitionOptions, args, memory_limit=None).checked(args.nparts)
    t0 = time.perf_counter()

    progress = not args.quiet and (args.verbose or sys.stderr.isatty())

    def log(msg: str) -> None:
        if progress:
            print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    if windowed(args, options, log):
        return
    bundle, patterns = load_network_patterns(args.network)
    check_nparts(args.nparts, bundle.sizes)

    plan = partition_network(patterns, args.nparts, fingerprint=bundle.fingerprint(), log=log,
                             exact_sweeps=options.exact_sweeps,
                             time_limit=options.search_seconds(process_seconds()),
                             **options.search())
    save_plan(plan, args.output)
    stats = PlanStats.from_summary(plan.meta["stats"])
    limits = imbalance_limits(patterns, args.nparts, args.epsilon)
    print(f"wrote {args.output}: P={args.nparts}, method {args.method}, "
          f"{objective_volume(stats, args.objective)}; "
          f"{balance_report(stats, limits)}; {plan.meta['partition_seconds']:.1f} s")
    report_unfinished(plan, args.time_limit)
    if args.compare:
        named = named_stats(patterns, plan.owners, args.nparts, args.method, args.seed)
        print(format_compare(named, "block"))


def windowed(args: argparse.Namespace, options: PartitionOptions,
             log: Callable[[str], None]) -> bool:
    """Partition in windows of layers when the whole hypergraph is predicted past the memory
    limit, or when asked to; False (nothing done) when the whole search fits."""
    from spdnn.comm.memlimit import parse_bytes, process_limit
    from spdnn.io.bundle import NetworkBundle
    from spdnn.io.planfile import save_plan
    from spdnn.model.memory import format_bytes
    from spdnn.model.plan import balance_report

    from .groups import first_layer_grouped
    from .windows import choose_windows, partition_windows, whole_bytes

    if args.memory_limit is not None:
        limit, where = parse_bytes(args.memory_limit), "--memory-limit"
    else:
        limit, where = process_limit()
    bundle = NetworkBundle(args.network)  # headers only: every layer is checked when read
    check_nparts(args.nparts, bundle.sizes)
    grouped = args.method == "sweep" and first_layer_grouped(bundle, args.nparts, args.epsilon)
    whole = whole_bytes(bundle, args.nparts, args.jobs, args.method, grouped)
    if args.window_layers is None and (limit == 0 or whole <= limit):
        bundle.close()
        return False
    options.check_windowed()
    windows = choose_windows(bundle, args.nparts, limit=limit or 2**62, jobs=args.jobs,
                             max_layers=args.window_layers, name=args.network,
                             method=args.method, grouped=grouped)
    log(f"the whole hypergraph needs about {format_bytes(whole)}, the limit is "
        f"{format_bytes(limit) if limit else 'none'} ({where}): {len(windows)} windows of "
        f"at most {max(w.last - w.first + 1 for w in windows)} layers")
    t0 = time.perf_counter()
    done = partition_windows(bundle, args.nparts, windows, log=log,
                             time_limit=options.search_seconds(process_seconds()),
                             **options.search())
    plan = done.plan
    plan.meta["partition_seconds"] = time.perf_counter() - t0
    plan.meta["memory_limit"] = limit
    save_plan(plan, args.output)
    print(f"wrote {args.output}: P={args.nparts}, method {args.method} in {len(windows)} "
          f"windows, {objective_volume(done.stats, args.objective)}; "
          f"{balance_report(done.stats, done.limits)}; {plan.meta['partition_seconds']:.1f} s")
    report_unfinished(plan, args.time_limit)
    if args.compare:
        print(format_compare({args.method: done.stats} | {
            b: s for b, s in done.baselines.items() if b != args.method}, "block"))
    return True


def report_unfinished(plan: Plan, time_limit: float | None) -> None:
    for line in plan.meta.get("shortcuts") or []:
        print(f"shortcut: {line}")
    unfinished = plan.meta.get("unfinished") or []
    if unfinished:
        print(f"time limit {time_limit:g} s reached; not finished: {'; '.join(unfinished)}")


def cmd_stats(argv: Sequence[str]) -> None:
    from spdnn.io.planfile import load_plan
    from spdnn.model.plan import balance_report, imbalance_limits, plan_statistics, step_values

    args = parser_stats().parse_args(argv)
    check_outputs([("--plot", args.plot)])
    bundle, patterns = load_network_patterns(args.network)
    plan = load_plan(args.plan)
    plan.check_for(bundle.sizes, bundle.fingerprint(), args.plan)
    stats = plan_statistics(patterns, plan.owners, parts=plan.parts)
    objective = plan.meta.get("objective", "train")
    epsilon = plan.meta.get("epsilon")
    limits = imbalance_limits(patterns, plan.parts, float(epsilon)) \
        if isinstance(epsilon, (int, float)) else None
    print(f"plan {args.plan}: P={plan.parts}, method {plan.meta.get('method', '?')}, "
          f"objective {objective}; {balance_report(stats, limits)}")
    print(format_stats(stats, bundle.sizes, limits, objective))
    if args.compare or args.plot:
        method = plan.meta.get("method", "plan")
        named = named_stats(patterns, plan.owners, plan.parts, method,
                             int(plan.meta.get("seed", 0) or 0))
        if args.compare:
            print(format_compare(named, "block"))
        if args.plot:
            from spdnn.io.plots import plot_plan

            plot_plan(named, bundle.sizes, f"{os.path.basename(args.plan)}: P={plan.parts}, "
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

    args = parser_export().parse_args(argv)
    check_outputs([("-o", args.output)], inputs=[("NETWORK", args.network)])  # before any work
    _, patterns = load_network_patterns(args.network)
    hg = build_hypergraph(patterns, objective=args.objective)
    write_hmetis(hg, args.output)
    print(f"wrote {args.output}: {hg.n_nets:,} nets, {hg.n_vertices:,} vertices (layer k's "
          f"neuron i is vertex offset_k + i + 1, offsets {hg.offsets[:-1].tolist()[:6]}...)")


def cmd_import(argv: Sequence[str]) -> None:
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import Plan, plan_statistics

    from .hypergraph import build_hypergraph, read_partition

    args = parser_import().parse_args(argv)
    check_outputs([("-o", args.output)], inputs=[("NETWORK", args.network),
                                                 ("PARTITION", args.partition)])
    bundle, patterns = load_network_patterns(args.network)
    check_nparts(args.nparts, bundle.sizes)
    hg = build_hypergraph(patterns)
    parts = read_partition(args.partition, n_vertices=hg.n_vertices, parts=args.nparts)
    owners = hg.split(parts)
    stats = plan_statistics(patterns, owners, parts=args.nparts)
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
        if isinstance(exc, OptionError):  # named by its flag here (-P for parts)
            exc = exc.as_flag({"parts": "-P"})
        say_error("spdnn-partition", exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("spdnn-partition: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
