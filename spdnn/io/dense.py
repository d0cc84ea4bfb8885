"""Dense weights from a file (``.npz`` with W1..WL, b1..bL, or one ``.npy``), pruned into a
sparse network."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from spdnn.errors import InputError
from spdnn.io.npz import NpzReader
from spdnn.model.csr import as_dtype
from spdnn.model.generate import _rng, dense_head, prune_dense
from spdnn.model.network import Layer, Network


def prune_file(path: str | os.PathLike, density: float, seed: int | None = 0,
               head: int | None = None, dtype: Any = "float32") -> Network:
    """Prune dense weights from ``.npz`` (keys W1..WL, optional b1..bL, n_k x n_{k-1}) or a
    single ``.npy`` matrix (one layer)."""
    p = os.fspath(path)
    weights: list[np.ndarray] = []
    biases: list[np.ndarray | None] = []
    if p.endswith(".npy"):
        try:
            w = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(p, f"cannot read .npy ({exc})") from None
        weights, biases = [w], [None]
    else:
        with NpzReader(p, "dense weights") as npz:
            k = 1
            while f"W{k}" in npz.keys:
                weights.append(npz.get(f"W{k}"))
                biases.append(npz.get(f"b{k}") if f"b{k}" in npz.keys else None)
                k += 1
        if not weights:
            raise InputError(p, "no dense weights (expected keys W1, W2, ...)")
    for k, (w, b) in enumerate(zip(weights, biases), start=1):
        if w.ndim != 2 or not np.issubdtype(w.dtype, np.number) or not np.all(np.isfinite(w)):
            raise InputError(p, f"W{k} must be a finite 2-D numeric array")
        if b is not None and b.shape != (w.shape[0],):
            raise InputError(p, f"b{k} has shape {b.shape}, expected ({w.shape[0]},)")
        if k > 1 and w.shape[1] != weights[k - 2].shape[0]:
            raise InputError(p, f"W{k} has {w.shape[1]} inputs but W{k - 1} has "
                                f"{weights[k - 2].shape[0]} outputs: shapes do not chain")
    dt = as_dtype(dtype)
    layers = [Layer(lay.weight.astype(dt), lay.bias.astype(dt))
              for lay in prune_dense(weights, biases, density)]
    if head:
        layers.append(dense_head(head, layers[-1].n_out, _rng(seed), dt))
    return Network(layers=tuple(layers), output_activation="linear",
                   extra={"generator": "prune", "density": density})
