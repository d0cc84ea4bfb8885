"""Data in memory, as a researcher holds it: ``(x, y)`` or ``(x, y, x_test, y_test)`` with
``x`` a numpy array or scipy sparse matrix (samples x features) and ``y`` integer labels, or a
``Dataset``. Checked once here, then cut to a rank's feature columns and converted to the
job's value type, like a data file (spdnn.io.loaders)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import SpdnnError
from spdnn.io.dataset import integer_labels
from spdnn.io.loaders import Dataset
from spdnn.model.csr import as_dtype
from spdnn.model.labels import MultiLabels, is_targets

SOURCE = "data in memory"


def matrix(x: Any, name: str, dtype: Any, features: np.ndarray | None,  # noqa: ANN401
           n_in: int | None = None) -> tuple[np.ndarray | sp.csr_matrix, int]:
    """``x`` checked (against the network's ``n_in`` inputs when given), cut to ``features``
    and converted; with its number of columns."""
    if sp.issparse(x):
        x = sp.csr_matrix(x)
        values = x.data
    else:
        x = np.asarray(x)
        values = x
    if x.ndim != 2:
        raise SpdnnError(f"{SOURCE}: {name} must be 2-D (samples x features), not shape "
                         f"{x.shape}")
    if values.dtype.kind not in "biuf":
        raise SpdnnError(f"{SOURCE}: {name} must hold numbers, not {values.dtype}")
    if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        raise SpdnnError(f"{SOURCE}: {name} holds NaN or infinite values")
    n_features = x.shape[1]
    if n_in is not None and n_features != n_in:
        raise SpdnnError(f"{SOURCE}: {name} has {n_features} features but the network's layer "
                         f"0 has {n_in} neurons")
    if features is not None:
        x = x[:, features]
    if sp.issparse(x):
        return sp.csr_matrix(x, dtype=as_dtype(dtype)), n_features
    return np.ascontiguousarray(x, dtype=as_dtype(dtype)), n_features


def _labels(y: Any, name: str, n: int, dtype: Any) -> np.ndarray:  # noqa: ANN401
    """One integer label per sample, or real-valued targets (samples x outputs, for the mse
    loss) in the run's value type."""
    if isinstance(y, MultiLabels):
        raise SpdnnError(f"{SOURCE}: label sets ({name}) are read from xc:DIR files; in "
                         "memory, give one integer label per sample")
    y = np.asarray(y)
    if y.ndim == 2 and len(y) == n and y.shape[1] > 0:
        if y.dtype.kind not in "iuf":
            raise SpdnnError(f"{SOURCE}: {name} holds targets of type {y.dtype}, not numbers")
        if not np.isfinite(y).all():
            raise SpdnnError(f"{SOURCE}: {name} holds a target that is not finite")
        return np.ascontiguousarray(y, dtype=as_dtype(dtype))
    if y.ndim != 1 or len(y) != n:
        raise SpdnnError(f"{SOURCE}: {name} must hold one label per sample ({n}), or real "
                         f"targets as samples x outputs, not shape {y.shape}")
    try:
        return integer_labels(y)
    except ValueError as exc:
        raise SpdnnError(f"{SOURCE}: {name} {exc}") from None


def from_memory(data: Any, dtype: Any, *,  # noqa: ANN401
                features: np.ndarray | None = None, n_in: int | None = None) -> Dataset:
    """A Dataset from ``(x, y)``, ``(x, y, x_test, y_test)`` or a Dataset; ``features``: the
    columns this rank keeps (its model part's inputs) of the network's ``n_in``."""
    name = "arrays"
    if isinstance(data, Dataset):
        if data.features is not None:
            raise SpdnnError(f"{SOURCE}: a Dataset read with only some columns cannot be "
                             "given to a job; load it with every column")
        name, data = data.name, (data.x_train, data.y_train, data.x_test, data.y_test)
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 4):
        raise SpdnnError("data must be a source name (digits, npz:FILE, mnist:DIR, xc:DIR), a "
                         "Dataset, (x, y) or (x, y, x_test, y_test); for inputs without "
                         "labels: spdnn.predict(network, x)")
    x, y, x_test, y_test = (*data, None, None)[:4]
    x, n_features = matrix(x, "x", dtype, features, n_in)
    y = _labels(y, "y", x.shape[0], dtype)
    if (x_test is None) != (y_test is None):
        raise SpdnnError(f"{SOURCE}: x_test and y_test go together")
    if x_test is not None:
        x_test, _ = matrix(x_test, "x_test", dtype, features, n_features)
        y_test = _labels(y_test, "y_test", x_test.shape[0], dtype)
        if is_targets(y) != is_targets(y_test) or (is_targets(y) and
                                                   y.shape[1] != y_test.shape[1]):
            raise SpdnnError(f"{SOURCE}: y and y_test must both be labels, or targets of as "
                             "many outputs")
    return Dataset(name=name, x_train=x, y_train=y, x_test=x_test, y_test=y_test,
                   features=features, total_features=n_features)


def signature(data: Dataset) -> tuple:
    """What every rank's copy must agree on: shapes and label sums (cheap, not a hash)."""
    def labels(y: np.ndarray | None) -> int | None:
        if y is None:
            return None
        return float(y.sum()) if is_targets(y) else int(np.asarray(y, dtype=np.int64).sum())

    test = None if data.x_test is None else data.x_test.shape[0]
    return (data.name, data.x_train.shape[0], data.total_features, labels(data.y_train), test,
            labels(data.y_test))
