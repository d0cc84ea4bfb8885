"""Command-line options checked at parse time: value types and ranges, output paths, and
argument errors as one line printed by one rank.

Under ``mpirun`` every rank parses the same arguments and reaches the same verdict; only the
launcher's rank 0 (read from the launcher's environment, before MPI starts) prints it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from spdnn.errors import SpdnnError, say_error

# Environment variables through which MPI launchers tell a process its rank.
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank as its launcher set it (0 when not started by a launcher)."""
    for var in _RANK_VARIABLES:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def report(prog: str, message: str) -> None:
    """``PROG: error: MESSAGE`` on stderr, from the launcher's rank 0 only."""
    if launcher_rank() == 0:
        say_error(prog, message)


class _Version(argparse.Action):
    """``--version``: the installed package's version (read only when asked: the metadata
    lookup is not paid by every command)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the installed spdnn version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        import spdnn

        print(f"{parser.prog.split()[0]} {spdnn.__version__}", flush=True)
        parser.exit()


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (with a pointer to --help), exit code 2;
    every command and subcommand answers ``--version``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action=_Version)

    def error(self, message: str) -> NoReturn:
        report(self.prog, f"{message} (see {self.prog} --help)")
        sys.exit(2)


def _integer(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if not least <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be {what}, not {text}")
    return value


def positive_int(text: str) -> int:
    return _integer(text, 1, "a positive integer")


def seed(text: str) -> int:
    return _integer(text, 0, "an integer >= 0")














def fan_ins(text: str) -> int | list[int]:
    """``--fan-in``: one count for every layer, or one per layer (``4096,128``)."""
    parts = [positive_int(p) for p in text.split(",")]
    return parts[0] if len(parts) == 1 else parts


def check_fan_in(fan_in: int | list[int], sizes: list[int]) -> None:
    """``--fan-in`` at most each layer's inputs (the library's ``random_network`` reads them
    all instead; how many counts it takes is its own rule)."""
    fans = [fan_in] * (len(sizes) - 1) if isinstance(fan_in, int) else fan_in
    for k, (n_in, f) in enumerate(zip(sizes[:-1], fans)):
        if f > n_in:
            raise SpdnnError(f"--fan-in {f} is larger than layer {k}'s {n_in} inputs: each "
                             "row would need more distinct inputs than there are")


def layer_sizes(text: str) -> list[int]:
    """``--sizes``: n_0,n_1,...,n_L."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be integers: {text}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError("need at least two positive sizes, e.g. 784,1024,1024")
    return sizes


def layers(text: str) -> int | list[str]:
    """A layer count, or comma-separated layer names."""
    if text.strip().isdigit():
        return positive_int(text)
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty layer name in {text!r}")
    return names


def cap(text: str) -> float | None:
    """``--cap``: a number, or none."""
    return None if text.lower() in ("none", "null", "") else float(text)

