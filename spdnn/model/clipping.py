"""Gradient clipping by the total norm, as ``torch.nn.utils.clip_grad_norm_``: each engine
computes the norm of its gradients (the runtime: one scalar summed over the model axis), then
scales them all alike. Both engines use these pieces."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from spdnn.optim import RowGrad


def squared_norm(grads: Iterable[np.ndarray | RowGrad]) -> float:
    """The sum of every gradient entry squared (a RowGrad's entries)."""
    total = 0.0
    for g in grads:
        v = g.values if isinstance(g, RowGrad) else g
        total += float(np.dot(v, v))
    return total


def clip_coefficient(norm: float, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_``'s factor for a total norm: min(1, X / (n + 1e-6))."""
    return min(1.0, max_norm / (norm + 1e-6))


def clip_report(norms: list[float], limit: float | None) -> dict[str, Any]:
    """An epoch's report of clipping (EpochReport's fields): the mean norm before clipping
    and the steps it scaled."""
    if limit is None:
        return {}
    return {"gradient_norm": float(np.mean(norms)) if norms else None,
            "clipped_steps": sum(clip_coefficient(n, limit) < 1 for n in norms)}


def scale(grads: Iterable[np.ndarray | RowGrad], factor: float) -> None:
    """Every gradient times ``factor``, in place (as clip_grad_norm_ multiplies them)."""
    for g in grads:
        v = g.values if isinstance(g, RowGrad) else g
        np.multiply(v, factor, out=v)
