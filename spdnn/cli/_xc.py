"""``spdnn generate xc-data``: a synthetic extreme-classification task written in the
repository's format (spdnn.io.xc_synthetic, spdnn.io.xc)."""

from __future__ import annotations

import argparse
from pathlib import Path

from spdnn.cli._examples import EXAMPLES_BY_COMMAND
from spdnn.cli.options import positive_int, seed
from spdnn.errors import InputError, SpdnnError


def add_parser(kinds: argparse._SubParsersAction, formatter: type) -> None:
    xc = kinds.add_parser(
        "xc-data", help="a synthetic extreme-classification data set",
        epilog=EXAMPLES_BY_COMMAND["xc-data"], formatter_class=formatter,
        description="Training and test data in the Extreme Classification Repository's format "
                    "(DIR/train.txt, DIR/test.txt; docs/formats.md): sparse unit-norm inputs, "
                    "Zipf label frequencies, labels from a hidden teacher (each label's "
                    "signature features), samples shuffled. Train on it with --data xc:DIR.")
    xc.add_argument("-o", "--output", required=True, metavar="DIR",
                    help="directory to write train.txt and test.txt into (created)")
    xc.add_argument("--samples", type=positive_int, default=20_000, help="training samples")
    xc.add_argument("--test-samples", type=positive_int,
                    help="test samples (default: a fifth of --samples)")
    xc.add_argument("--features", type=positive_int, default=10_000, help="input features")
    xc.add_argument("--labels", type=positive_int, default=5_000, help="labels (outputs)")
    xc.add_argument("--features-per-sample", type=float, default=40.0, metavar="F",
                    help="mean nonzero features per sample")
    xc.add_argument("--labels-per-sample", type=float, default=3.0, metavar="M",
                    help="mean labels per sample (at least 1)")
    xc.add_argument("--seed", type=seed, default=0, help="random seed")


def cmd_generate_xc(args: argparse.Namespace) -> None:
    from spdnn.io.xc import write_xc
    from spdnn.io.xc_synthetic import XCTask, synthetic_xc

    out = Path(args.output)
    if not out.parent.is_dir():
        raise InputError(out, f"output directory {out.parent} does not exist")
    if out.exists() and not out.is_dir():
        raise InputError(out, "exists and is not a directory")
    tests = args.test_samples or max(1, args.samples // 5)
    task = XCTask(train_samples=args.samples, test_samples=tests,
                  features=args.features, labels=args.labels,
                  features_per_sample=args.features_per_sample,
                  labels_per_sample=args.labels_per_sample)
    try:
        x, y, xt, yt = synthetic_xc(task, args.seed)
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    out.mkdir(exist_ok=True)
    write_xc(out / "train.txt", x, y)
    write_xc(out / "test.txt", xt, yt)
    print(f"wrote {out}/train.txt and test.txt: {x.shape[0]:,} + {xt.shape[0]:,} samples, "
          f"{task.features:,} features ({x.nnz / x.shape[0]:.1f} per sample), "
          f"{task.labels:,} labels ({len(y.indices) / len(y):.2f} per sample)")
