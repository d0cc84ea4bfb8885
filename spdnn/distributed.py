"""The distributed network: each rank's rows of every layer, and the distributed passes.

Rank p owns rows R_p^k of every layer (the plan). Its local W_k holds those rows with columns
renumbered into its X_{k-1} buffer: owned rows of layer k-1 first (ascending global index), then
ghost rows grouped by owner. Forward: expand ghosts while interior rows (no ghost column) are
computed. Backward: fold ghost partial sums to their owners while the owned part is computed.
The weight gradient needs no communication. Math: DESIGN.md section 2, as in spdnn.reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import kernels
from .bundle import NetworkBundle
from .comm import Communicator, Exchange, Traffic, wait
from .plan import Plan
from .reference import activate, activation_slope


@dataclass
class LocalLayer:
    index: int  # k
    rows: np.ndarray  # global ids of the owned rows of layer k, ascending
    buffer_rows: np.ndarray  # global id of each row of the X_{k-1} buffer (owned, then ghosts)
    weight: sp.csr_matrix  # owned rows x buffer rows
    bias: np.ndarray
    exchange: Exchange
    entry_rows: np.ndarray  # row of every stored entry (for the SDDMM)
    interior: np.ndarray  # local rows that use owned columns only
    boundary: np.ndarray
    _views: dict[str, tuple[sp.csr_matrix, np.ndarray]]  # derived matrices + data gather maps

    @property
    def n_owned_prev(self) -> int:
        return self.exchange.n_owned

    def view(self, name: str) -> sp.csr_matrix:
        return self._views[name][0]

    def sync_views(self) -> None:
        """Refresh the derived matrices' values after the weights changed (no allocation)."""
        for m, gather in self._views.values():
            np.take(self.weight.data, gather, out=m.data)

    def global_columns(self) -> np.ndarray:
        """Global column index of every stored entry."""
        return self.buffer_rows[self.weight.indices]


def _submatrix(w: sp.csr_matrix, rows: np.ndarray, col_lo: int, col_hi: int
               ) -> tuple[sp.csr_matrix, np.ndarray]:
    """Rows ``rows`` and columns [col_lo, col_hi) of w (renumbered from 0), with the position in
    w.data of each kept entry."""
    entry = np.arange(w.nnz)
    counts = np.diff(w.indptr)[rows]
    starts = w.indptr[rows]
    picked = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + \
        np.arange(int(counts.sum()))
    cols = w.indices[picked]
    keep = (cols >= col_lo) & (cols < col_hi)
    row_of = np.repeat(np.arange(len(rows)), counts)[keep]
    gather = entry[picked][keep]
    m = sp.csr_matrix((w.data[gather], cols[keep] - col_lo,
                       np.concatenate([[0], np.cumsum(np.bincount(row_of,
                                                                  minlength=len(rows)))])),
                      shape=(len(rows), col_hi - col_lo))
    return m, gather


class DistributedNetwork:
    """This rank's part of a network under a plan."""

    def __init__(self, comm: Communicator, plan: Plan, layers: list[LocalLayer],
                 meta: dict[str, Any], dtype: np.dtype, sizes: tuple[int, ...]) -> None:
        self.comm, self.plan, self.layers = comm, plan, layers
        self.cap = meta["cap"]
        self.output_activation = meta["output_activation"]
        self.meta = meta
        self.dtype = dtype
        self.sizes = sizes
        self.input_rows = plan.rows_of(comm.rank, 0)
        self.traffic = Traffic.zeros(len(layers))

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @staticmethod
    def load(bundle: NetworkBundle, plan: Plan, comm: Communicator,
             dtype: Any = None) -> DistributedNetwork:
        """Read this rank's rows, one layer at a time, and build the exchange schedules."""
        layers = []
        rank = comm.rank
        dt = None
        for k in range(1, bundle.n_layers + 1):
            full = bundle.layer(k, dtype)  # the only full layer in memory
            dt = full.weight.dtype
            rows = plan.rows_of(rank, k)
            mine = full.weight[rows]
            bias = full.bias[rows].copy()
            del full
            owner_prev = plan.owners[k - 1]
            owned_prev = plan.rows_of(rank, k - 1)
            used = np.unique(mine.indices)
            ghosts = used[owner_prev[used] != rank]
            ghosts = ghosts[np.lexsort((ghosts, owner_prev[ghosts]))]
            buffer_rows = np.concatenate([owned_prev, ghosts]).astype(np.int64)
            local = np.full(len(owner_prev), -1, dtype=np.int64)
            local[buffer_rows] = np.arange(len(buffer_rows))
            w = sp.csr_matrix((mine.data, local[mine.indices].astype(np.int32), mine.indptr),
                              shape=(len(rows), len(buffer_rows)))
            w.sort_indices()
            exchange = Exchange.build(comm, k, owned_prev, owner_prev, ghosts)
            n_own = len(owned_prev)
            row_max = np.full(len(rows), -1, dtype=np.int64)
            nonempty = np.diff(w.indptr) > 0
            row_max[nonempty] = w.indices[w.indptr[1:][nonempty] - 1]  # sorted: last is max
            interior = np.flatnonzero(row_max < n_own)
            boundary = np.flatnonzero(row_max >= n_own)
            all_rows = np.arange(len(rows))
            views = {
                "interior": _submatrix(w, interior, 0, n_own),
                "boundary": _submatrix(w, boundary, 0, len(buffer_rows)),
                "owned_cols": _submatrix(w, all_rows, 0, n_own),
                "ghost_cols": _submatrix(w, all_rows, n_own, len(buffer_rows)),
            }
            layers.append(LocalLayer(k, rows, buffer_rows, w, bias, exchange,
                                     kernels.row_of_entries(w), interior, boundary, views))
        meta = {"activation": bundle.meta["activation"], "cap": bundle.meta["cap"],
                "output_activation": bundle.meta["output_activation"]}
        return DistributedNetwork(comm, plan, layers, meta, np.dtype(dt), bundle.sizes)

    # ------------------------------------------------------------------ passes

    def forward_layer(self, i: int, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Layer i+1: expand ghosts of X_i while interior rows are computed. ``top`` is this
        rank's rows of X_i. Returns the X_i buffer (owned + ghost rows) and Z_{i+1}."""
        layer = self.layers[i]
        batch = top.shape[1]
        xbuf = np.empty((layer.n_owned_prev + layer.exchange.n_ghost, batch), self.dtype)
        xbuf[: layer.n_owned_prev] = top
        reqs = layer.exchange.start_expand(xbuf)
        self.traffic.count_forward(i, layer.exchange.rows_sent, batch, xbuf.itemsize)
        z = np.empty((len(layer.rows), batch), self.dtype)
        if len(layer.interior):
            z[layer.interior] = layer.view("interior") @ xbuf[: layer.n_owned_prev]
        wait(reqs)
        if len(layer.boundary):
            z[layer.boundary] = layer.view("boundary") @ xbuf
        z += layer.bias[:, None]
        return xbuf, z

    def forward(self, x0: np.ndarray, keep: bool = True
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """x0: this rank's input rows (n_owned_0 x B). Returns the X buffers of every layer and
        the owned pre-activations Z_k (only the last Z, and no buffers, if not ``keep``)."""
        buffers, zs = [], []
        top = x0
        for i in range(self.n_layers):
            xbuf, z = self.forward_layer(i, top)
            if keep:
                buffers.append(xbuf)
                zs.append(z)
            if i + 1 < self.n_layers:
                top = activate(z.copy() if keep else z, self.cap)
        return buffers, (zs if keep else [z])

    def output(self, z_last: np.ndarray) -> np.ndarray:
        if self.output_activation == "linear":
            return z_last.copy()
        return activate(z_last.copy(), self.cap)

    def predict_classes(self, out: np.ndarray) -> np.ndarray:
        """Global argmax over the distributed output rows (first index among ties)."""
        batch = out.shape[1]
        local_max = out.max(axis=0) if len(out) else np.full(batch, -np.inf, out.dtype)
        gmax = self.comm.allreduce_max(np.ascontiguousarray(local_max))
        rows = self.layers[-1].rows
        cand = np.where(out == gmax[None, :], rows[:, None], np.iinfo(np.int64).max)
        local_arg = cand.min(axis=0) if len(out) else np.full(batch, np.iinfo(np.int64).max)
        return self.comm.allreduce_min(np.ascontiguousarray(local_arg, dtype=np.int64))

    def loss_and_gradient(self, out: np.ndarray, y: np.ndarray, loss: str
                          ) -> tuple[float, np.ndarray]:
        """As reference.loss_and_gradient, with the output rows spread over the ranks: only
        per-sample vectors are all-reduced."""
        batch = out.shape[1]
        rows = self.layers[-1].rows
        local = np.full(self.sizes[-1], -1, dtype=np.int64)
        local[rows] = np.arange(len(rows))
        mine = local[y] >= 0
        cols = np.flatnonzero(mine)
        if loss == "cross_entropy":
            local_max = out.max(axis=0) if len(out) else np.full(batch, -np.inf, out.dtype)
            gmax = self.comm.allreduce_max(np.ascontiguousarray(local_max))
            shifted = out - gmax[None, :]
            expo = np.exp(shifted)
            packed = np.zeros((2, batch), dtype=out.dtype)
            packed[0] = expo.sum(axis=0)
            packed[1, cols] = shifted[local[y[cols]], cols]
            total, target = self.comm.allreduce_sum(packed)
            value = float(np.mean(np.log(total) - target))
            grad = expo / total[None, :]
            grad[local[y[cols]], cols] -= 1
            return value, grad / batch
        if loss == "mse":
            diff = out.copy()
            diff[local[y[cols]], cols] -= 1
            n = self.sizes[-1] * batch
            value = self.comm.sum_scalar(float(np.sum(diff.astype(np.float64) ** 2))) / n
            return value, diff * (2.0 / n)
        raise ValueError(f"unknown loss {loss!r}")

    def backward(self, buffers: list[np.ndarray], zs: list[np.ndarray], y: np.ndarray,
                 loss: str) -> tuple[float, int, list[np.ndarray], list[np.ndarray]]:
        """Loss, correct predictions and this rank's gradients (W data and bias per layer)."""
        out = self.output(zs[-1])
        value, grad = self.loss_and_gradient(out, y, loss)
        correct = int(np.sum(self.predict_classes(out) == y))
        delta = grad if self.output_activation == "linear" else \
            grad * activation_slope(zs[-1], self.cap)
        gw: list[np.ndarray] = [np.empty(0)] * self.n_layers
        gb: list[np.ndarray] = [np.empty(0)] * self.n_layers
        for i in range(self.n_layers - 1, -1, -1):
            layer = self.layers[i]
            gw[i] = kernels.sddmm(layer.weight, delta, buffers[i], rows=layer.entry_rows)
            gb[i] = delta.sum(axis=1)
            if i == 0:
                break
            ex = layer.exchange
            ghost_part = kernels.spmm_t(layer.view("ghost_cols"), delta)
            reqs, recv = ex.start_fold(np.ascontiguousarray(ghost_part, dtype=self.dtype))
            self.traffic.count_backward(i, ex.n_ghost, delta.shape[1], delta.itemsize)
            g = np.ascontiguousarray(kernels.spmm_t(layer.view("owned_cols"), delta),
                                     dtype=self.dtype)
            ex.finish_fold(reqs, recv, g)
            delta = g * activation_slope(zs[i - 1], self.cap)
        return value, correct, gw, gb

    def parameters(self) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for layer in self.layers:
            out += [layer.weight.data, layer.bias]
        return out

    def sync(self) -> None:
        for layer in self.layers:
            layer.sync_views()
