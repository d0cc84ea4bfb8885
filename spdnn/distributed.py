"""The distributed network: each rank's rows of every layer, and the distributed passes.

Rank p owns rows R_p^k of every layer (the plan). Its local W_k holds those rows with columns
renumbered into its X_{k-1} buffer: owned rows of layer k-1 first (ascending global index), then
ghost rows grouped by owner. Forward: expand ghosts while the owned-column part of every row is
computed. Backward: fold ghost partial sums to their owners while the owned part is computed.
The weight gradient needs no communication. Math: DESIGN.md section 2, as in spdnn.reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import kernels
from .bundle import NetworkBundle
from .comm import Communicator, Exchange, Traffic, progress, wait
from .plan import Plan, concat_ranges
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
    picked = concat_ranges(starts, counts)
    cols = w.indices[picked]
    keep = (cols >= col_lo) & (cols < col_hi)
    row_of = np.repeat(np.arange(len(rows)), counts)[keep]
    gather = entry[picked][keep]
    m = sp.csr_matrix((w.data[gather], cols[keep] - col_lo,
                       np.concatenate([[0], np.cumsum(np.bincount(row_of,
                                                                  minlength=len(rows)))])),
                      shape=(len(rows), col_hi - col_lo))
    return m, gather


# Row chunks of the local products that overlap a message exchange; between chunks the
# messages are progressed (MPI moves large messages only inside MPI calls).
OVERLAP_CHUNKS = 8


def _chunks(n: int, parts: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, n, max(1, min(parts, n)) + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class Timers:
    """Seconds per layer (column k-1) in compute, in packing/posting messages, and waiting
    for them; row 0 forward, row 1 backward."""

    def __init__(self, n_layers: int) -> None:
        self.compute = np.zeros((2, n_layers))
        self.comm = np.zeros((2, n_layers))
        self.wait = np.zeros((2, n_layers))

    def as_dict(self) -> dict[str, Any]:
        return {name: {"forward": getattr(self, name)[0].tolist(),
                       "backward": getattr(self, name)[1].tolist()}
                for name in ("compute", "comm", "wait")}


class Workspace:
    """Arrays of one batch size: X buffers (owned + ghost rows) and Z of every layer, the
    gradients and the backward partial sums. Allocated once, reused every step."""

    def __init__(self, dnet: DistributedNetwork, batch: int) -> None:
        dt = dnet.dtype
        self.xbufs = [np.zeros((lay.n_owned_prev + lay.exchange.n_ghost, batch), dt)
                      for lay in dnet.layers]
        self.zs = [np.zeros((len(lay.rows), batch), dt) for lay in dnet.layers]
        self.grad_w = [np.zeros(lay.weight.nnz, dt) for lay in dnet.layers]
        self.grad_b = [np.zeros(len(lay.rows), dt) for lay in dnet.layers]
        self.ghost = [np.zeros((lay.exchange.n_ghost, batch), dt) for lay in dnet.layers]
        self.partial = [np.zeros((lay.n_owned_prev, batch), dt) for lay in dnet.layers]


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
        self.timers = Timers(len(layers))
        self._workspaces: dict[int, Workspace] = {}

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
            all_rows = np.arange(len(rows))
            views = {
                "owned_cols": _submatrix(w, all_rows, 0, n_own),
                "ghost_cols": _submatrix(w, all_rows, n_own, len(buffer_rows)),
            }
            layers.append(LocalLayer(k, rows, buffer_rows, w, bias, exchange,
                                     kernels.row_of_entries(w), views))
        meta = {"activation": bundle.meta["activation"], "cap": bundle.meta["cap"],
                "output_activation": bundle.meta["output_activation"]}
        return DistributedNetwork(comm, plan, layers, meta, np.dtype(dt), bundle.sizes)

    # ------------------------------------------------------------------ passes

    def workspace(self, batch: int) -> Workspace:
        """Preallocated per-layer arrays for one batch size, reused across steps."""
        ws = self._workspaces.get(batch)
        if ws is None:
            ws = self._workspaces[batch] = Workspace(self, batch)
        return ws

    def forward_layer(self, i: int, xbuf: np.ndarray, z: np.ndarray,
                      next_top: np.ndarray | None, alive: np.ndarray | None = None) -> None:
        """Layer i+1. ``xbuf`` is the X_i buffer with its owned rows filled. While its ghost
        rows arrive, Z = W[:, owned] X_owned + b is computed in row chunks (progressing the
        messages between chunks); then Z += W[:, ghost] X_ghost, fused with h(Z) into
        ``next_top`` when given (and a 1 in ``alive`` for every nonzero column)."""
        layer = self.layers[i]
        t = self.timers
        n_own = layer.n_owned_prev
        t0 = time.perf_counter()
        reqs = layer.exchange.start_expand(xbuf)
        self.traffic.count_forward(i, layer.exchange.rows_sent, xbuf.shape[1], xbuf.itemsize)
        t1 = time.perf_counter()
        own = layer.view("owned_cols")
        for rows in _chunks(own.shape[0], OVERLAP_CHUNKS if reqs else 1):
            kernels.spmm(own, xbuf[:n_own], layer.bias, z, rows)
            progress(reqs)
        t2 = time.perf_counter()
        wait(reqs)
        t3 = time.perf_counter()
        kernels.spmm_act(layer.view("ghost_cols"), xbuf[n_own:], None, self.cap, z, next_top,
                         accumulate=True, alive=alive)
        t4 = time.perf_counter()
        t.comm[0, i] += t1 - t0
        t.compute[0, i] += (t2 - t1) + (t4 - t3)
        t.wait[0, i] += t3 - t2

    def forward(self, x0: np.ndarray) -> Workspace:
        """x0: this rank's input rows (n_owned_0 x B). Fills the workspace of this batch size
        (the X buffers of every layer and the owned pre-activations Z_k) and returns it."""
        ws = self.workspace(x0.shape[1])
        ws.xbufs[0][: self.layers[0].n_owned_prev] = x0
        for i in range(self.n_layers):
            nxt = ws.xbufs[i + 1][: len(self.layers[i].rows)] if i + 1 < self.n_layers else None
            self.forward_layer(i, ws.xbufs[i], ws.zs[i], nxt)
        return ws

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

    def backward(self, ws: Workspace, y: np.ndarray, loss: str
                 ) -> tuple[float, int, list[np.ndarray], list[np.ndarray]]:
        """Loss, correct predictions and this rank's gradients (W data and bias per layer),
        after ``forward`` filled ``ws``."""
        t = self.timers
        out = self.output(ws.zs[-1])
        value, grad = self.loss_and_gradient(out, y, loss)
        correct = int(np.sum(self.predict_classes(out) == y))
        delta = grad if self.output_activation == "linear" else \
            grad * activation_slope(ws.zs[-1], self.cap)
        for i in range(self.n_layers - 1, -1, -1):
            layer = self.layers[i]
            t0 = time.perf_counter()
            kernels.sddmm(layer.weight, delta, ws.xbufs[i], out=ws.grad_w[i],
                          rows=layer.entry_rows)
            np.sum(delta, axis=1, out=ws.grad_b[i])
            if i == 0:
                t.compute[1, i] += time.perf_counter() - t0
                break
            ex = layer.exchange
            ghost = kernels.spmm_t(layer.view("ghost_cols"), delta, ws.ghost[i])
            t1 = time.perf_counter()
            reqs, recv = ex.start_fold(ghost)
            self.traffic.count_backward(i, ex.n_ghost, delta.shape[1], delta.itemsize)
            t2 = time.perf_counter()
            own = layer.view("owned_cols")
            g = ws.partial[i]
            g[...] = 0
            for rows in _chunks(own.shape[0], OVERLAP_CHUNKS if reqs else 1):
                kernels.spmm_t(own, delta, g, rows, accumulate=True)
                progress(reqs)
            t3 = time.perf_counter()
            ex.finish_fold(reqs, recv, g)
            t4 = time.perf_counter()
            np.multiply(g, activation_slope(ws.zs[i - 1], self.cap), out=g)
            delta = g
            t5 = time.perf_counter()
            t.compute[1, i] += (t1 - t0) + (t3 - t2) + (t5 - t4)
            t.comm[1, i] += t2 - t1
            t.wait[1, i] += t4 - t3
        return value, correct, ws.grad_w, ws.grad_b

    def parameters(self) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for layer in self.layers:
            out += [layer.weight.data, layer.bias]
        return out

    def sync(self) -> None:
        for layer in self.layers:
            layer.sync_views()
