"""The command lines of ``spdnn-partition`` and its subcommands (partition/cli.py runs them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spdnn.cli.options import OneLineParser
from spdnn.cli.parsers.common import Formatter
from spdnn.errors import SpdnnError
from spdnn.schema import add_flags

from .options import PartitionOptions

EXAMPLES = """\
examples:
  spdnn-partition net.npz -P 8 -o plan.npz                 # sweep method (linear time)
  spdnn-partition net.npz -P 8 -o plan.npz --method hypergraph --time-limit 600  # KaHyPar too
  spdnn-partition net.npz -P 8 -o plan.npz --compare       # ... and the baselines beside it
  spdnn-partition net.npz -P 4 -o block.npz --method block
  spdnn-partition net.npz -P 8 -o infer.npz --objective infer   # inference-only plan
  spdnn-partition net.npz -P 8 -o plan.npz --exact-sweeps 1     # slower, exact polish
  spdnn-partition big.npz -P 64 -o plan.npz --time-limit 600 --jobs 2   # best plan in 10 min
  spdnn-partition big.npz -P 8 -o plan.npz --threads 2   # Mt-KaHyPar layers on 2 threads
  spdnn-partition huge.npz -P 16 -o plan.npz --memory-limit 8G --time-limit 7200
                          # in windows of layers that fit 8 GiB, read as they advance
  spdnn-partition stats net.npz plan.npz                   # the statistics table of a plan
  spdnn-partition export net.npz -o net.hgr                # hMETIS hypergraph for other tools
  spdnn-partition import net.npz net.hgr.part.8 -P 8 -o plan.npz
  spdnn-partition model net.npz --plans plan2.npz plan4.npz --batch-size 256 \\
      --calibration machine.json --replicas 1,2,4      # predicted time per step
"""


def parser_partition() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="spdnn-partition",
        description="Assign every neuron of every layer to one of P ranks, minimising the "
                    "communication volume with every layer balanced; writes a plan file. "
                    "Other forms: 'spdnn-partition stats|export|import|model ...'.",
        epilog=EXAMPLES, formatter_class=Formatter)
    p.add_argument("network", help="network bundle (.npz)")
    p.add_argument("-P", "--nparts", type=int, required=True, help="number of ranks")
    p.add_argument("-o", "--output", required=True, help="plan file to write (.npz)")
    add_flags(p, PartitionOptions)
    p.add_argument("--compare", action="store_true", help="print the baselines beside the plan")
    p.add_argument("--verbose", action="store_true",
                   help="progress lines on stderr even when it is not a terminal (a log file)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines (default: on a terminal only)")
    return p


def parser_stats() -> argparse.ArgumentParser:
    p = OneLineParser(prog="spdnn-partition stats",
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


def parser_export() -> argparse.ArgumentParser:
    p = OneLineParser(prog="spdnn-partition export",
                                description="Write the network's hypergraph in hMETIS format.")
    p.add_argument("network")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--objective", default="train", choices=["train", "infer"],
                   help="net weights: train = 1 for layer-0 nets, 2 otherwise (default); "
                        "infer = 1 for every net")
    return p


def parser_import() -> argparse.ArgumentParser:
    p = OneLineParser(prog="spdnn-partition import",
                                description="Turn a partition file (one block per line, hMETIS "
                                            "convention, vertices numbered layer after layer) "
                                            "into a plan.")
    p.add_argument("network")
    p.add_argument("partition")
    p.add_argument("-P", "--nparts", type=int, required=True)
    p.add_argument("-o", "--output", required=True)
    return p


def check_nparts(nparts: int, sizes: Sequence[int]) -> None:
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
