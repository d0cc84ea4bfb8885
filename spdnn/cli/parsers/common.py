"""What the parsers of every command share: the help formatter, a command's parser with its
examples, and the options of the commands that run on P ranks."""

from __future__ import annotations

import argparse

from spdnn.cli._examples import EXAMPLES_BY_COMMAND
from spdnn.cli.options import positive_int
from spdnn.model.choices import DTYPE_NAMES


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Examples kept as written; every option that has a default shows it after its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings \
                and "%(default)" not in text and "(default: " not in text \
                and not isinstance(action, argparse._StoreFalseAction):
            text += " (default: %(default)s)"
        return text


DTYPES = list(DTYPE_NAMES)


def command(sub, name: str, help: str, description: str,  # noqa: ANN001, A002
             examples: str | None = None) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description,
                          epilog=EXAMPLES_BY_COMMAND.get(examples or name),
                          formatter_class=Formatter)


def run_options(p: argparse.ArgumentParser, auto: bool = False) -> None:
    """Options of the commands that run on P ranks: the network, plan, grid and dtype
    (RunOptions' declarations; ``auto``: several plans and ``--replicas auto``)."""
    from spdnn.model.options import RunOptions
    from spdnn.schema import add_flags, options

    declared = options(RunOptions)
    p.add_argument("--network", required=True, help="network bundle (.npz)")
    if auto:
        p.add_argument("--plan", action="append",
                       help=declared["plan"].help + "; with --replicas auto, once per "
                                                    "candidate")
        add_flags(p, RunOptions, only=["replicas", "calibration", "cluster"])
    else:
        p.add_argument("--plan", help=declared["plan"].help)
        p.add_argument("--replicas", type=positive_int, default=1, metavar="R",
                       help="replicas of the partitioned network: each takes a share of the "
                            "inputs")
    add_flags(p, RunOptions, only=["dtype", "exchange", "threads", "memory_limit", "dry_run",
                                   "comm_timeout"])
