"""``spdnn plot``'s flags."""

from __future__ import annotations

from spdnn.cli.parsers.common import command


def add_plot(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn plot``."""
    pl = command(sub, "plot", "plot a training run",
                  "Loss, train and test accuracy and samples/s per epoch of a run, from its "
                  "--metrics-out file (needs matplotlib: pip install matplotlib).")
    pl.add_argument("metrics", help="JSON from spdnn train --metrics-out")
    pl.add_argument("-o", "--output", required=True, help="image to write: .png, .pdf or .svg")
