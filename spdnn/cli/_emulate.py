"""``spdnn emulate``: an MPI command on an emulated multi-node cluster (docs/network.md)."""

from __future__ import annotations

import argparse
import sys

from spdnn.cli.options import positive_int

EXAMPLES = """\
examples:
  spdnn emulate --nodes 2 --link 100mbit -- spdnn train --network net.npz --plan plan2.npz \\
      --data digits --epochs 5
  spdnn emulate --nodes 2 --link 1gbit -n 4 -- python my_mpi_script.py   # 2 ranks per node
  spdnn emulate --nodes 2 --link 100mbit --stall-after 5 -- spdnn train ... --comm-timeout 20
  spdnn emulate --nodes 2 --link 1gbit --stall-when 'ckpt/step*-rank00000.npz' -- \
      spdnn train ... --checkpoint-dir ckpt --checkpoint-every 10 --comm-timeout 20
  spdnn emulate --nodes 2 --link 1gbit --stall-after 5 --slow-to 1mbit -- spdnn train ...
"""


def _rate(text: str, least: float = 1e5) -> int:
    from spdnn.emulate.links import parse_rate

    try:
        return parse_rate(text, least=least)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _trickle(text: str) -> int:
    """``--slow-to``: a rate down to 1 kbit/s."""
    return _rate(text, least=1e3)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"seconds must be >= 0: {text!r}")
    return value


def add_parser(sub, formatter: type[argparse.HelpFormatter]) -> None:  # noqa: ANN001
    em = sub.add_parser(
        "emulate", help="run an MPI command on an emulated multi-node cluster",
        description="Run COMMAND (what would follow `mpirun -n P`) on N emulated nodes of this "
                    "machine: each node is a network namespace with its own host name, nodes "
                    "talk over TCP through links shaped to RATE per node and direction, ranks "
                    "of one node share memory. The link is measured (ping-pong) and printed "
                    "first. Everything is removed on exit, error or Ctrl-C. Needs root "
                    "(namespaces and traffic shaping).",
        epilog=EXAMPLES, formatter_class=formatter)
    em.add_argument("--nodes", type=positive_int, required=True, help="emulated nodes (>= 2)")
    em.add_argument("--link", type=_rate, required=True, metavar="RATE",
                    help="each node's link rate: 100mbit, 1gbit, 10gbit, ...")
    em.add_argument("-n", dest="ranks", type=positive_int, metavar="P",
                    help="MPI ranks (default: one per node; consecutive ranks share a node)")
    em.add_argument("--stall-after", type=_seconds, metavar="SECONDS",
                    help="after this long, freeze the last node's link: no byte passes, either "
                         "way (a stalled peer; end the job with spdnn's --comm-timeout)")
    em.add_argument("--stall-when", metavar="GLOB",
                    help="freeze it once a file matching GLOB exists, e.g. a checkpoint "
                         "(an event of the job; with --stall-after, whichever comes first)")
    em.add_argument("--slow-to", type=_trickle, metavar="RATE",
                    help="at that moment slow the link to RATE instead of freezing it (a "
                         "congested link: waits finish, slowly)")
    em.add_argument("--mpiexec", help="the MPI launcher (default: the one beside this Python, "
                                      "else mpiexec on PATH; MPICH or Open MPI)")
    em.add_argument("--no-measure", action="store_true",
                    help="skip the link measurement (about 2 s at 100 Mbit/s)")
    em.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                    help="the program and its arguments")


def cmd_emulate(args: argparse.Namespace) -> int:
    from spdnn.emulate import Cluster, EmulationError, LinkFault, interrupts_as_ctrl_c

    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise EmulationError("no COMMAND given: spdnn emulate --nodes 2 --link 100mbit -- "
                             "spdnn train ...")
    if args.nodes < 2:
        raise EmulationError("--nodes must be at least 2")
    ranks = args.ranks or args.nodes
    fault = None
    if args.stall_after is not None or args.stall_when:
        fault = LinkFault(after=args.stall_after, when=args.stall_when, rate_bps=args.slow_to)
    elif args.slow_to is not None:
        raise EmulationError("--slow-to needs a moment: --stall-after SECONDS or --stall-when "
                             "GLOB")
    with interrupts_as_ctrl_c(), Cluster(nodes=args.nodes, rate_bps=args.link,
                                         mpiexec=args.mpiexec) as cluster:
        _say(cluster.describe(ranks))
        if not args.no_measure:
            _say(cluster.measure().describe(args.link))
        if fault is not None:
            _say(fault.describe(args.nodes - 1, args.link))
        what = "froze" if args.slow_to is None else "slowed"
        return cluster.run(command, ranks=ranks, fault=fault, fault_applied=lambda t: _say(
            f"node{args.nodes - 1}'s link {what} at {t:.1f} s")).returncode


def _say(text: str) -> None:
    print(f"spdnn emulate: {text}", file=sys.stderr, flush=True)
