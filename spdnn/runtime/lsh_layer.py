"""A layer with LSH-selected neurons (``--lsh``, SLIDE) on one rank's rows: the output layer,
or a hidden one (its activations zero off the active pairs, the layers above exact).

Each rank hashes the rows it owns into its own tables (spdnn.kernels.hashing). Per batch it hashes
every sample's input vector (the layer's whole input: from the X buffer when the rank's rows
read every input, else gathered from the owners), retrieves the union of the buckets hit plus,
in training, the sample's labels it owns, and computes those (neuron, sample) pairs only. The
softmax normaliser over the active outputs of all ranks is one small all-reduce per batch; the
backward pass gives the gradients of the active rows only (compact: rows in the union over the
replicas) and the partial sums of the inputs, which fold to their owners as in exact training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.kernels import products as kernels
from spdnn.kernels.dense import dense_view
from spdnn.kernels.hashing import REFRESH_ROWS, HashFunctions, Tables, passes_of
from spdnn.kernels.lsh import (
    LshSpec,
    apply_cap,
    forced,
    tail_pairs,
    top_bias_rows,
)
from spdnn.kernels.ranges import segment_ids
from spdnn.kernels.update import PARALLEL
from spdnn.model.activations import Activation
from spdnn.model.labels import MultiLabels
from spdnn.model.ops import activate
from spdnn.optim import RowGrad
from spdnn.optim import load_kernels as load_updates
from spdnn.runtime.accounting import Timers
from spdnn.runtime.gradsum import GradientSums
from spdnn.runtime.halo import Traffic
from spdnn.runtime.local_layer import LocalLayer
from spdnn.runtime.workspace import Workspace


@dataclass(frozen=True)
class PairBatch:
    ptr: np.ndarray  # active pairs: CSR over the samples
    act: np.ndarray  # local rows, ascending per sample
    mass: np.ndarray  # target mass of each pair (training)
    z: np.ndarray  # pre-activation of each pair
    xt: np.ndarray  # the layer's input buffer, (batch x buffer rows)
    tail: np.ndarray | None  # --lsh-estimate-tail in training: the random-only pairs

    @property
    def samples(self) -> np.ndarray:
        return segment_ids(self.ptr)


class SampledLayer:
    """One rank's LSH tables and sampled passes of one layer (collective over the model
    communicator ``comm``; the union of active rows also over the replicas, ``data``)."""

    def __init__(self, comm: Communicator, data: Communicator, layer: LocalLayer, n_in: int,
                 n_out: int, spec: LshSpec, seed: int, *, output: bool = True) -> None:
        passes_of("lsh").warm_up()  # numba loads on first use (spdnn.comm.threads)
        load_updates((), (layer.bias.dtype.type,), rows=True, parallel=PARALLEL)  # its rows'
        self.comm, self.data, self.layer, self.spec = comm, data, layer, spec
        self.n_in, self.n_out = n_in, n_out
        self.output = output  # the output layer (its labels join, its loss is sampled)
        self.hashes = HashFunctions.make(spec, n_in, seed)
        self.seed = seed
        self.local = np.full(n_out, -1, dtype=np.int64)
        self.local[layer.rows] = np.arange(len(layer.rows))
        self.tables: Tables | None = None
        self.codes: np.ndarray | None = None  # the last rebuild's, its storage reused
        # the rows given a gradient since the last rebuild
        self._updated = np.zeros(len(layer.rows), dtype=bool)
        self._seen = np.zeros(len(layer.rows), dtype=bool)  # backward's scratch
        self._slot = np.full(len(layer.rows), -1, dtype=np.int64)
        self.top = np.zeros(0, dtype=np.int64)  # the rows of largest bias (global ids)
        self.active_pairs = 0  # counted over the batches, for the reports
        # every rank's buffer holds the whole input (a full layer): hash from it, else gather
        whole = float(len(layer.buffer_rows) == n_in)
        self._whole_buffer = (comm.allreduce_scalar(whole, "min") if comm.size > 1 else whole) > 0
        owned = layer.buffer_rows[: layer.n_owned_prev]
        every = [owned] if comm.size == 1 or self._whole_buffer else comm.allgather(owned)
        self._owned_ids = np.concatenate(every)
        self._owned_counts = np.array([len(o) for o in every], dtype=np.int64)
        self.batch: PairBatch | None = None

    @property
    def index(self) -> int:
        """The layer's position in the network (from 0)."""
        return self.layer.index - 1

    def hidden_outputs(self, z: np.ndarray, x_next: np.ndarray) -> None:
        """A hidden layer after ``forward``: its Z (zero off the active pairs, so that the
        slope masks them) and its activations, the owned rows of the next layer's input."""
        b = self.batch
        assert b is not None
        z[:] = 0
        z[b.act, b.samples] = b.z
        np.copyto(x_next, z)
        activate(x_next, self._cap)

    def pair_errors(self, delta: np.ndarray) -> np.ndarray:
        """A hidden layer's error block (rows x samples), at its active pairs."""
        b = self.batch
        assert b is not None
        return np.ascontiguousarray(delta[b.act, b.samples])

    def attach(self, traffic: Traffic, timers: Timers, sums: GradientSums,
               cap: float | None, activations: tuple[Activation, ...]) -> None:
        """The network's counters, timers, gradient sums and activations (by layer), for the
        passes below."""
        self._traffic, self._timers, self._sums, self._cap = traffic, timers, sums, cap
        self._activations = activations

    def forward_layer(self, xbuf: np.ndarray, labels: MultiLabels | None,
                      fill: np.ndarray | None = None) -> None:
        """The layer's forward pass: the usual expand of its inputs, then ``forward``."""
        i, ex, t = self.layer.index - 1, self.layer.exchange, self._timers
        t0 = time.perf_counter()
        reqs, sent = ex.start_expand(xbuf)
        self._traffic.count("forward", i, ex.rows_sent, xbuf.shape[1], xbuf.itemsize, sent,
                            len(ex.send_peers))
        t1 = time.perf_counter()
        ex.finish_expand(reqs, xbuf)
        t2 = time.perf_counter()
        self.forward(xbuf, labels, fill)
        t.add("forward", i, compute=time.perf_counter() - t2, comm=t1 - t0, wait=t2 - t1)

    def backward_layer(self, delta: np.ndarray, ws: Workspace
                       ) -> tuple[RowGrad, RowGrad, np.ndarray]:
        """The layer's backward pass: ``backward``, the sums of its compact gradients over the
        replicas started, the partial sums folded to their owners and the slope applied;
        returns the gradients and the error block of the layer below."""
        i, ex, t = self.layer.index - 1, self.layer.exchange, self._timers
        t0 = time.perf_counter()
        g = ws.partial[i]
        gw, gb = self.backward(delta, g, ws.ghost[i])
        t1 = time.perf_counter()
        if i == 0:  # nothing below
            self._sums.start(i, gw.values, gb.values)
            t.add("backward", i, compute=t1 - t0)
            return gw, gb, g
        reqs, recv, sent = ex.start_fold(ws.ghost[i], ws.xbufs[i])
        self._traffic.count("backward", i, ex.n_ghost, g.shape[1], g.itemsize, sent,
                            len(ex.recv_peers))
        t2 = time.perf_counter()
        self._sums.start(i, gw.values, gb.values)
        t3 = time.perf_counter()
        ex.finish_fold(reqs, recv, g, ws.xbufs[i])
        t4 = time.perf_counter()
        below = self._activations[i - 1]
        if below.zeros:
            kernels.apply_slope(g, ws.zs[i - 1], self._cap)
        else:
            kernels.activation_backward(below, g, ws.zs[i - 1])
        t.add("backward", i, compute=(t1 - t0) + (t3 - t2) + (time.perf_counter() - t4),
              comm=t2 - t1, wait=t4 - t3)
        return gw, gb, g

    def rebuild(self) -> None:
        """Hash this rank's rows (their current weights) into the tables; find the rows of
        largest bias anew. Only the rows updated since the last rebuild are hashed again (the
        others' weights have not moved: a row's update is its gradient's, RowGrad), and only
        those whose code changed move in their tables: the same tables as hashing every row."""
        w = self.layer.weight
        dense = dense_view(w) is not None
        if self.tables is None or self.codes is None:
            self.codes = self.hashes.codes(w.indptr, w.indices, w.data, self.layer.buffer_rows,
                                            self.codes, dense=dense)
            self.tables = Tables.build(self.codes, self.tables)
        else:
            rows = np.flatnonzero(self._updated)
            parts = (rows[i:i + REFRESH_ROWS] for i in range(0, len(rows), REFRESH_ROWS))
            self.tables = self.tables.refresh(self.codes, (
                (part, self.hashes.codes(w.indptr, w.indices, w.data, self.layer.buffer_rows,
                                         rows=part, dense=dense)) for part in parts))
        self._updated[:] = False
        if self.spec.top_bias:
            self.top = top_bias_rows(self.layer.bias, self.layer.rows, self.spec.top_bias,
                                     self._gather_pairs)

    def _sample_codes(self, xbuf: np.ndarray, xt: np.ndarray) -> np.ndarray:
        if self._whole_buffer:
            nz = xt != 0
            indptr = np.zeros(xt.shape[0] + 1, dtype=np.int64)
            np.cumsum(nz.sum(axis=1), out=indptr[1:])
            return self.hashes.codes(indptr, np.nonzero(nz)[1], xt[nz], self.layer.buffer_rows)
        own = np.ascontiguousarray(xbuf[: self.layer.n_owned_prev])
        batch = xbuf.shape[1]
        gathered = np.empty((int(self._owned_counts.sum()), batch), dtype=xbuf.dtype)
        reqs = [self.comm.iallgatherv(own, gathered, self._owned_counts * batch)]
        self.comm.waitall(reqs, f"the gathering of layer {self.layer.index - 1} for hashing")
        full = np.zeros((self.n_in, batch), dtype=xbuf.dtype)
        full[self._owned_ids] = gathered
        return self.hashes.codes_of_columns(full)

    def _gather_pairs(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's (a, b), concatenated in rank order."""
        if self.comm.size == 1:
            return a, b
        parts = self.comm.allgather((a, b))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def forward(self, xbuf: np.ndarray, labels: MultiLabels | None,
                fill: np.ndarray | None = None) -> None:
        """The active pairs of this batch and their pre-activations (``xbuf``: the layer's input
        buffer with its ghost rows filled); ``labels`` (training) and the random ``fill``
        (samples x count global ids) join the active sets."""
        assert self.tables is not None, "rebuild() before the first forward pass"
        xt = np.ascontiguousarray(xbuf.T)
        codes = self._sample_codes(xbuf, xt)
        dtype = xbuf.dtype
        top = self.top if labels is not None else None  # in training
        lptr, lrows, lw = forced(labels, fill, dtype, xbuf.shape[1], top)
        lrows = self.local[lrows]  # -1: held by another rank
        ptr, act, mass, hits = self.tables.retrieve(codes, len(self.layer.rows), lptr, lrows,
                                                    lw)
        if self.spec.max_active:
            ptr, act, mass, hits = apply_cap(ptr, act, mass, hits, self.layer.rows[act],
                                             self.spec, self.n_out, self.seed,
                                             self._gather_pairs)
        w = self.layer.weight
        z = np.empty(len(act), dtype=dtype)
        passes_of("lsh").sampled_forward(ptr, act, w.indptr, w.indices, w.data,
                                         self.layer.bias, xt, z, dense_view(w) is not None)
        tail = tail_pairs(hits, mass, self.layer.rows[act], self.top, self.spec.tables) \
            if self.spec.estimate_tail and labels is not None else None
        self.batch = PairBatch(ptr, act, mass, z, xt, tail)
        self.active_pairs += len(act)

    def backward(self, delta: np.ndarray, partial: np.ndarray, ghost: np.ndarray
                 ) -> tuple[RowGrad, RowGrad]:
        """The gradients of the rows active anywhere in this step's batch (the union over the
        replicas, which sum them) and the inputs' partial sums: owned rows into ``partial``,
        ghost rows into ``ghost``."""
        b = self.batch
        assert b is not None
        self._seen[b.act] = True  # scratch arrays over every row, reset below: a count or a
        mine = np.flatnonzero(self._seen)  # clearing only the rows seen: a fill over the
        self._seen[mine] = False  # whole head each step cost twice as much
        union = np.unique(np.concatenate(self.data.allgather(mine))) \
            if self.data.size > 1 else mine
        self._updated[union] = True  # the optimizer moves these rows, and only these
        w = self.layer.weight
        slot = self._slot  # -1 but on this step's union
        slot[union] = np.arange(len(union))
        counts = w.indptr[union + 1] - w.indptr[union]
        entry_start = np.zeros(len(union), dtype=np.int64)
        np.cumsum(counts[:-1], out=entry_start[1:])
        gw = np.zeros(int(counts.sum()), dtype=w.dtype)
        gb = np.zeros(len(union), dtype=w.dtype)
        part_t = np.zeros((len(b.ptr) - 1, self.layer.n_buffer_rows), dtype=w.dtype)
        passes_of("lsh").sampled_backward(b.ptr, b.act, delta, w.indptr, w.indices, w.data,
                                          b.xt, slot, entry_start, gw, gb, part_t,
                                          dense_view(w) is not None)
        slot[union] = -1
        n_own = self.layer.n_owned_prev
        partial[:] = part_t[:, :n_own].T
        ghost[:] = part_t[:, n_own:].T
        return RowGrad(w.indptr[union], gw, counts), RowGrad(union, gb)

def use_lsh(dnet, spec: LshSpec, seed: int) -> None:  # noqa: ANN001 (a DistributedNetwork)
    """LSH tables on layer ``spec.layer`` of ``dnet``, in ``dnet.sampled``; build them with
    ``dnet.sampled.rebuild()``. Its gradient sums stay exact."""
    if not 1 <= spec.layer <= dnet.n_layers:
        raise ValueError(f"--lsh {spec.text()}: the network has {dnet.n_layers} layers")
    k = spec.layer
    dnet.sampled = SampledLayer(dnet.comm, dnet.grid.data, dnet.layers[k - 1], dnet.sizes[k - 1],
                                dnet.sizes[k], spec, seed, output=k == dnet.n_layers)
    dnet.sampled.attach(dnet.traffic, dnet.timers, dnet.sums, dnet.cap, dnet.activations)
