"""Training data: ``digits`` (embedded), ``npz:FILE``, ``mnist:DIR`` and ``xc:DIR``.

Samples are rows (samples x features) here, dense or (``xc``) CSR; the engines transpose
batches into the column convention. Labels are integers in [0, C), or label sets
(``MultiLabels``, extreme classification).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.formats import read_idx
from spdnn.io.npz import NpzReader
from spdnn.model.labels import MultiLabels
from spdnn.model.network import as_dtype

# Rows of an npz data set read at a time when a rank keeps only some of its columns.
ROW_BLOCK_BYTES = 16 << 20


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


def _check_xy(source: str, x: np.ndarray, y: np.ndarray, split: str, dtype: Any) -> tuple:
    if x.ndim != 2:
        raise InputError(source, f"x_{split} must be 2-D (samples x features), has shape {x.shape}")
    if len(x) == 0:
        raise InputError(source, f"x_{split} has no samples" + (" (no training samples)"
                                                               if split == "train" else ""))
    if y.ndim != 1 or len(y) != len(x):
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


def _columns(npz: NpzReader, split: str, dtype: Any,
             features: np.ndarray | None) -> tuple[np.ndarray, int]:
    """x_SPLIT, or only its ``features`` columns, read in row blocks of about ROW_BLOCK_BYTES
    (every value of every block checked as ``_check_xy`` checks them): never the whole array
    when only some columns are kept. Also the number of columns the file has."""
    key = f"x_{split}"
    shape, _ = npz.header(key)
    if features is None or len(shape) != 2:
        x = npz.get(key)
        return x, (x.shape[1] if x.ndim == 2 else 0)
    n, width = shape
    if len(features) and (int(features.max()) >= width):
        return np.zeros((n, 0)), width  # refused by check_fits: the network needs more
    out = np.empty((n, len(features)), dtype=as_dtype(dtype))
    step = max(1, ROW_BLOCK_BYTES // max(1, width * 8))
    for r0 in range(0, n, step):
        block = npz.row_block(key, r0, min(n, r0 + step))
        out[r0:r0 + len(block)] = _check_x(npz.path, block, split, dtype)[:, features]
    return out, width


def load_npz(path: str | os.PathLike, dtype: Any = "float32",
             features: np.ndarray | None = None) -> Dataset:
    """``x_train``, ``y_train`` and optionally ``x_test``, ``y_test``; with ``features``,
    only those columns of x are read into memory (spdnn.io.datasets.load_dataset)."""
    npz = NpzReader(path, "training data")
    source = npz.path
    xs, width = _columns(npz, "train", dtype, features)
    x, y = _check_xy(source, xs, npz.get("y_train"), "train", dtype)
    x_test = y_test = None
    if "x_test" in npz.keys or "y_test" in npz.keys:
        if "x_test" not in npz.keys:
            raise InputError(source, "missing key 'x_test'")
        xs, test_width = _columns(npz, "test", dtype, features)
        x_test, y_test = _check_xy(source, xs, npz.get("y_test"), "test", dtype)
        if test_width != width:
            raise InputError(source, "x_test and x_train have different feature counts")
    npz.close()
    return Dataset(name=Path(source).name, x_train=x, y_train=y, x_test=x_test, y_test=y_test,
                   features=features, total_features=None if features is None else width)


def load_mnist(directory: str | os.PathLike, dtype: Any = "float32",
               features: np.ndarray | None = None) -> Dataset:
    """MNIST from its IDX files (``train-images-idx3-ubyte[.gz]`` etc.), pixels scaled to [0, 1];
    with ``features``, only those pixels are made floating point and kept."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(d, "no such directory")

    def find(stem: str) -> Path:
        for name in (stem, stem + ".gz"):
            if (d / name).is_file():
                return d / name
        raise InputError(d / stem, "no such file (nor .gz)")

    width = [0]  # pixels an image has

    def images(stem: str) -> np.ndarray:
        f = find(stem)
        a = read_idx(f)
        if a.ndim != 3 or a.dtype != np.uint8:
            raise InputError(f, "expected a 3-D uint8 image array")
        if len(a) == 0:
            raise InputError(f, "holds no images")
        pixels = a.reshape(len(a), -1)
        width[0] = pixels.shape[1]
        if features is not None and len(features) and int(features.max()) < pixels.shape[1]:
            pixels = pixels[:, features]
        return (pixels.astype(as_dtype(dtype)) / 255).astype(as_dtype(dtype))

    def labels(stem: str, n: int) -> np.ndarray:
        f = find(stem)
        a = read_idx(f)
        if a.ndim != 1 or len(a) != n:
            raise InputError(f, f"expected {n} labels, found shape {a.shape}")
        return a.astype(np.int64)

    x = images("train-images-idx3-ubyte")
    y = labels("train-labels-idx1-ubyte", len(x))
    xt = images("t10k-images-idx3-ubyte")
    yt = labels("t10k-labels-idx1-ubyte", len(xt))
    # the rank's columns only (every one at P = 1: the array is then the rank's own copy)
    kept = features is not None and x.shape[1] == len(features)
    return Dataset(name="mnist", x_train=x, y_train=y, x_test=xt, y_test=yt,
                   features=features if kept else None,
                   total_features=width[0] if kept else None)


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
                 features: np.ndarray | None = None) -> Dataset:
    """``digits``, ``npz:FILE``, ``mnist:DIR`` or ``xc:DIR``. ``features``: the columns this
    process needs (a model part's inputs); ``npz:`` and ``mnist:`` then hold only those
    (``Dataset.features``), the others every column."""
    if spec == "digits":
        return load_digits(dtype)
    kind, _, arg = spec.partition(":")
    if kind == "npz" and arg:
        return load_npz(arg, dtype, features)
    if kind == "mnist" and arg:
        return load_mnist(arg, dtype, features)
    if kind == "xc" and arg:
        return load_xc(arg, dtype)
    raise InputError(spec, "unknown data source (use digits, npz:FILE, mnist:DIR or xc:DIR)")


def check_fits(data: Dataset, sizes: Sequence[int], source: str) -> None:
    """The data must match the network: features = layer 0, labels below the outputs."""
    if data.n_features != sizes[0]:
        raise InputError(source, f"data has {data.n_features} features but the network's "
                                 f"layer 0 has {sizes[0]} neurons")
    if data.n_classes > sizes[-1]:
        raise InputError(source, f"data has labels up to {data.n_classes - 1} "
                                 f"({data.n_classes} classes) but the network has {sizes[-1]} "
                                 "outputs")
