"""Preallocated arrays of the distributed passes, allocated once per batch width and reused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spdnn.kernels import bfloat16, rounding
from spdnn.model.batching import SparseColumns
from spdnn.runtime.local_layer import LocalLayer


@dataclass(frozen=True)
class Forward:
    """The result of ``DistributedNetwork.forward``: this rank's rows of Z_L for the samples
    ``ids`` (columns of the input; all of them unless dead ones were dropped). Without
    ``keep`` the arrays are reused by the next forward pass of the same width."""

    z_last: np.ndarray
    ids: np.ndarray
    workspace: Workspace | None  # kept for backward (forward with keep=True)
    sampled: bool = False  # the LSH layer ran on its selected pairs (``dnet.sampled``)


class Workspace:
    """Training arrays of one batch size, kept for the backward pass: the X buffer (owned +
    ghost rows) and Z of every layer, the gradients and the partial sums. Allocated once.

    The backward pass runs one layer at a time, and a layer's fold completes before the next
    layer down starts: the ghost partial sums of every layer share one block, and the owned
    partial sums two (layer i writes its own while it reads layer i+1's; one under bfloat16,
    whose layers read the error rounded into a block of its own). Under bfloat16, Z and the
    ghost rows' encoded arrivals (``stages``, lent to the exchange) share that block with the
    ghost partial sums.

    ``sampled``: the layer (from 0) that runs on LSH-selected pairs (spdnn.runtime.lsh_layer),
    which keeps its own compact gradient (its weight gradient here is empty) and, as the
    output layer, its own Z (empty here too)."""

    def __init__(self, layers: Sequence[LocalLayer], dtype: np.dtype, batch: int, *,
                 sampled: int | None = None, stored: np.dtype | None = None) -> None:
        dt, last = dtype, len(layers) - 1
        st = np.dtype(dt if stored is None else stored)
        self.xbufs = [np.zeros((lay.n_buffer_rows, batch), st) for lay in layers]
        # bfloat16: the error blocks rounded for the products to gather, two (a layer's
        # products read one while they write the next layer's into the other)
        size = max(len(lay.rows) for lay in layers) * batch if st != dt else 0
        self.errors = [np.zeros(size, st) for _ in range(2)]
        ghosts = [lay.exchange.n_ghost for lay in layers]
        if st == dt:
            self.zs = [np.zeros((0 if i == sampled == last else len(lay.rows), batch), dt)
                       for i, lay in enumerate(layers)]
            self.ghost = _views(ghosts, batch, dt, 1)
            self.stages: list[np.ndarray | None] = [None] * len(layers)
        else:  # bfloat16: the backward pass reads no hidden Z (the slopes come from the
            # rounded outputs: Activation.BFLOAT16), so a Z is spent once its outputs are
            # rounded, and the last's
            # once the loss's error is: every layer's Z, and after it the encoded ghost rows
            # arriving while it is computed, live in the forward pass alone, the ghost
            # partial sums in the backward pass alone; all of them on one block
            item = dt.itemsize
            starts = [-(-len(lay.rows) * batch * item // 8) * 8 for lay in layers]
            staged = [lay.exchange.stage_nbytes(batch, st.itemsize) for lay in layers]
            size = max(max(ghosts) * batch * item, *(a + b for a, b in zip(starts, staged)))
            block = np.zeros(size // item + 1, dt)
            self.zs = [block[: len(lay.rows) * batch].reshape(len(lay.rows), batch)
                       for lay in layers]
            self.ghost = [block[: g * batch].reshape(g, batch) for g in ghosts]
            raw = block.view(np.uint8)
            self.stages = [raw[a: a + b] if b else None for a, b in zip(starts, staged)]
        self.grad_w = [np.zeros(0 if i == sampled else lay.weight.nnz, dt)
                       for i, lay in enumerate(layers)]
        self.grad_b = [np.zeros(len(lay.rows), dt) for lay in layers]
        # float32/64: layer i writes its partial sums while it reads layer i+1's (the error
        # it gathers): two blocks; bfloat16 gathers the error rounded into ``errors``, so
        # one block serves every layer
        self.partial = _views([lay.n_owned_prev for lay in layers], batch, dt,
                              2 if st == dt else 1)
        # The rows of X_0 that hold a nonzero, when the forward pass skipped the others
        # (spdnn.kernels.sparse_inputs): the weight gradient skips them too.
        self.live_inputs: np.ndarray | None = None
        # dropout's factors of each hidden layer's owned rows in this step (None: none)
        self.masks: list[np.ndarray | None] = []
        self.filled: np.ndarray | None = None  # the rows of X_0 the last sparse block wrote

    def nbytes(self) -> int:
        """Bytes of the activation blocks (shared storage counted once)."""
        seen: dict[int, int] = {}
        for arrays in (self.xbufs, self.zs, self.ghost, self.partial, self.errors):
            for a in arrays:
                base = a if a.base is None else a.base
                seen[id(base)] = base.nbytes
        return sum(seen.values())


def fill_inputs(x: np.ndarray, x0: np.ndarray | SparseColumns, ws: Workspace | None
                ) -> np.ndarray | None:
    """X_0's owned rows ``x`` from the input block ``x0``; a ``SparseColumns`` block writes
    only its nonzero rows, after clearing those the last one wrote in ``ws`` (all of them the
    first time, or after a dense block, or without a workspace), and returns them: the
    first layer then skips the scan for them (a dense 100,000 x 64 block was built, copied
    and scanned each step)."""
    if not isinstance(x0, SparseColumns):
        if bfloat16.is_bfloat16(x):  # the inputs' rounding to bfloat16
            rounding.round_rows(x0, x)
        else:
            x[:] = x0
        if ws is not None:
            ws.filled = None
        return None
    if ws is None or ws.filled is None:
        x[:] = 0
    else:
        x[ws.filled] = 0
    x0.scatter(x, bfloat16.narrow(x0.samples.data) if bfloat16.is_bfloat16(x) else None)
    live = x0.live()
    if ws is not None:
        ws.filled = live
    return live


def _views(rows: Sequence[int], batch: int, dtype: np.dtype, blocks: int) -> list[np.ndarray]:
    """(rows[i] x batch) arrays over ``blocks`` shared blocks, layer i on block i % blocks."""
    storage = [np.zeros(max([r for i, r in enumerate(rows) if i % blocks == b], default=0)
                        * batch + 1, dtype) for b in range(blocks)]
    return [storage[i % blocks][: r * batch].reshape(r, batch) for i, r in enumerate(rows)]


class PingPong:
    """Inference arrays: two X buffers used layer after layer and one Z, as flat storage
    viewed at any width up to ``batch`` (dropping dead columns narrows the views)."""

    def __init__(self, layers: Sequence[LocalLayer], dtype: np.dtype, batch: int,
                 stored: np.dtype | None = None) -> None:
        rows = max(lay.n_buffer_rows for lay in layers)
        self.x = [np.zeros(rows * batch, dtype if stored is None else stored)
                  for _ in range(2)]
        self.z = np.zeros(max(len(lay.rows) for lay in layers) * batch, dtype)

    def nbytes(self) -> int:
        return self.z.nbytes + sum(x.nbytes for x in self.x)
