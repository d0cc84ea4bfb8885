"""``spdnn infer``'s flags."""

from __future__ import annotations

from spdnn.cli.parsers.common import command, run_options


def add_infer(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn infer``."""
    inf = command(sub, "infer", "run inference",
                   "Classification accuracy on a data set, or Graph Challenge inference on "
                   "input images (TSV or Matrix Market), on one process or on P ranks.")
    run_options(inf)
    inf.add_argument("--inputs", required=True,
                     help="digits | npz:FILE | mnist:DIR | xc:DIR (test split), or an images "
                          ".tsv/.mtx/.npz (docs/formats.md)")
    inf.add_argument("--categories-out", help="Graph Challenge: write categories (1-based)")
    inf.add_argument("--truth", help="Graph Challenge: compare with an official category file")
    inf.add_argument("--metrics-out", help="write metrics as JSON")
    inf.add_argument("--lsh", metavar="LAYER:K:L[:dwta|simhash]",
                     help="multi-label data: P@k among the output neurons that LSH tables "
                          "built from the network's weights retrieve (default: every neuron); "
                          "on a hidden layer, only its retrieved neurons are computed")
    from spdnn.model.options import RunOptions
    from spdnn.schema import add_flags

    add_flags(inf, RunOptions, only=["stream_layers"])
