"""MNIST from its IDX files (``mnist:DIR``): a rank's pixels of its share of the images,
made floating point and scaled to [0, 1]."""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from spdnn.errors import InputError
from spdnn.io.dataset import Dataset, Share
from spdnn.io.idx import read_idx
from spdnn.model.batching import share_of
from spdnn.model.csr import as_dtype


def idx_dims(path: Path) -> tuple[int, ...]:
    """An IDX file's sizes from its header, when the file's length agrees with them; an
    InputError naming the file otherwise (a damaged gzip stream too)."""
    try:
        return _idx_dims(path)
    except (OSError, ValueError, EOFError, struct.error, IndexError, zlib.error):
        raise InputError(path, "is not an IDX file of uint8 images (or its gzip stream is "
                               "damaged)") from None


def _idx_dims(path: Path) -> tuple[int, ...]:
    with open(path, "rb") as fh:
        opener = gzip.open if fh.read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as fh:
        head = fh.read(4)
        dims = struct.unpack(f">{head[3]}I", fh.read(4 * head[3]))
    size = 4 + 4 * len(dims) + math.prod(dims)  # uint8 images
    if opener is open and os.path.getsize(path) != size:
        raise ValueError("length")
    if opener is gzip.open:
        with open(path, "rb") as fh:
            fh.seek(-4, os.SEEK_END)
            if struct.unpack("<I", fh.read(4))[0] != size % 2**32:  # gzip's ISIZE
                raise ValueError("length")
    return dims


def load_mnist(directory: str | os.PathLike, dtype: Any = "float32",
               features: np.ndarray | None = None, share: Share = None, *,
               evaluate: bool = False) -> Dataset:
    """MNIST from its IDX files (``train-images-idx3-ubyte[.gz]`` etc.), pixels scaled to [0, 1];
    with ``features`` and ``share``, only those pixels of those images are made floating
    point and kept (the bytes of the file are read whole: a quarter of the floats)."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(d, "no such directory")

    def find(stem: str) -> Path:
        for name in (stem, stem + ".gz"):
            if (d / name).is_file():
                return d / name
        raise InputError(d / stem, "no such file (nor .gz)")

    width = [0]  # pixels an image has
    kept: dict[str, slice | None] = {}  # the images kept of each file (None: all)
    total: dict[str, int] = {}  # the images each file holds

    def images(stem: str, skip: bool = False) -> np.ndarray:
        f = find(stem)
        if skip:  # not read: its count from the header, no image held
            dims = idx_dims(f)
            total[stem], kept[stem] = dims[0], slice(0, 0)
            kept_width = math.prod(dims[1:]) if features is None else len(features)
            return np.zeros((0, kept_width), dtype=as_dtype(dtype))
        a = read_idx(f)
        if a.ndim != 3 or a.dtype != np.uint8:
            raise InputError(f, "expected a 3-D uint8 image array")
        if len(a) == 0:
            raise InputError(f, "holds no images")
        pixels = a.reshape(len(a), -1)
        width[0] = pixels.shape[1]
        total[stem] = len(pixels)
        kept[stem] = None if share is None else share_of(len(pixels), *share)
        if share is not None:
            pixels = pixels[kept[stem]]
        if features is not None and len(features) and int(features.max()) < pixels.shape[1]:
            pixels = pixels[:, features]
        # C order whatever the selection left (a copy in local_inputs otherwise); the same
        # values as (pixels.astype(dtype) / 255)
        x = pixels.astype(as_dtype(dtype), order="C")
        x /= 255
        return x

    def labels(stem: str, images_stem: str) -> np.ndarray:
        f = find(stem)
        a = read_idx(f)
        n = total[images_stem]
        if a.ndim != 1 or len(a) != n:
            raise InputError(f, f"expected {n} labels, found shape {a.shape}")
        return a.astype(np.int64)

    x = images("train-images-idx3-ubyte", skip=evaluate)  # the test split is evaluated
    y = labels("train-labels-idx1-ubyte", "train-images-idx3-ubyte")
    xt = images("t10k-images-idx3-ubyte")
    yt = labels("t10k-labels-idx1-ubyte", "t10k-images-idx3-ubyte")
    # the rank's columns only (every one at P = 1: the array is then the rank's own copy)
    cut = features is not None and x.shape[1] == len(features)
    return Dataset(name="mnist", x_train=x, y_train=y, x_test=xt, y_test=yt,
                   features=features if cut else None,
                   total_features=width[0] if cut else None,
                   train_rows=kept["train-images-idx3-ubyte"],
                   test_rows=kept["t10k-images-idx3-ubyte"])
