"""Pointwise pieces shared by both engines: the activation, its slope, the output and the losses.

h(z) = min(max(z, 0), cap) with h'(z) = 1 only for 0 < z < cap (ReLU'(0) = 0, flat above the
cap); softmax cross-entropy averaged over the batch, or MSE averaged over all outputs (PyTorch's
defaults); with label sets (extreme classification), cross-entropy against the label mass
split evenly over the sample's labels (spdnn.model.labels). Blocks are (neurons x batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spdnn.model.activations import Activation
from spdnn.model.labels import MultiLabels, is_targets

LOSSES = ("cross_entropy", "mse")


def activate(z: np.ndarray, cap: float | None) -> np.ndarray:
    """h(z) = min(max(z, 0), cap), in place."""
    np.maximum(z, 0, out=z)
    if cap is not None:
        np.minimum(z, cap, out=z)
    return z


def activation_slope(z: np.ndarray, cap: float | None) -> np.ndarray:
    """h'(z): 1 where 0 < z < cap, else 0."""
    mask = z > 0
    if cap is not None:
        mask &= z < cap
    return mask


def output(z_last: np.ndarray, h: Activation) -> np.ndarray:
    """The network's output block from the last pre-activation, through the output layer's
    activation ``h`` (a new array)."""
    return h.apply(z_last)


def one_hot(y: np.ndarray, n_classes: int, dtype: Any) -> np.ndarray:
    """Targets in the column convention: (classes x batch)."""
    t = np.zeros((n_classes, len(y)), dtype=dtype)
    t[y, np.arange(len(y))] = 1
    return t


def check_loss(loss: str) -> None:
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")


def check_targets(y: np.ndarray | MultiLabels, loss: str) -> None:
    check_loss(loss)
    if is_targets(y) and loss != "mse":
        raise ValueError("real-valued targets (samples x outputs) train with the mse loss")
    if isinstance(y, MultiLabels) and loss != "cross_entropy":
        raise ValueError("label sets (multi-label data) train with the cross_entropy loss")


def multi_label_loss(out: np.ndarray, y: MultiLabels) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample losses and the gradient of their sum (classes x batch)."""
    batch = out.shape[1]
    shifted = out - out.max(axis=0, keepdims=True)
    expo = np.exp(shifted)
    total = expo.sum(axis=0)
    rows, cols, w = y.indices, y.samples(), y.weights(out.dtype)
    target = np.bincount(cols, weights=w * shifted[rows, cols], minlength=batch)
    has = y.counts > 0
    grad = expo / total[None, :]
    grad[rows, cols] -= w
    grad[:, ~has] = 0
    return np.where(has, np.log(total) - target, 0.0), grad


def top_rows(out: np.ndarray, k: int) -> np.ndarray:
    """The rows of the k largest values of each column (k x columns), best first, the lower
    row first among equals: a stable argsort's first k, found by partition (a full sort of
    200,000 outputs per sample took most of an extreme-classification evaluation)."""
    n, batch = out.shape
    k = min(k, n)
    if k == 0 or batch == 0 or 4 * k >= n or np.isnan(out).any():
        return np.argsort(-out, axis=0, kind="stable")[:k]
    kth = np.partition(np.ascontiguousarray(out.T), n - k, axis=1)[:, n - k]
    r, c = np.nonzero(out >= kth[None, :])  # the candidates, every tie at the k-th included
    order = np.lexsort((r, -out[r, c], c))
    cs = c[order]
    pos = np.arange(len(order)) - np.searchsorted(cs, cs)  # place within its column
    best = np.empty((k, batch), dtype=np.int64)
    first = pos < k
    best[pos[first], cs[first]] = r[order[first]]
    return best


def top_k(out: np.ndarray, k: int) -> np.ndarray:
    """The k largest outputs' rows per sample (samples x k), best first, the lower row first
    among equal values."""
    return np.ascontiguousarray(top_rows(out, k).T)


def loss_and_gradient(out: np.ndarray, y: np.ndarray | MultiLabels, loss: str
                      ) -> tuple[float, np.ndarray]:
    """Loss of the output block (classes x batch) and its gradient w.r.t. that block."""
    check_targets(y, loss)
    n_out, batch = out.shape
    if isinstance(y, MultiLabels):
        per_sample, grad = multi_label_loss(out, y)
        return float(np.sum(per_sample)) / batch, grad / batch
    if loss == "cross_entropy":
        shifted = out - out.max(axis=0, keepdims=True)
        expo = np.exp(shifted)
        total = expo.sum(axis=0, keepdims=True)
        prob = expo / total
        value = float(np.mean(np.log(total[0]) - shifted[y, np.arange(batch)]))
        prob[y, np.arange(batch)] -= 1
        return value, prob / batch
    diff = out - (y.T.astype(out.dtype) if is_targets(y) else one_hot(y, n_out, out.dtype))
    return float(np.mean(diff**2)), diff * (2.0 / diff.size)
