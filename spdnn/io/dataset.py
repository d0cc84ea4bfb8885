"""The record every data source gives (``Dataset``): x as samples x features, dense or CSR,
with labels; which columns and which samples of each split a rank holds of it; and the cut
of a data set to a replica's share of its samples."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from spdnn.model.batching import share_of
from spdnn.model.labels import MultiLabels, is_targets

# (part, parts): the contiguous share of each split's samples to keep (spdnn.model.batching.
# share_of), as a data-parallel replica keeps its own; None: every sample.
Share = tuple[int, int] | None


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
    # Held out of the training samples (``split_validation``): every sample, this rank's
    # features.
    x_validation: np.ndarray | sp.csr_matrix | None = None
    y_validation: np.ndarray | None = None

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
        if is_targets(self.y_train):  # one output per target
            return int(self.y_train.shape[1])
        ys = [self.y_train] + ([self.y_test] if self.y_test is not None else [])
        return int(max(int(y.max(initial=0)) for y in ys)) + 1


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


def split_validation(data: Dataset, fraction: float) -> Dataset:
    """``data`` with the last ``fraction`` of its training samples, in file order (before any
    shuffling), held out for validation: ceil(fraction x n) of them."""
    from spdnn.errors import OptionError

    if data.train_rows is not None:
        raise ValueError("split_validation needs every training sample")
    if isinstance(data.y_train, MultiLabels):
        raise OptionError("validation_split", "applies to single-label data (P@k is scored "
                                              "on the test split)")
    n = len(data.y_train)
    held = -(-int(round(fraction * n * 1e9)) // 10**9)  # ceil, without float noise
    if held < 1 or held >= n:
        raise OptionError("validation_split", f"{fraction:g} of {n} training samples leaves "
                                              f"{n - held} to train on and {held} to validate")
    keep = n - held
    return replace(data, x_train=data.x_train[:keep], y_train=data.y_train[:keep],
                   x_validation=data.x_train[keep:], y_validation=data.y_train[keep:])


_INT64_MAX = np.iinfo(np.int64).max


def integer_labels(y: np.ndarray) -> np.ndarray:
    """Class labels as int64, every data source alike: integers (or integral, finite floats)
    in [0, 2^63); ``ValueError`` naming the problem otherwise (never a wrapped value)."""
    if y.dtype.kind not in "iufb":
        raise ValueError(f"must hold integer labels, not {y.dtype}")
    if not len(y):
        return y.astype(np.int64)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)):
            raise ValueError("must hold integer labels, not NaN or infinity")
        if np.any(y != np.round(y)):
            raise ValueError("must hold integer labels (it holds fractions)")
        if float(y.max()) >= 2.0 ** 63:
            raise ValueError(f"holds a label beyond 2^63 ({float(y.max()):g})")
    elif y.dtype.kind == "u" and int(y.max()) > _INT64_MAX:
        raise ValueError(f"holds a label beyond 2^63 ({int(y.max())})")
    if float(y.min()) < 0:
        raise ValueError(f"holds a negative label ({y.min()})")
    return y.astype(np.int64)
