"""Topology updates on the ranks (the rule: spdnn.model.sparsity), a step of its own beside the
optimizer's, as RigL's sparse optimizers keep the mask update apart.

In row scope every row's update depends on that row alone, so each rank updates the rows it
owns and no weight travels: it drops by |w| in its rows, grows (SET: the draws keyed by the
row; RigL: the largest |dL/dw| of the row among the columns it does not hold), and then
rebuilds only what the pattern decides, layer by layer: the local CSR with its buffer
numbering, the exchange schedule (its ghost rows and send and receive lists, agreed by request
lists as at start-up), the transpose, the workspaces and the optimizer's state of the layer.
In layer scope the ranks agree on the layer's least |w| (and RigL's largest scores) by a
search over the values' bits (``bit_search``); where connections grow is ``growth``'s. A
checkpoint's topology is adopted at resume by ``checkpoint.adopt_topology``.

RigL's score of a row needs the inputs it does not read: at an update each rank all-gathers
the layer's inputs X_{k-1} of the batch over its replica (n_{k-1} x B values received, one
all-gather per changing layer) and, with replicas, the errors of its rows over the replicas
(its rows x B); the scores are computed in blocks of rows, never a dense gradient of the
layer. The plan stays (unless ``--replan``: spdnn.runtime.replan); what it moves now is counted
per update (``UpdateRecord``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.model.counters import Dropout
from spdnn.model.network import Layer
from spdnn.model.sparsity import (
    SparseUpdate,
    drop_counts,
    grown_values,
)
from spdnn.optim import Optimizer
from spdnn.runtime.bit_search import float_bits, select_least
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.growth import layer_growth, rigl_growth, set_growth
from spdnn.runtime.local_layer import LocalLayer
from spdnn.runtime.replan import Replanner, Replanning

PREDICTED = ("forward_rows", "forward_bytes", "backward_rows", "backward_bytes")


@dataclass(frozen=True)
class UpdateRecord:
    """One update, over every rank: the step it followed, connections dropped and grown,
    the rows the plan in force moved per step before it and moves after it (forward and
    backward), its seconds."""

    step: int
    dropped: int
    grown: int
    rows_before: int
    rows_per_step: int
    seconds: float
    replanned: bool = False  # the plan was refined after this update (--replan): checked
    rows_moved: int = 0  # neurons that changed owner, with their weights and state
    replan_seconds: float = 0.0  # of ``seconds``: the refinement and the move (--replan)

    def as_dict(self) -> dict:
        return asdict(self)


def rows_per_step(dnet: DistributedNetwork) -> int:
    """Rows one step moves under the plan in force: every layer's expand and fold, over the
    ranks of the replica (collective)."""
    mine = sum(layer.exchange.rows_sent + (layer.exchange.n_ghost if i > 0 else 0)
               for i, layer in enumerate(dnet.layers))
    return int(dnet.comm.allreduce_scalar(float(mine)))


class TopologyUpdates:
    """The updates of one job over ``dnet`` and its optimizer ``opt``."""

    def __init__(self, dnet: DistributedNetwork, opt: Optimizer, update: SparseUpdate,
                 replanner: Replanner | None = None, batch: int = 0) -> None:
        self.dnet, self.opt, self.update = dnet, opt, update
        self.replanning = (Replanning(dnet, opt, update, replanner, batch)
                           if replanner is not None else None)
        comm = dnet.comm
        self.changing = [bool(comm.allreduce_scalar(float(layer.weight.nnz))
                              < dnet.sizes[layer.index] * dnet.sizes[layer.index - 1])
                         for layer in dnet.layers]
        self.records: list[UpdateRecord] = []
        self.rows = rows_per_step(dnet)  # under the plan in force, for the current topology
        # the traffic the schedules in force predict, topology by topology (``predicted``)
        self._predicted = {name: np.zeros(dnet.n_layers, dtype=np.int64) for name in PREDICTED}
        self._open_segment()
        dnet.updates = self

    def _open_segment(self) -> None:
        forward = self.dnet.comm.allreduce(np.array(
            [layer.exchange.n_ghost for layer in self.dnet.layers], dtype=np.int64))
        backward = forward.copy()
        backward[:1] = 0  # no fold into the inputs
        self._volume = forward, backward
        self._since = self._passes()

    def _passes(self) -> dict[str, np.ndarray]:
        t = self.dnet.traffic
        return {n: getattr(t, n).copy() for n in ("forward_passes", "forward_samples",
                                                  "backward_passes", "backward_samples")}

    def _close_segment(self) -> None:
        now, before = self._passes(), self._since
        forward, backward = self._volume
        size = self.dnet.dtype.itemsize
        for d, vol in (("forward", forward), ("backward", backward)):
            self._predicted[f"{d}_rows"] += vol * (now[f"{d}_passes"] - before[f"{d}_passes"])
            self._predicted[f"{d}_bytes"] += vol * size * (now[f"{d}_samples"]
                                                           - before[f"{d}_samples"])
        self._since = now

    def predicted(self) -> dict[str, np.ndarray]:
        """Rows and bytes every pass so far moved by the schedules then in force, over the
        ranks and the replicas (``spdnn.runtime.accounting``'s prediction, for a topology
        that changed). Collective."""
        self._close_segment()
        data = self.dnet.grid.data
        return {n: data.allreduce(v) if data.size > 1 else v.copy()
                for n, v in self._predicted.items()}

    def apply(self, step: int, block: np.ndarray, labels: np.ndarray, batch: int, loss: str,
              dropout: tuple[Dropout, int, np.ndarray] | None) -> UpdateRecord:
        """The update after optimizer step ``step`` (collective): RigL scores on this
        replica's ``block`` of the step's batch (``batch`` samples over every replica) with
        its ``labels`` and dropout masks."""
        t0 = time.perf_counter()
        dnet, upd = self.dnet, self.update
        fraction, number = upd.fraction(step), upd.index(step)
        deltas: dict[int, np.ndarray] = {}
        inputs: dict[int, np.ndarray] = {}
        if upd.mode == "rigl":
            fwd = dnet.forward(block, dropout=dropout)
            dnet.backward(fwd, labels, loss, batch, deltas=deltas)
            for i in range(dnet.n_layers):
                if self.changing[i]:
                    inputs[i] = self._whole_inputs(i, fwd.workspace.xbufs[i])
                    deltas[i] = self._whole_batch(deltas[i])
        self._close_segment()  # the passes so far ran on the topology before this update
        dropped = grown = 0
        for i in range(dnet.n_layers):
            if not self.changing[i]:
                continue
            scores = (deltas[i], inputs[i]) if upd.mode == "rigl" else None
            d, g = self._update_layer(i, fraction, number, scores)
            dropped, grown = dropped + d, grown + g
        pool: dict = {}
        for layer in dnet.layers:
            layer.exchange.share_buffers(pool)
        dnet.topology_changed()
        counts = dnet.comm.allreduce(np.array([dropped, grown], dtype=np.int64))
        before, self.rows = self.rows, rows_per_step(dnet)
        t_replan = time.perf_counter()
        moved = (self.replanning.after(len(self.records) + 1, self.rows)
                 if self.replanning is not None else None)
        if moved:
            self.rows = rows_per_step(dnet)
        t_replan = time.perf_counter() - t_replan
        self._open_segment()
        world = dnet.grid.world
        record = UpdateRecord(step, int(counts[0]), int(counts[1]), before, self.rows,
                              world.allreduce_scalar(time.perf_counter() - t0, "max"),
                              moved is not None, moved or 0,
                              world.allreduce_scalar(t_replan, "max")
                              if self.replanning is not None else 0.0)
        self.records.append(record)
        return record

    def _whole_inputs(self, i: int, xbuf: np.ndarray) -> np.ndarray:
        """X_{k-1} of layer i, every row (global order) over this replica's samples and then
        every replica's, in the batch's order."""
        dnet, layer = self.dnet, self.dnet.layers[i]
        n_own = layer.n_owned_prev
        rows = dnet.comm.allgather_rows(layer.buffer_rows[:n_own, None])[:, 0]
        x = dnet.comm.allgather_rows(xbuf[:n_own])
        whole = np.empty_like(x)
        whole[rows] = x
        return self._whole_batch(whole)

    def _whole_batch(self, block: np.ndarray) -> np.ndarray:
        """``block`` (rows x this replica's samples) over every replica's samples."""
        data = self.dnet.grid.data
        if data.size == 1:
            return block
        return np.ascontiguousarray(data.allgather_rows(np.ascontiguousarray(block.T)).T)

    def _update_layer(self, i: int, fraction: float, number: int,
                      scores: tuple[np.ndarray, np.ndarray] | None) -> tuple[int, int]:
        """Drop and grow in this rank's rows of local layer i; rebuild the layer. Returns the
        connections dropped and grown here."""
        dnet, upd = self.dnet, self.update
        layer = dnet.layers[i]
        k = layer.index
        n_in, n_out = dnet.sizes[k - 1], dnet.sizes[k]
        w = layer.weight
        n_rows = len(layer.rows)
        entries = np.diff(w.indptr).astype(np.int64)
        row_of = np.repeat(np.arange(n_rows, dtype=np.int64), entries)
        cols = layer.global_columns().astype(np.int64)
        if upd.scope == "layer":  # the layer's smallest by (|w|, row, column), over the ranks
            keys = layer.rows[row_of].astype(np.int64) * n_in + cols
            c = int(drop_counts(np.array([self._layer_nnz(i)]), fraction)[0])
            drop = select_least(dnet.comm, float_bits(np.abs(w.data)), keys, c)
        else:
            counts = drop_counts(entries, fraction)
            # per row, by |w| then column: the first counts[r] go
            order = np.lexsort((cols, np.abs(w.data), row_of))
            place = np.arange(len(order)) - w.indptr[:-1].astype(np.int64)[row_of[order]]
            drop = np.zeros(len(cols), dtype=bool)
            drop[order] = place < counts[row_of[order]]
        keep_keys = np.sort(row_of[~drop] * n_in + cols[~drop])
        # the columns this rank holds (owns or receives) before the update: growth near them
        # is favoured by --grow-locality
        near = np.sort(layer.buffer_rows) if upd.locality != 1 else None
        weight = None
        if near is not None and scores is not None:
            weight = np.ones(n_in, dtype=np.float64)
            weight[near] = upd.locality
            scores = (scores[0], scores[1], weight)
        if upd.scope == "layer":
            grow_rows, grow_cols = layer_growth(dnet.comm, upd, layer, keep_keys, n_in, n_out,
                                                k, number, c, scores)
        elif scores is None:
            grow_rows, grow_cols = set_growth(upd, layer.rows, counts, keep_keys, n_in, k,
                                              number, near)
        else:
            grow_rows, grow_cols = rigl_growth(scores[0], scores[1], counts, keep_keys, n_in,
                                               weight)
        old_keys = row_of * n_in + cols
        by_key = np.argsort(old_keys)
        new_keys = np.concatenate([keep_keys, grow_rows * n_in + grow_cols])
        source = np.concatenate([np.flatnonzero(~drop)[np.argsort(old_keys[~drop])],
                                 _positions(old_keys, by_key, grow_rows * n_in + grow_cols)])
        sort = np.argsort(new_keys)
        new_keys, source = new_keys[sort], source[sort]
        new_rows, new_cols = new_keys // n_in, new_keys % n_in
        fresh = source < 0
        values = np.empty(len(new_keys), dtype=w.dtype)
        values[~fresh] = w.data[source[~fresh]]
        values[fresh] = grown_values(upd.seed, number, k, layer.rows[new_rows[fresh]],
                                     new_cols[fresh], n_in, n_out, upd.mode, w.dtype)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(new_rows, minlength=n_rows))])
        mine = Layer(sp.csr_matrix((values, new_cols.astype(w.indices.dtype),
                                    indptr.astype(w.indptr.dtype)), shape=(n_rows, n_in)),
                     layer.bias)
        rebuilt = LocalLayer.build(dnet.comm, dnet.plan, k, mine)
        # the build orders each row's entries by buffer position: follow them
        position = np.searchsorted(new_keys, np.repeat(
            np.arange(n_rows, dtype=np.int64), np.diff(rebuilt.weight.indptr)) * n_in
            + rebuilt.global_columns().astype(np.int64))
        ex_old, ex_new = layer.exchange, rebuilt.exchange
        ex_new.mode, ex_new.cap, ex_new.masked = ex_old.mode, ex_old.cap, ex_old.masked
        dnet.layers[i] = rebuilt
        self.opt.resize(2 * i, rebuilt.weight.data, source[position])
        self.opt.resize(2 * i + 1, rebuilt.bias, np.arange(len(rebuilt.bias)))
        return int(len(cols) - (~fresh).sum()), int(fresh.sum())

    def _layer_nnz(self, i: int) -> int:
        return int(self.dnet.comm.allreduce_scalar(float(self.dnet.layers[i].weight.nnz)))


def _positions(old_keys: np.ndarray, by_key: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The old entry of each key (a just-dropped connection grown again keeps it), else -1."""
    if not len(old_keys):
        return np.full(len(keys), -1, dtype=np.int64)
    ordered = old_keys[by_key]
    at = np.minimum(np.searchsorted(ordered, keys), len(ordered) - 1)
    return np.where(ordered[at] == keys, by_key[at], -1).astype(np.int64)
