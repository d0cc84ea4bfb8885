"""``spdnn calibrate``'s flags."""

from __future__ import annotations

from spdnn.cli.parsers.common import command
from spdnn.model.choices import VALUE_TYPES


def add_calibrate(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn calibrate``."""
    cal = command(sub, "calibrate", "measure this machine for the cost model",
                   "Measure, on every rank at once, the time per nonzero x sample of the local "
                   "products over a grid of batch sizes, input rows and reuse, from cold and "
                   "warm caches, the runtime's fixed costs per layer, step and message, and (on "
                   "2 or more ranks) the latency and bandwidth between ranks 0 and 1 and of the "
                   "all-reduce. Run it with as many ranks as a node will run; it takes about "
                   "two minutes (--quick: about a third of that). The file feeds "
                   "spdnn-partition model and spdnn train --replicas auto.")
    cal.add_argument("-o", "--output", required=True, help="calibration to write (.json)")
    cal.add_argument("--dtype", choices=VALUE_TYPES, nargs="+", default=list(VALUE_TYPES),
                     help="the value types to measure kernel tables for (default: all; "
                          "bfloat16 adds float32's, against which the reference steps are "
                          "scaled; a prediction for a type the file lacks uses float32's "
                          "tables)")
    cal.add_argument("--quick", action="store_true",
                     help="a coarse grid, one call a cold cell and one round of reference "
                          "steps: to try the cost model out; predictions from it carry more "
                          "error")
