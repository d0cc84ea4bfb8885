"""Training data: ``digits`` (embedded), ``npz:FILE``, ``mnist:DIR`` and ``xc:DIR``.

Samples are rows (samples x features) here, dense or (``xc``) CSR; the engines transpose
batches into the column convention. Labels are integers in [0, C), or label sets
(``MultiLabels``, extreme classification).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.formats import read_idx
from spdnn.io.npz import NpzReader
from spdnn.model.batching import share_of
from spdnn.model.labels import MultiLabels
from spdnn.model.network import as_dtype

# Rows of an npz data set read at a time when a rank keeps only some of its columns.
ROW_BLOCK_BYTES = 16 << 20
# (part, parts): the contiguous share of each split's samples to keep (spdnn.model.batching.
# share_of), as a data-parallel replica keeps its own; None: every sample.
Share = tuple[int, int] | None


def _digits_path() -> Path:
    """The digits file: package data when installed (``spdnn.data``), else the checkout's
    ``data/`` (running from a source tree with ``PYTHONPATH``)."""
    checkout = Path(__file__).resolve().parents[2] / "data" / "digits.csv.gz"
    if checkout.is_file():
        return checkout
    return Path(str(resources.files("spdnn.data").joinpath("digits.csv.gz")))


@dataclass(frozen=True, kw_only=True)
class Dataset:
    name: str
    x_train: np.ndarray | sp.csr_matrix
    y_train: np.ndarray | MultiLabels
    x_test: np.ndarray | sp.csr_matrix | None = None
    y_test: np.ndarray | MultiLabels | None = None
    # The feature columns the arrays hold, when only those were read (a rank's inputs), and
    # how many the data set has; None: every column.
    features: np.ndarray | None = None
    total_features: int | None = None
    # The samples the x arrays hold of each split, when only a share was kept (a replica's);
    # the labels are always whole. None: every sample.
    train_rows: slice | None = None
    test_rows: slice | None = None

    @property
    def n_features(self) -> int:
        if self.total_features is not None:
            return self.total_features
        return int(self.x_train.shape[1])

    @property
    def multi_label(self) -> bool:
        return isinstance(self.y_train, MultiLabels)

    @property
    def n_classes(self) -> int:
        if isinstance(self.y_train, MultiLabels):
            return self.y_train.n_labels
        ys = [self.y_train] + ([self.y_test] if self.y_test is not None else [])
        return int(max(int(y.max(initial=0)) for y in ys)) + 1


def _check_xy(source: str, x: np.ndarray, y: np.ndarray, split: str, dtype: Any,
              total: int | None = None) -> tuple:
    """x checked and cast, y as int64 labels; ``total``: the samples of the split when x
    holds only a share of them (None: x holds all)."""
    if x.ndim != 2:
        raise InputError(source, f"x_{split} must be 2-D (samples x features), has shape {x.shape}")
    total = len(x) if total is None else total
    if total == 0:
        raise InputError(source, f"x_{split} has no samples" + (" (no training samples)"
                                                               if split == "train" else ""))
    if y.ndim != 1 or len(y) != total:
        raise InputError(source, f"y_{split} must hold one label per row of x_{split}")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.issubdtype(y.dtype, np.floating) or np.any(y != np.round(y)):
            raise InputError(source, f"y_{split} must hold integer labels")
    if len(y) and int(y.min()) < 0:
        raise InputError(source, f"y_{split} has a negative label")
    return _check_x(source, x, split, dtype), y.astype(np.int64)


def _check_x(source: str, x: np.ndarray, split: str, dtype: Any) -> np.ndarray:
    """x's values: finite numbers within ``dtype``'s range; x cast to it."""
    if not np.issubdtype(x.dtype, np.number) or not np.all(np.isfinite(x)):
        raise InputError(source, f"x_{split} must hold finite numbers")
    dt = as_dtype(dtype)
    with np.errstate(over="ignore"):
        cast = x.astype(dt, copy=False)
    if not np.all(np.isfinite(cast)):
        raise InputError(source, f"x_{split} has values beyond the {dt} range (use --dtype "
                                 "float64)")
    return cast


def _columns(npz: NpzReader, split: str, dtype: Any, features: np.ndarray | None,
             share: Share) -> tuple[np.ndarray, int, slice | None]:
    """x_SPLIT, or only its ``features`` columns and its ``share`` of the samples, read in
    row blocks of about ROW_BLOCK_BYTES (every value of every block checked as ``_check_xy``
    checks them): never the whole array when only part of it is kept (a compressed member is
    decompressed once, whole). Also the number of columns the file has, and the rows kept
    (None: all)."""
    key = f"x_{split}"
    shape, _ = npz.header(key)
    if (features is None and share is None) or len(shape) != 2:
        x = npz.get(key)
        return x, (x.shape[1] if x.ndim == 2 else 0), None
    n, width = shape
    rows = slice(0, n) if share is None else share_of(n, *share)
    if features is not None and len(features) and int(features.max()) >= width:
        return np.zeros((n, 0)), width, None  # refused by check_fits: the network needs more
    out = np.empty((rows.stop - rows.start, width if features is None else len(features)),
                   dtype=as_dtype(dtype))
    whole = None if npz.stored(key) else npz.get(key)
    step = max(1, ROW_BLOCK_BYTES // max(1, width * 8))
    for r0 in range(rows.start, rows.stop, step):
        r1 = min(rows.stop, r0 + step)
        block = npz.row_block(key, r0, r1) if whole is None else whole[r0:r1]
        block = _check_x(npz.path, block, split, dtype)
        out[r0 - rows.start:r1 - rows.start] = block if features is None else block[:, features]
    return out, width, None if share is None else rows


def _total(npz: NpzReader, split: str, rows: slice | None) -> int | None:
    """The samples of a split read by share (None when read whole)."""
    return None if rows is None else int(npz.header(f"x_{split}")[0][0])


def load_npz(path: str | os.PathLike, dtype: Any = "float32",
             features: np.ndarray | None = None, share: Share = None) -> Dataset:
    """``x_train``, ``y_train`` and optionally ``x_test``, ``y_test``; with ``features``,
    only those columns of x are read into memory, with ``share`` only that share of each
    split's samples (spdnn.io.datasets.load_dataset)."""
    npz = NpzReader(path, "training data")
    source = npz.path
    xs, width, rows = _columns(npz, "train", dtype, features, share)
    x, y = _check_xy(source, xs, npz.get("y_train"), "train", dtype, _total(npz, "train", rows))
    x_test = y_test = test_rows = None
    if "x_test" in npz.keys or "y_test" in npz.keys:
        if "x_test" not in npz.keys:
            raise InputError(source, "missing key 'x_test'")
        xs, test_width, test_rows = _columns(npz, "test", dtype, features, share)
        x_test, y_test = _check_xy(source, xs, npz.get("y_test"), "test", dtype,
                                   _total(npz, "test", test_rows))
        if test_width != width:
            raise InputError(source, "x_test and x_train have different feature counts")
    npz.close()
    return Dataset(name=Path(source).name, x_train=x, y_train=y, x_test=x_test, y_test=y_test,
                   features=features, total_features=None if features is None else width,
                   train_rows=rows, test_rows=test_rows)


def load_mnist(directory: str | os.PathLike, dtype: Any = "float32",
               features: np.ndarray | None = None, share: Share = None) -> Dataset:
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

    def images(stem: str) -> np.ndarray:
        f = find(stem)
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

    x = images("train-images-idx3-ubyte")
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


def load_digits(dtype: Any = "float32") -> Dataset:
    """The UCI/scikit-learn handwritten digits (1,797 8x8 images) shipped in ``data/``.

    Pixels are scaled to [0, 1]; a fixed seeded permutation puts 1,437 samples in the
    training split and 360 in the test split.
    """
    with gzip.open(_digits_path(), "rt") as fh:
        table = np.loadtxt(fh, delimiter=",")
    x = (table[:, :-1] / 16.0).astype(as_dtype(dtype))
    y = table[:, -1].astype(np.int64)
    order = np.random.default_rng(20260101).permutation(len(x))
    n_test = 360
    train, test = order[:-n_test], order[-n_test:]
    return Dataset(name="digits", x_train=x[train], y_train=y[train], x_test=x[test],
                   y_test=y[test])


def load_xc(directory: str | os.PathLike, dtype: Any = "float32") -> Dataset:
    """``DIR/train.txt`` and ``DIR/test.txt`` (when present) in the Extreme Classification
    Repository's format (spdnn.io.xc)."""
    from spdnn.io.xc import read_xc

    d = Path(directory)
    if not d.is_dir():
        raise InputError(d, "no such directory")
    x, y = read_xc(d / "train.txt", as_dtype(dtype))
    x_test = y_test = None
    if (d / "test.txt").exists():
        x_test, y_test = read_xc(d / "test.txt", as_dtype(dtype))
        if x_test.shape[1] != x.shape[1] or y_test.n_labels != y.n_labels:
            raise InputError(d / "test.txt", f"header has {x_test.shape[1]} features and "
                                             f"{y_test.n_labels} labels, train.txt "
                                             f"{x.shape[1]} and {y.n_labels}")
    return Dataset(name=d.name or str(d), x_train=x, y_train=y, x_test=x_test, y_test=y_test)


def load_dataset(spec: str, dtype: Any = "float32", *,
                 features: np.ndarray | None = None, share: Share = None) -> Dataset:
    """``digits``, ``npz:FILE``, ``mnist:DIR`` or ``xc:DIR``. ``features``: the columns this
    process needs (a model part's inputs); ``npz:`` and ``mnist:`` then hold only those
    (``Dataset.features``), the others every column. ``share``: keep only that share of each
    split's samples (a data-parallel replica's); ``npz:`` reads only those rows, the others
    read their files whole first (``digits`` is 1,797 images; ``xc:`` is sparse text)."""
    if spec == "digits":
        return keep_share(load_digits(dtype), share)
    kind, _, arg = spec.partition(":")
    if kind == "npz" and arg:
        return load_npz(arg, dtype, features, share)
    if kind == "mnist" and arg:
        return load_mnist(arg, dtype, features, share)
    if kind == "xc" and arg:
        return keep_share(load_xc(arg, dtype), share)
    raise InputError(spec, "unknown data source (use digits, npz:FILE, mnist:DIR or xc:DIR)")


def keep_share(data: Dataset, share: Share) -> Dataset:
    """``data`` with only ``share`` of each split's samples in its x arrays (labels whole)."""
    if share is None:
        return data
    train = share_of(data.x_train.shape[0], *share)
    test = None if data.x_test is None else share_of(data.x_test.shape[0], *share)
    # copies: a view would keep the whole array alive
    return replace(data, x_train=data.x_train[train].copy(),
                   x_test=None if test is None else data.x_test[test].copy(),
                   train_rows=train, test_rows=test)


def check_fits(data: Dataset, sizes: Sequence[int], source: str) -> None:
    """The data must match the network: features = layer 0, labels below the outputs."""
    if data.n_features != sizes[0]:
        raise InputError(source, f"data has {data.n_features} features but the network's "
                                 f"layer 0 has {sizes[0]} neurons")
    if data.n_classes > sizes[-1]:
        raise InputError(source, f"data has labels up to {data.n_classes - 1} "
                                 f"({data.n_classes} classes) but the network has {sizes[-1]} "
                                 "outputs")
