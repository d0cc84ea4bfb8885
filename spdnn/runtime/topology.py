"""Topology updates on the ranks (the rule: spdnn.model.sparsity), a step of its own beside the
optimizer's, as RigL's sparse optimizers keep the mask update apart.

In row scope every row's update depends on that row alone, so each rank updates the rows it
owns and no weight travels: it drops by |w| in its rows, grows (SET: the draws keyed by the
row; RigL: the largest |dL/dw| of the row among the columns it does not hold), and then
rebuilds only what the pattern decides, layer by layer: the local CSR with its buffer
numbering, the exchange schedule (its ghost rows and send and receive lists, agreed by request
lists as at start-up), the transpose, the workspaces and the optimizer's state of the layer.
In layer scope the ranks agree on the layer's least |w| (and RigL's largest scores) by a
search over the values' bits, one all-reduce of a count per bit, with the entries tied at the
threshold gathered; SET's draws over the whole layer are checked by each position's owner and
their verdicts all-reduced, a chunk of draws at a time.

RigL's score of a row needs the inputs it does not read: at an update each rank all-gathers
the layer's inputs X_{k-1} of the batch over its replica (n_{k-1} x B values received, one
all-gather per changing layer) and, with replicas, the errors of its rows over the replicas
(its rows x B); the scores are computed in blocks of rows, never a dense gradient of the
layer. The plan stays (unless ``--replan``: spdnn.runtime.replan); what it moves now is counted
per update (``UpdateRecord``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from spdnn.comm.mpi import Communicator
from spdnn.errors import InputError
from spdnn.io.checkpoint_format import manifest_fields, shard_layer
from spdnn.io.npz import NpzReader
from spdnn.kernels.selection import largest_per_row
from spdnn.model.counters import Dropout
from spdnn.model.network import Layer
from spdnn.model.optim import Optimizer
from spdnn.model.sparsity import (
    SparseUpdate,
    drop_counts,
    grow_draws,
    grown_values,
    layer_draws,
)
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.local_layer import LocalLayer
from spdnn.runtime.replan import Replanner, Replanning

PREDICTED = ("forward_rows", "forward_bytes", "backward_rows", "backward_bytes")
# Rows whose RigL scores are computed at once (bounds the dense block to ROWS x n_in).
SCORE_ROWS = 256


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
    replanned: bool = False  # the plan was refined after this update (--replan)
    rows_moved: int = 0  # neurons that changed owner, with their weights and state

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
        moved = (self.replanning.after(len(self.records) + 1, self.rows)
                 if self.replanning is not None else None)
        if moved is not None:
            self.rows = rows_per_step(dnet)
        self._open_segment()
        record = UpdateRecord(step, int(counts[0]), int(counts[1]), before, self.rows,
                              dnet.grid.world.allreduce_scalar(time.perf_counter() - t0, "max"),
                              moved is not None, moved or 0)
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
            drop = select_least(dnet.comm, _bits(np.abs(w.data)), keys, c)
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
            grow_rows, grow_cols = self._layer_growth(layer, keep_keys, n_in, n_out, k, number,
                                                      c, scores)
        elif scores is None:
            grow_rows, grow_cols = self._set_growth(layer.rows, counts, keep_keys, n_in, k,
                                                    number, near)
        else:
            grow_rows, grow_cols = _rigl_growth(scores[0], scores[1], counts, keep_keys, n_in,
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

    def _layer_growth(self, layer: LocalLayer, keep_keys: np.ndarray, n_in: int, n_out: int,
                      k: int, number: int, count: int,
                      scores: tuple | None) -> tuple[np.ndarray, np.ndarray]:
        """Layer scope: ``count`` connections grown anywhere the layer holds none (SET: the
        layer's draws in order; RigL: the largest |dL/dw|, ties the lower row, then column);
        returns those in this rank's rows (local row, column). Collective."""
        comm, rows = self.dnet.comm, layer.rows
        local = np.full(n_out, -1, dtype=np.int64)
        local[rows] = np.arange(len(rows))
        held = np.sort(rows[keep_keys // n_in].astype(np.int64) * n_in + keep_keys % n_in)
        if scores is not None:
            cand_bits, cand_keys = _rigl_candidates(scores[0], scores[1], keep_keys, n_in,
                                                    rows, count, scores[2] if len(scores) > 2
                                                    else None)
            chosen = cand_keys[select_least(comm, cand_bits, cand_keys, count)]
        else:
            taken = np.zeros(0, dtype=np.int64)
            found: list[np.ndarray] = []
            first, need = 0, count
            while need > 0:
                size = max(2 * need, 64)
                keys = layer_draws(self.update.seed, number, k, first, size, n_out, n_in)
                first += size
                mine = local[keys // n_in] >= 0
                free = (mine & ~_member(held, keys)).astype(np.int8)
                free = comm.allreduce(free, "max") > 0  # its row's owner knows
                _, at = np.unique(keys, return_index=True)
                once = np.zeros(len(keys), dtype=bool)
                once[at] = True  # a position's first draw in this chunk
                ok = np.flatnonzero(free & once & ~_member(taken, keys))[:need]
                found.append(keys[ok])
                taken = np.sort(np.concatenate([taken, keys[ok]]))
                need -= len(ok)
            chosen = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        chosen = chosen[local[chosen // n_in] >= 0]
        return local[chosen // n_in], chosen % n_in

    def _set_growth(self, rows: np.ndarray, counts: np.ndarray, keep_keys: np.ndarray,
                    n_in: int, k: int, number: int, near: np.ndarray | None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """SET: each row takes its draws in order (``grow_draws``), skipping a column it keeps
        or took already, until it has grown ``counts[r]``. One draw per needing row a round."""
        got = np.zeros(len(rows), dtype=np.int64)
        taken: list[np.ndarray] = []
        taken_keys = np.zeros(0, dtype=np.int64)
        attempt = 0
        need = np.flatnonzero(counts > got)
        while len(need):
            cand = grow_draws(self.update.seed, number, k, rows[need], attempt, n_in, near,
                              self.update.locality)
            keys = need * n_in + cand
            ok = ~_member(keep_keys, keys) & ~_member(taken_keys, keys)
            taken.append(keys[ok])
            taken_keys = np.sort(np.concatenate([taken_keys, keys[ok]]))
            got[need[ok]] += 1
            attempt += 1
            need = np.flatnonzero(counts > got)
        keys = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
        return keys // n_in, keys % n_in


def adopt_topology(dnet: DistributedNetwork, directory: str) -> None:
    """Rebuild my layers with the patterns a checkpoint holds (those its run's updates reached;
    any P and plan wrote it), their values left for ``load_checkpoint`` to fill."""
    with contextlib.ExitStack() as stack:
        files = manifest_fields(directory)["files"]
        readers = [stack.enter_context(NpzReader(Path(directory) / f, "checkpoint"))
                   for f in files]
        for i, layer in enumerate(dnet.layers):
            k = layer.index
            n_in = dnet.sizes[k - 1]
            shards = [shard_layer(r, k, dnet.sizes[k], n_in) for r in readers]
            rows = np.concatenate([np.repeat(a["rows"].astype(np.int64), a["counts"])
                                   for a in shards])
            cols = np.concatenate([a["cols"].astype(np.int64) for a in shards])
            local = np.full(dnet.sizes[k], -1, dtype=np.int64)
            local[layer.rows] = np.arange(len(layer.rows))
            mine = local[rows] >= 0
            keys = np.sort(local[rows[mine]] * n_in + cols[mine])
            if len(np.unique(keys)) != len(keys):
                raise InputError(directory, f"layer {k}: a connection is listed twice")
            w = layer.weight
            indptr = np.concatenate([[0], np.cumsum(np.bincount(keys // n_in,
                                                                minlength=len(layer.rows)))])
            pattern = Layer(sp.csr_matrix((np.zeros(len(keys), w.dtype),
                                           (keys % n_in).astype(w.indices.dtype),
                                           indptr.astype(w.indptr.dtype)),
                                          shape=(len(layer.rows), n_in)), layer.bias)
            rebuilt = LocalLayer.build(dnet.comm, dnet.plan, k, pattern)
            ex_old, ex_new = layer.exchange, rebuilt.exchange
            ex_new.mode, ex_new.cap, ex_new.masked = ex_old.mode, ex_old.cap, ex_old.masked
            dnet.layers[i] = rebuilt
    pool: dict = {}
    for layer in dnet.layers:
        layer.exchange.share_buffers(pool)
    dnet.topology_changed()


def _bits(values: np.ndarray) -> np.ndarray:
    """Non-negative floats as integers of the same order (float64's bit pattern)."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)


def select_least(comm: Communicator, bits: np.ndarray, keys: np.ndarray, count: int
                 ) -> np.ndarray:
    """Which of this rank's entries are among the ``count`` of least (bits, key) over every
    rank of ``comm`` (keys unique over the ranks): a search over the bit patterns, one
    all-reduce of a count per bit, then the entries tied at the threshold gathered and ordered
    by key. Collective."""
    total = int(comm.allreduce_scalar(float(len(bits))))
    if count <= 0:
        return np.zeros(len(bits), dtype=bool)
    if count >= total:
        return np.ones(len(bits), dtype=bool)
    lo, hi = 0, 2**64 - 1  # the least threshold T with count(bits <= T) >= count
    while lo < hi:
        mid = (lo + hi) // 2
        at_most = comm.allreduce_scalar(float(np.count_nonzero(bits <= np.uint64(mid))))
        lo, hi = (lo, mid) if at_most >= count else (mid + 1, hi)
    t = np.uint64(lo)
    below = bits < t
    need = count - int(comm.allreduce_scalar(float(np.count_nonzero(below))))
    tied = bits == t
    ties = np.sort(comm.allgather_rows(keys[tied].astype(np.int64)[:, None])[:, 0])
    return below | (tied & _member(ties[:need], keys))


def _rigl_candidates(delta: np.ndarray, x: np.ndarray, keep_keys: np.ndarray, n_in: int,
                     rows: np.ndarray, count: int, weight: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """This rank's best ``count`` growth candidates in layer scope, as (bits, key) of least
    first: the complement of |dL/dw|'s bits (the largest first) and row x n_in + column."""
    best_bits = np.zeros(0, dtype=np.uint64)
    best_keys = np.zeros(0, dtype=np.int64)
    keep_rows, keep_cols = keep_keys // n_in, keep_keys % n_in
    for lo in range(0, len(rows), SCORE_ROWS):
        hi = min(len(rows), lo + SCORE_ROWS)
        score = np.abs(delta[lo:hi] @ x.T).astype(np.float64)
        if weight is not None:
            score *= weight
        free = np.ones(score.shape, dtype=bool)
        inside = (keep_rows >= lo) & (keep_rows < hi)
        free[keep_rows[inside] - lo, keep_cols[inside]] = False
        r, j = np.nonzero(free)
        bits = ~_bits(score[r, j])
        keys = rows[lo + r].astype(np.int64) * n_in + j
        bits, keys = np.concatenate([best_bits, bits]), np.concatenate([best_keys, keys])
        keep = np.lexsort((keys, bits))[:count]
        best_bits, best_keys = bits[keep], keys[keep]
    return best_bits, best_keys


def _member(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def _positions(old_keys: np.ndarray, by_key: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The old entry of each key (a just-dropped connection grown again keeps it), else -1."""
    if not len(old_keys):
        return np.full(len(keys), -1, dtype=np.int64)
    ordered = old_keys[by_key]
    at = np.minimum(np.searchsorted(ordered, keys), len(ordered) - 1)
    return np.where(ordered[at] == keys, by_key[at], -1).astype(np.int64)


def _rigl_growth(delta: np.ndarray, x: np.ndarray, counts: np.ndarray, keep_keys: np.ndarray,
                 n_in: int, weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """RigL: per row, the ``counts[r]`` columns of largest |dL/dw| = |delta_r . x_j| among
    those it does not keep (ties: the lower column), in blocks of SCORE_ROWS rows."""
    rows_out, cols_out = [], []
    keep_rows, keep_cols = keep_keys // n_in, keep_keys % n_in
    for lo in range(0, len(counts), SCORE_ROWS):
        hi = min(len(counts), lo + SCORE_ROWS)
        if not counts[lo:hi].any():
            continue
        score = delta[lo:hi] @ x.T
        np.abs(score, out=score)
        if weight is not None:
            score *= weight.astype(score.dtype)
        inside = (keep_rows >= lo) & (keep_rows < hi)
        score[keep_rows[inside] - lo, keep_cols[inside]] = -np.inf
        rows, cols = largest_per_row(score, counts[lo:hi])
        rows_out.append(rows + lo)
        cols_out.append(cols)
    if not rows_out:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows_out), np.concatenate(cols_out)
