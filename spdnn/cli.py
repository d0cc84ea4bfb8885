"""The ``spdnn`` command line: the parser and ``main`` (the commands are in commands.py).

Errors in the user's input print one line (``spdnn: error: FILE[:LINE]: problem``) and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import threads  # noqa: F401  (pins BLAS threads before numpy loads)
from .errors import SpdnnError
from .options import OneLineParser, non_negative, positive_int, report, seed

EXAMPLES = """\
examples:
  spdnn generate random --sizes 64,256,256 --fan-in 16 --head 10 -o net.npz
  spdnn train --network net.npz --data digits --epochs 30 --batch-size 32 --lr 0.05 \\
      --momentum 0.9 --save trained.npz
  spdnn infer --network trained.npz --inputs digits
  spdnn convert graphchallenge ../shared/data/graphchallenge/neuron1024 --bias -0.3 --cap 32 \\
      -o gc1024.npz
  spdnn infer --network gc1024.npz \\
      --inputs ../shared/data/graphchallenge/sparse-images-1024_subset.mtx \\
      --categories-out categories.tsv
"""


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be integers: {text}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError("need at least two positive sizes, e.g. 784,1024,1024")
    return sizes


def _cap(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "") else float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="spdnn",
        description="Sparse DNN training and inference, distributed over MPI ranks by a plan.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # convert ----------------------------------------------------------------
    conv = sub.add_parser("convert", help="convert between network formats",
                          description="Convert a network to or from the spdnn bundle.",
                          epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    conv.add_argument("source", choices=["graphchallenge", "mtx", "network"],
                      help="input format: a Graph Challenge directory, Matrix Market files "
                           "(one per layer, rows = outputs), or an spdnn bundle")
    conv.add_argument("inputs", nargs="+", help="directory or files")
    conv.add_argument("-o", "--output", required=True,
                      help="bundle .npz, or a directory with --to graphchallenge|mtx")
    conv.add_argument("--to", choices=["network", "graphchallenge", "mtx"], default="network")
    conv.add_argument("--bias", type=float, default=0.0, help="bias of every neuron (default 0)")
    conv.add_argument("--cap", type=_cap, default=None, help="ReLU cap (default none)")
    conv.add_argument("--output-activation", choices=["linear", "relu"], default=None,
                      help="default: relu for graphchallenge, linear for mtx")
    conv.add_argument("--layers", type=positive_int, help="read only the first L layers")
    conv.add_argument("--dtype", choices=["float32", "float64"], default="float32")

    # generate ---------------------------------------------------------------
    gen = sub.add_parser("generate", help="generate a sparse network",
                         description="Generate a sparse network bundle.")
    gen.add_argument("kind", choices=["radixnet", "random", "prune"])
    gen.add_argument("-o", "--output", required=True, help="network bundle to write (.npz)")
    gen.add_argument("--neurons", type=int, default=1024, help="radixnet: 1024/4096/16384/65536")
    gen.add_argument("--layers", type=positive_int, default=120, help="radixnet: depth")
    gen.add_argument("--sizes", type=_sizes, help="random: layer sizes n_0,n_1,...,n_L")
    gen.add_argument("--fan-in", type=positive_int, default=32, help="random: nonzeros per row")
    gen.add_argument("--weights", help="prune: dense weights (.npz with W1..WL, or .npy)")
    gen.add_argument("--density", type=float, default=0.05, help="prune: fraction kept")
    gen.add_argument("--head", type=positive_int, help="add a dense classifier with C outputs")
    gen.add_argument("--bias", type=float, default=-0.3, help="radixnet bias (default -0.3)")
    gen.add_argument("--cap", type=_cap, default=None,
                     help="ReLU cap (radixnet default 32, otherwise none)")
    gen.add_argument("--seed", type=seed, default=0)
    gen.add_argument("--dtype", choices=["float32", "float64"], default="float32")

    # train ------------------------------------------------------------------
    tr = sub.add_parser("train", help="train with minibatch SGD",
                        description="Minibatch SGD (torch.optim.SGD semantics).",
                        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    tr.add_argument("--network", required=True, help="network bundle (.npz)")
    tr.add_argument("--plan", help="plan from spdnn-partition (required with more ranks than "
                                   "replicas)")
    tr.add_argument("--replicas", type=positive_int, default=1, metavar="R",
                    help="replicas of the partitioned network (default 1): mpirun -n "
                         "R x the plan's parts; the ranks of one replica are consecutive")
    tr.add_argument("--data", default="digits", help="digits | npz:FILE | mnist:DIR")
    tr.add_argument("--epochs", type=positive_int, default=10)
    tr.add_argument("--batch-size", type=positive_int, default=64)
    tr.add_argument("--lr", type=non_negative, default=0.05)
    tr.add_argument("--momentum", type=non_negative, default=0.9)
    tr.add_argument("--weight-decay", type=non_negative, default=0.0)
    tr.add_argument("--loss", choices=["cross_entropy", "mse"], default="cross_entropy")
    tr.add_argument("--seed", type=seed, default=0, help="seed of the sample shuffling")
    tr.add_argument("--no-shuffle", action="store_true", help="batches in file order")
    tr.add_argument("--max-steps", type=positive_int, help="stop after this many SGD steps")
    tr.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    tr.add_argument("--save", help="write the trained network as one bundle")
    tr.add_argument("--checkpoint-dir", help="write checkpoints here (every N steps, and at the "
                                             "end)")
    tr.add_argument("--checkpoint-every", type=positive_int, help="steps between checkpoints")
    tr.add_argument("--resume", help="continue from this checkpoint directory (any P and plan)")
    tr.add_argument("--resume-with-changes", action="store_true",
                    help="resume even though --batch-size, --seed, --no-shuffle or --dtype "
                         "differ from the run that wrote the checkpoint (the result then "
                         "differs from an uninterrupted run)")
    tr.add_argument("--metrics-out", help="write per-epoch metrics as JSON")

    # infer ------------------------------------------------------------------
    inf = sub.add_parser("infer", help="run inference",
                         description="Classification accuracy on a data set, or Graph Challenge "
                                     "inference on input images (TSV or Matrix Market).",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    inf.add_argument("--network", required=True)
    inf.add_argument("--plan", help="plan from spdnn-partition (required with more ranks than "
                                    "replicas)")
    inf.add_argument("--replicas", type=positive_int, default=1, metavar="R",
                     help="replicas of the partitioned network, each taking a share of the "
                          "inputs (default 1)")
    inf.add_argument("--inputs", required=True,
                     help="digits | npz:FILE | mnist:DIR (test split), or an images .tsv/.mtx")
    inf.add_argument("--categories-out", help="Graph Challenge: write categories (1-based)")
    inf.add_argument("--truth", help="Graph Challenge: compare with an official category file")
    inf.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    inf.add_argument("--metrics-out", help="write metrics as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from .commands import COMMANDS

        return COMMANDS[args.command](args) or 0
    except SpdnnError as exc:
        report("spdnn", str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print("spdnn: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("spdnn: error: out of memory", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

