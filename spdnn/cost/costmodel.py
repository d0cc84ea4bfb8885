"""Predicted time of a training step and of an inference batch on a grid of model parts x
replicas, from a ``Workload`` (what each rank computes and sends) and a machine (calibration,
optionally a cluster description: ``spdnn.cost.cluster.Machine``). No MPI: a replay of the
runtime's schedule, one clock per rank of a replica, layer by layer:

- forward: post the expand (per message a software cost, and the packing of the rows), compute
  the owned-column product while the messages travel (latency + bytes / bandwidth, one
  sender's messages one after another, a receiver's bytes through its own link), wait for the
  last one, compute the ghost-column product fused with the activation. Between ranks of one
  node a CPU copies the bytes (shared memory, inside the MPI calls made between chunks of
  work): the receiver's work grows by the message's ping-pong time instead of overlapping it
  (charging both ends, as before 2026-11-24, over-predicted every 2 x 1 case by 20-35%);
- loss: the small all-reduces over the parts (every clock meets there);
- backward: the ghost rows' products, post the fold, the owned rows' products, start this
  layer's gradient sums over the replicas (its weights' and its biases'), wait for the
  partial sums and add them;
- the gradient sums run one after another (Rabenseifner's reduce-scatter + allgather or
  recursive doubling, the faster: what MPICH and Open MPI pick by size; across nodes
  node-aware, ``Machine.gradient_sum_stages``; without a cluster, the measured all-reduce
  curve), but MPI moves a non-blocking collective only inside MPI calls: they advance while
  a rank runs a layer that folds (its owned rows in chunks, MPI called between them, and the
  wait for the partial sums); what is left when the backward pass ends runs then, before the
  SGD update and the refresh of the derived matrices. (Measured: a 135 KB sum beside 300 us
  of work finished in the background with 8 MPI calls, not at all with 0-2; before
  2026-11-25 (afternoon) the model overlapped them with the whole backward pass, and one rank
  x 2 replicas of the MLP at batch 32 spent 4x the predicted time in them.)

Kernel times come from the calibration's tables, looked up by batch, X-buffer rows and reuse
(nonzeros per row read: the owned and the ghost products each their own; a dense block, which
the runtime hands to BLAS, from its dense table by size and batch), blended between the
cold-cache and the warm-cache table by how far the rank's working set for a step exceeds its
share of the last-level cache (``warm_share``), then scaled by the calibration's reference
steps at the replica's batch size.

Ranks are placed as the runtime numbers them (rank = replica x parts + part, consecutive ranks
on one node); every replica does the same work, so one replica is replayed. Bytes are those of
``--exchange dense`` (the encoded modes send at most these plus a header).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spdnn.cost.cluster import Machine, allreduce_latency, allreduce_seconds
from spdnn.cost.workload import Workload
from spdnn.model.plan import Plan

LOSS_COLLECTIVES = 4  # two global maxima, the packed softmax sums, the argmin of predictions


@dataclass(kw_only=True)
class Prediction:
    """Seconds of one step (training) or batch (inference) on ``parts`` x ``replicas``."""

    method: str
    parts: int
    replicas: int
    batch: int
    seconds: float
    compute: float  # on the rank that finishes last: its kernels and fixed costs
    exchange: float  # its posting of and waiting for messages
    gradient: float  # its starting of and waiting for the gradient sums
    layers: list[dict[str, float]] = field(default_factory=list)
    compute_kernels: float = 0.0  # the part of ``compute`` the kernel tables predict

    @property
    def ranks(self) -> int:
        return self.parts * self.replicas

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "parts": self.parts, "replicas": self.replicas,
                "ranks": self.ranks, "batch": self.batch, "seconds": self.seconds,
                "compute": self.compute, "exchange": self.exchange, "gradient": self.gradient,
                "layers": self.layers}


def predict(work: Workload, machine: Machine, batch: int, replicas: int = 1,
            dtype: str = "float32", training: bool = True) -> Prediction:
    """Replay one training step (or inference batch) of ``batch`` samples."""
    if work.parts * replicas > 1:
        machine.check()
    cal = machine.calibration
    table, rt = cal.table(dtype), cal.runtime
    item = np.dtype(dtype).itemsize
    n = work.parts
    b = -(-batch // replicas)  # the largest replica slice
    rpn = machine.ranks_per_node
    active = min(rpn, n * replicas)
    node = np.arange(n) // rpn
    # The LLC is shared by the ranks running on the node; beyond the calibrated count, each is
    # assumed to keep the share it had in calibration (a cluster node has its own cache).
    warm = warm_share(work, b, item, rt["cache_bytes"] / max(1, min(active, cal.ranks)))
    scale = machine.compute_scale(active, warm, b)  # per rank
    ew = scale * rt["elementwise_ns_per_value"] * 1e-9
    clock = np.zeros(n)
    compute = np.zeros(n)
    kernel_time = np.zeros(n)  # the part of ``compute`` that the kernel tables predict

    def kern(name: str, layer: int, nnz: np.ndarray, buf: np.ndarray, read: np.ndarray,
             extra: np.ndarray | float = 0.0, dense: np.ndarray | None = None) -> np.ndarray:
        """``nnz`` nonzeros of ``layer`` reading ``read`` of the ``buf`` buffer rows; where
        ``dense`` (per rank), a dense block, which the runtime hands to BLAS."""
        reuse = nnz / np.maximum(read, 1)
        structured = 1.0
        if cal.structure is not None and work.locality is not None:
            gap = work.locality[layer, 1 if name == "backward" else 0]
            structured = cal.structure.factor(name, b, float(gap))
        sparse = structured * ((1 - warm) * table.seconds(name, nnz, b, buf, reuse)
                               + warm * table.seconds(f"{name}_warm", nnz, b, buf, reuse))
        if table.dense is not None and dense is not None and dense.any():
            sparse = np.where(dense, table.dense.seconds(name, nnz, b), sparse)
        t = scale * sparse + extra
        kernel_time[:] += t
        return t
    exch = np.zeros(n)
    layers = [{"forward": 0.0, "backward": 0.0} for _ in work.layers]

    def exchange(lw, forward: bool, t_post: np.ndarray) -> np.ndarray:
        """Arrival of each rank's last incoming message (or -inf), messages departing at
        ``t_post`` of their sender."""
        src, dst = (lw.src, lw.dst) if forward else (lw.dst, lw.src)
        ready = np.full(n, -np.inf)
        if len(src) == 0:
            return ready
        nbytes = lw.count * b * item
        lat, tt = machine.link(nbytes, node[src] == node[dst], active)
        order = np.lexsort((dst, src))
        s, d, la, tt = src[order], dst[order], lat[order], tt[order]
        # A sender's messages leave one after another through its link.
        cum = np.cumsum(tt)
        first = np.searchsorted(s, s, side="left")
        before = np.where(first > 0, cum[first - 1], 0.0)
        arrive = t_post[s] + la + (cum - before)
        np.maximum.at(ready, d, arrive)
        # ...and a receiver's bytes come in through its own.
        recv_time = np.bincount(d, weights=tt, minlength=n)
        start = np.full(n, np.inf)
        np.minimum.at(start, d, t_post[s] + la)
        has = np.isfinite(start)
        ready[has] = np.maximum(ready[has], start[has] + recv_time[has])
        return ready

    def messages(lw, forward: bool) -> np.ndarray:
        """Each rank's CPU time for its messages of one exchange: the software cost per
        message and, within a node, the copy of what it receives: shared memory moves bytes
        with a CPU, inside the MPI calls the runtime makes between its chunks of work, so the
        copy adds to the work instead of overlapping it."""
        src, dst = (lw.src, lw.dst) if forward else (lw.dst, lw.src)
        total = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
        cpu = total * rt["message_s"] + (total > 0) * rt["exchange_layer_s"]
        local = node[src] == node[dst]
        if local.any():
            _, copy = machine.link(lw.count[local] * b * item, np.ones(int(local.sum()), bool),
                                   active)
            cpu += np.bincount(dst[local], weights=copy, minlength=n)
        return cpu

    # ---------------------------------------------------------------- forward
    for i, lw in enumerate(work.layers):
        t0 = clock.copy()
        buf = lw.buffer_rows
        post = messages(lw, True) + lw.sent * b * item * rt["pack_ns_per_byte"] * 1e-9
        own = rt["layer_forward_s"] + kern("forward", i, lw.nnz_owned, buf, lw.prev_rows,
                                           dense=lw.nnz_owned == lw.rows * lw.prev_rows)
        ghost = kern("forward", i, lw.nnz_ghost, buf, lw.ghosts,
                     dense=lw.nnz_ghost == lw.rows * lw.ghosts)
        ready = exchange(lw, True, clock + post)
        done_own = clock + post + own
        start = np.maximum(done_own, ready)
        clock = start + ghost
        compute += own + ghost
        exch += post + (start - done_own)
        layers[i]["forward"] = float(np.max(clock - t0))
    # ---------------------------------------------------------------- loss
    last = work.layers[-1]
    coll = LOSS_COLLECTIVES * (rt["collective_s"] + _collective_latency(machine, n, active))
    softmax = last.rows * b * 4 * ew
    clock = np.full(n, clock.max()) + coll + softmax
    exch += coll
    compute += softmax
    kernel_time += softmax
    if not training:
        return _result(work, replicas, batch, clock, compute, exch, np.zeros(n), layers,
                       kernel_time)
    # ---------------------------------------------------------------- backward
    grad = np.zeros(n)
    stages = machine.gradient_sum_stages(n, replicas, active) if replicas > 1 else None
    measured = cal.ranks if machine.cluster is None else 0  # the all-reduce curve's ranks
    # Per rank: seconds so far in which MPI was called (the sums advance only then), and in
    # those seconds, when the sums started so far would be done.
    progress, queue = np.zeros(n), np.zeros(n)
    for i in range(len(work.layers) - 1, -1, -1):
        lw, t0 = work.layers[i], clock.copy()
        buf = lw.buffer_rows
        dense = lw.nnz == lw.rows * buf  # the whole local layer: its transpose too
        if i == 0:
            work_s = rt["layer_backward_s"] + kern("gradient", i, lw.nnz, buf, buf,
                                                   lw.rows * b * ew, dense)
            clock = clock + work_s
            compute += work_s
        else:
            ghost = rt["layer_backward_s"] + kern("backward", i, lw.nnz_ghost, buf, lw.ghosts,
                                                  lw.rows * b * ew, dense)
            post = messages(lw, False)
            own = kern("backward", i, lw.nnz_owned, buf, lw.prev_rows, lw.prev_rows * b * ew,
                       dense)
            ready = exchange(lw, False, clock + ghost + post)
            done_own = clock + ghost + post + own
            start = np.maximum(done_own, ready)
            # MPI is called between the owned rows' chunks and in the wait: the sums move.
            folds = (np.bincount(lw.src, minlength=n) + np.bincount(lw.dst, minlength=n)) > 0
            progress += np.where(folds, start - (clock + ghost + post), 0.0)
            add = lw.sent * b * ew
            kernel_time += add
            clock = start + add
            compute += ghost + own + add
            exch += post + (start - done_own)
        if stages is not None:
            # One after another, in the time MPI is called (``progress``) from this layer on.
            seconds = np.array([sum(
                allreduce_seconds(v * share, ranks, net, e * 1e9 / item, measured)
                for net, ranks, share in stages for v in arrays)
                for arrays, e in zip(zip(lw.nnz * item, lw.rows * item), ew)])
            queue = np.maximum(queue, progress) + seconds
        layers[i]["backward"] = float(np.max(clock - t0))
    if stages is not None:
        left = np.maximum(queue - progress, 0.0)  # no MPI call since: they run now
        grad += left + rt["collective_s"]
        clock = clock + left + rt["collective_s"]
    # The update (the products read W's values in place: no derived copy to refresh).
    update = sum((lw.nnz + lw.rows) * rt["update_ns_per_value"]
                 for lw in work.layers) * scale * 1e-9
    clock = clock + update + rt["step_s"]
    compute += update + rt["step_s"]
    kernel_time += update
    return _result(work, replicas, batch, clock, compute, exch, grad, layers, kernel_time)


def working_set(work: Workload, batch: int, itemsize: int) -> np.ndarray:
    """Bytes one training step touches on each rank: per nonzero its value, gradient and
    momentum, its index and its transpose's index and order (int32); per sample the X buffer
    and the stored pre-activations and activations."""
    ws = np.zeros(work.parts)
    for lw in work.layers:
        ws += lw.nnz * (3 * itemsize + 12) + (lw.buffer_rows + 2 * lw.rows) * batch * itemsize
    return ws


def warm_share(work: Workload, batch: int, itemsize: int, cache: float) -> np.ndarray:
    """Per rank, the weight of the warm-cache kernel table against the cold one: 1 when the
    step's working set fits in the rank's share of the last-level cache, 0 from 4x that on,
    linear in log2 between (0 everywhere when the cache size is unknown)."""
    if cache <= 0:
        return np.zeros(work.parts)
    ws = np.maximum(working_set(work, batch, itemsize), 1.0)
    return np.clip(np.log2(4 * cache / ws) / 2, 0.0, 1.0)


def _collective_latency(machine: Machine, n: int, active: int) -> float:
    if n <= 1:
        return 0.0
    net = machine.allreduce_network(n > machine.ranks_per_node, active)
    return allreduce_latency(net, n)


def _result(work: Workload, replicas: int, batch: int, clock: np.ndarray, compute: np.ndarray,
            exch: np.ndarray, grad: np.ndarray, layers: list[dict[str, float]],
            kernel_time: np.ndarray) -> Prediction:
    p = int(np.argmax(clock))
    return Prediction(method=work.method, parts=work.parts, replicas=replicas, batch=batch,
                      seconds=float(clock[p]),
                      compute=float(compute[p]), exchange=float(exch[p]), gradient=float(grad[p]),
                          layers=layers,
                      compute_kernels=float(kernel_time[p]))


def single_part(sizes: tuple[int, ...]) -> Plan:
    """The plan of one model part (every neuron on rank 0): pure data parallelism."""
    return Plan(1, tuple(np.zeros(n, dtype=np.int32) for n in sizes), {"method": "single"})


def grids(works: list[Workload], ranks: int, batch: int) -> list[tuple[Workload, int]]:
    """Every (plan, replicas) with plan parts x replicas = ``ranks`` and at least one sample
    per replica."""
    return [(w, ranks // w.parts) for w in works
            if ranks % w.parts == 0 and ranks // w.parts <= batch]


def best_grid(works: list[Workload], machine: Machine, ranks: int, batch: int,
              dtype: str = "float32") -> Prediction | None:
    """The fastest predicted grid for ``ranks`` (None when no plan fits)."""
    preds = [predict(w, machine, batch, r, dtype) for w, r in grids(works, ranks, batch)]
    return min(preds, key=lambda p: p.seconds, default=None)
