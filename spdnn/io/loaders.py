"""Training data: ``digits`` (embedded), ``npz:FILE``, ``mnist:DIR`` and ``xc:DIR``.

Samples are rows (samples x features) here, dense or (``xc``) CSR; the engines transpose
batches into the column convention. Labels are integers in [0, C), or label sets
(``MultiLabels``, extreme classification).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from spdnn.errors import InputError
from spdnn.io.dataset import Dataset, Share, integer_labels, keep_share
from spdnn.io.mnist import load_mnist
from spdnn.io.npz import NpzReader
from spdnn.model.batching import share_of
from spdnn.model.csr import as_dtype, cast_values
from spdnn.model.labels import is_targets

__all__ = ["Dataset", "Share", "check_fits", "keep_share", "load_dataset", "load_digits",
           "load_mnist", "load_npz", "load_xc"]

# Rows of an npz data set read at a time when a rank keeps only some of its columns.
ROW_BLOCK_BYTES = 16 << 20


def _digits_path() -> Path:
    """The digits file: package data when installed (``spdnn.data``), else the checkout's
    ``data/`` (running from a source tree with ``PYTHONPATH``)."""
    checkout = Path(__file__).resolve().parents[2] / "data" / "digits.csv.gz"
    if checkout.is_file():
        return checkout
    return Path(str(resources.files("spdnn.data").joinpath("digits.csv.gz")))


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
    try:
        labels = integer_labels(y)
    except ValueError as exc:
        raise InputError(source, f"y_{split} {exc}") from None
    return _check_x(source, x, split, dtype), labels


def _check_x(source: str, x: np.ndarray, split: str, dtype: Any) -> np.ndarray:
    """x's values: finite numbers within ``dtype``'s range; x cast to it."""
    return cast_values(x, dtype, source, f"x_{split}")


def _columns(npz: NpzReader, split: str, dtype: Any, features: np.ndarray | None,
             share: Share, skip: bool = False) -> tuple[np.ndarray, int, slice | None]:
    """x_SPLIT, or only its ``features`` columns and its ``share`` of the samples, read in
    row blocks of about ROW_BLOCK_BYTES (every value of every block checked as ``_check_xy``
    checks them): never the whole array when only part of it is kept (a compressed member is
    decompressed once, whole). Also the number of columns the file has, and the rows kept
    (None: all)."""
    key = f"x_{split}"
    shape, _ = npz.header(key)
    if skip and len(shape) == 2:  # not read: no sample of it is held
        kept = shape[1] if features is None else len(features)
        return np.zeros((0, kept), dtype=as_dtype(dtype)), shape[1], slice(0, 0)
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
             features: np.ndarray | None = None, share: Share = None, *,
             evaluate: bool = False) -> Dataset:
    """``x_train``, ``y_train`` and optionally ``x_test``, ``y_test``; with ``features``,
    only those columns of x are read into memory, with ``share`` only that share of each
    split's samples, with ``evaluate`` only the split an evaluation reads
    (spdnn.io.loaders.load_dataset)."""
    with NpzReader(path, "training data") as npz:
        source = npz.path
        xs, width, rows = _columns(npz, "train", dtype, features, share,
                                   skip=evaluate and "x_test" in npz.keys)
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
    return Dataset(name=Path(source).name, x_train=x, y_train=y, x_test=x_test, y_test=y_test,
                   features=features, total_features=None if features is None else width,
                   train_rows=rows, test_rows=test_rows)


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


def load_xc(directory: str | os.PathLike, dtype: Any = "float32", share: Share = None
            ) -> Dataset:
    """``DIR/train.txt`` and ``DIR/test.txt`` (when present) in the Extreme Classification
    Repository's format (spdnn.io.xc); with ``share``, the features of that share of each
    split's samples alone (every line still checked)."""
    from spdnn.io.xc import read_xc

    d = Path(directory)
    if not d.is_dir():
        raise InputError(d, "no such directory")
    x, y = read_xc(d / "train.txt", as_dtype(dtype), share=share)
    x_test = y_test = test_rows = None
    if (d / "test.txt").exists():
        x_test, y_test = read_xc(d / "test.txt", as_dtype(dtype), share=share)
        if x_test.shape[1] != x.shape[1] or y_test.n_labels != y.n_labels:
            raise InputError(d / "test.txt", f"header has {x_test.shape[1]} features and "
                                             f"{y_test.n_labels} labels, train.txt "
                                             f"{x.shape[1]} and {y.n_labels}")
        test_rows = None if share is None else share_of(len(y_test), *share)
    return Dataset(name=d.name or str(d), x_train=x, y_train=y, x_test=x_test, y_test=y_test,
                   train_rows=None if share is None else share_of(len(y), *share),
                   test_rows=test_rows)


def load_dataset(spec: str, dtype: Any = "float32", *,
                 features: np.ndarray | None = None, share: Share = None,
                 evaluate: bool = False) -> Dataset:
    """``digits``, ``npz:FILE``, ``mnist:DIR`` or ``xc:DIR``. ``features``: the columns this
    process needs (a model part's inputs); ``npz:`` and ``mnist:`` then hold only those
    (``Dataset.features``), the others every column. ``share``: keep only that share of each
    split's samples (a data-parallel replica's); ``npz:`` reads only those rows, ``mnist:`` and
    ``xc:`` keep only those (their files are read whole, ``xc:`` chunk by chunk), ``digits``
    (1,797 images) is cut after reading.
    ``evaluate``: only the split an evaluation reads (the test split, where there is one) is
    read by ``npz:`` and ``mnist:``; the other holds no sample (rows ``slice(0, 0)``), its
    labels read."""
    if spec == "digits":
        return keep_share(load_digits(dtype), share)
    kind, _, arg = spec.partition(":")
    if kind == "npz" and arg:
        return load_npz(arg, dtype, features, share, evaluate=evaluate)
    if kind == "mnist" and arg:
        return load_mnist(arg, dtype, features, share, evaluate=evaluate)
    if kind == "xc" and arg:
        return load_xc(arg, dtype, share)
    raise InputError(spec, "unknown data source (use digits, npz:FILE, mnist:DIR or xc:DIR)")


def check_fits(data: Dataset, sizes: Sequence[int], source: str) -> None:
    """The data must match the network: features = layer 0, labels below the outputs."""
    if data.n_features != sizes[0]:
        raise InputError(source, f"data has {data.n_features} features but the network's "
                                 f"layer 0 has {sizes[0]} neurons")
    if is_targets(data.y_train) and data.n_classes != sizes[-1]:
        raise InputError(source, f"data has {data.n_classes} targets per sample but the "
                                 f"network has {sizes[-1]} outputs")
    if data.n_classes > sizes[-1]:
        raise InputError(source, f"data has labels up to {data.n_classes - 1} "
                                 f"({data.n_classes} classes) but the network has {sizes[-1]} "
                                 "outputs")
