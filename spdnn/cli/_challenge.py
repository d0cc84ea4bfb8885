"""``spdnn generate challenge-images``: the Graph Challenge's inputs made from MNIST
(spdnn.io.images)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spdnn.cli._examples import EXAMPLES_BY_COMMAND
from spdnn.cli.options import positive_int
from spdnn.errors import InputError


def add_parser(kinds: argparse._SubParsersAction, formatter: type) -> None:
    from spdnn.model.choices import CHALLENGE_SIZES, CHALLENGE_THRESHOLD

    ci = kinds.add_parser(
        "challenge-images", help="Graph Challenge input images from MNIST",
        epilog=EXAMPLES_BY_COMMAND["challenge-images"], formatter_class=formatter,
        description="The Sparse DNN Graph Challenge's inputs: the MNIST training images "
                    "resized (bicubic) to SIZE x SIZE, made binary, flattened column by "
                    "column; for the networks of SIZE^2 neurons (32: 1024, 64: 4096, 128: "
                    "16384, 256: 65536). Run them with `spdnn infer --inputs FILE`.")
    ci.add_argument("--mnist", required=True, metavar="DIR",
                    help="directory with train-images-idx3-ubyte[.gz]")
    ci.add_argument("--size", type=int, choices=CHALLENGE_SIZES, default=32,
                    help="image side in pixels")
    ci.add_argument("--count", type=positive_int, default=60_000,
                    help="the first COUNT training images")
    ci.add_argument("--threshold", type=float, default=CHALLENGE_THRESHOLD,
                    help="a pixel is on above this grey level (0-1)")
    ci.add_argument("-o", "--output", required=True,
                    help="images to write: .npz (compact, fast to read; docs/formats.md), or "
                         ".mtx / .tsv (text, slow at the larger sizes)")


def cmd_generate_images(args: argparse.Namespace) -> None:
    from spdnn.io.formats import write_mtx, write_triples
    from spdnn.io.images import challenge_images, write_image_npz

    out = Path(args.output)
    if not out.parent.is_dir():
        raise InputError(out, f"output directory {out.parent} does not exist")
    if out.suffix not in (".npz", ".mtx", ".tsv"):
        raise InputError(out, "the output must end in .npz, .mtx or .tsv")
    if not 0 <= args.threshold < 1:
        raise InputError(out, f"--threshold {args.threshold} is not a grey level in [0, 1)")

    def progress(done: int, total: int) -> None:
        if done == total or done % 10_000 < 2_000:
            print(f"  resized {done:,} of {total:,} images", file=sys.stderr, flush=True)

    images = challenge_images(args.mnist, args.size, args.count, args.threshold, progress)
    if out.suffix == ".npz":
        write_image_npz(out, images)
    elif out.suffix == ".mtx":
        write_mtx(out, images, f"Graph Challenge inputs: MNIST resized to {args.size}x"
                               f"{args.size}, binary")
    else:
        write_triples(out, images)
    print(f"wrote {out}: {images.shape[0]:,} images of {images.shape[1]:,} pixels, "
          f"{images.nnz / images.shape[0]:.1f} on per image")
