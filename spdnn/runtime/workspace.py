"""Preallocated arrays of the distributed passes, allocated once per batch width and reused."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spdnn.runtime.local_layer import LocalLayer


class Workspace:
    """Training arrays of one batch size, kept for the backward pass: the X buffer (owned +
    ghost rows) and Z of every layer, the gradients and the partial sums. Allocated once."""

    def __init__(self, layers: Sequence[LocalLayer], dtype: np.dtype, batch: int) -> None:
        dt = dtype
        self.xbufs = [np.zeros((lay.n_buffer_rows, batch), dt) for lay in layers]
        self.zs = [np.zeros((len(lay.rows), batch), dt) for lay in layers]
        self.grad_w = [np.zeros(lay.weight.nnz, dt) for lay in layers]
        self.grad_b = [np.zeros(len(lay.rows), dt) for lay in layers]
        self.ghost = [np.zeros((lay.exchange.n_ghost, batch), dt) for lay in layers]
        self.partial = [np.zeros((lay.n_owned_prev, batch), dt) for lay in layers]


class PingPong:
    """Inference arrays: two X buffers used layer after layer and one Z, as flat storage
    viewed at any width up to ``batch`` (dropping dead columns narrows the views)."""

    def __init__(self, layers: Sequence[LocalLayer], dtype: np.dtype, batch: int) -> None:
        rows = max(lay.n_buffer_rows for lay in layers)
        self.x = [np.zeros(rows * batch, dtype) for _ in range(2)]
        self.z = np.zeros(max(len(lay.rows) for lay in layers) * batch, dtype)
