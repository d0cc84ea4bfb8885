"""The ``spdnn`` command line: the parser, joined from each command's (``spdnn.cli.parsers``),
and ``main`` (the commands are in commands.py).

Errors in the user's input print one line (``spdnn: error: FILE[:LINE]: problem``) and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spdnn.cli._emulate import add_parser as add_emulate
from spdnn.cli._examples import EXAMPLES
from spdnn.cli.options import OneLineParser, report
from spdnn.cli.parsers import calibrate, convert, generate, infer, plot, train
from spdnn.cli.parsers.common import Formatter
from spdnn.comm.threads import reserve_threads
from spdnn.errors import SpdnnError, options_named_by_flag, say_error


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="spdnn",
        description="Sparse DNN training and inference, distributed over MPI ranks by a plan.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (convert.add_convert, generate.add_generate, train.add_train, infer.add_infer,
                calibrate.add_calibrate):
        add(sub)
    add_emulate(sub, Formatter)
    plot.add_plot(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, finalize_mpi: bool = False) -> int:
    """``spdnn ARGV``; ``finalize_mpi``: a distributed command ends MPI itself, watched by
    ``--comm-timeout`` (the console script, whose process then exits; in-process callers go on
    using MPI)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.finalize_mpi = finalize_mpi
    if getattr(args, "threads", None):
        reserve_threads(args.threads)  # before anything loads numba
    from spdnn.cli.stdout import guarded_stdout

    with guarded_stdout("spdnn") as failed:
        code = _run(args)
    return failed[0] if failed and code == 0 else code


def _run(args: argparse.Namespace) -> int:
    with options_named_by_flag():
        try:
            from spdnn.cli.commands import COMMANDS

            return COMMANDS[args.command](args) or 0
        except SpdnnError as exc:
            report("spdnn", str(exc))
            return exc.exit_code
        except KeyboardInterrupt:
            from spdnn.comm.interrupt import interrupted

            # One line from rank 0 (the launcher interrupts every rank), and out at once: a
            # normal exit would wait in MPI_Finalize for peers that are gone.
            interrupted("spdnn")
            return 130
        except MemoryError:
            say_error("spdnn", "out of memory")
            return 1


if __name__ == "__main__":
    sys.exit(main())

