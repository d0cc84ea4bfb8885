"""The replay behind ``spdnn.cost.costmodel.predict``: one clock per rank of a replica, advanced
through the forward pass, the loss, the backward pass with the gradient sums, and the update,
as the runtime schedules them (the model itself is described in costmodel's docstring)."""

from __future__ import annotations

from typing import Any

import numpy as np

from spdnn.backends import active
from spdnn.cost.cluster import Machine, allreduce_latency, allreduce_seconds
from spdnn.cost.workload import LayerWork, Workload
from spdnn.model.csr import as_dtype, stored_itemsize

LOSS_COLLECTIVES = 4  # two global maxima, the packed softmax sums, the argmin of predictions


class StepReplay:
    """Each rank's clock through one step, and where its time went: ``compute`` (of which
    ``kernel_time`` is what the kernel tables predict), ``exch`` (posting and waiting for
    messages), ``grad`` (the gradient sums left after the backward pass), and per layer the
    slowest rank's forward and backward seconds."""

    def __init__(self, work: Workload, machine: Machine, batch: int, replicas: int,
                 dtype: str, optimizer: Any = None) -> None:  # noqa: ANN401
        from spdnn.optim import SGDConfig, name_of, state_arrays

        optimizer = SGDConfig() if optimizer is None else optimizer  # the calibration's
        cal = machine.calibration
        self.update_ns = cal.update_ns(name_of(optimizer))
        states = state_arrays(optimizer)
        self.work, self.machine, self.replicas = work, machine, replicas
        # bfloat16: its own kernel tables (float32's in a file without them), 16-bit rows
        # forward, and float32 for the folds, the gradient sums and the element-wise work
        self.table, self.rt, self.structure = cal.table(dtype), cal.runtime, cal.structure
        self.item, self.sent_item = as_dtype(dtype).itemsize, stored_itemsize(dtype)
        self.round_ns = cal.round_ns() if dtype == "bfloat16" else 0.0
        self.n = n = work.parts
        self.b = b = -(-batch // replicas)  # the largest replica slice
        rpn = machine.ranks_per_node
        self.active = min(rpn, n * replicas)
        self.node = np.arange(n) // rpn
        # The LLC is shared by the ranks running on the node; beyond the calibrated count,
        # each is assumed to keep the share it had in calibration (a cluster node has its own
        # cache).
        self.warm = warm_share(work, b, self.item,
                               self.rt["cache_bytes"] / max(1, min(self.active, cal.ranks)),
                               states, self.sent_item)
        self.scale = machine.compute_scale(self.active, self.warm, b)  # per rank
        self.ew = self.scale * self.rt["elementwise_ns_per_value"] * 1e-9
        self.measured = cal.ranks if machine.cluster is None else 0  # all-reduce curve's ranks
        self.clock, self.compute = np.zeros(n), np.zeros(n)
        self.kernel_time, self.exch, self.grad = np.zeros(n), np.zeros(n), np.zeros(n)
        self.layers = [{"forward": 0.0, "backward": 0.0} for _ in work.layers]
        # The backward pass: per rank, the seconds so far in which MPI was called (the
        # gradient sums advance only then), when the sums started so far would be done in
        # them, and the sums' link time and stack CPU.
        self.stages = machine.gradient_sum_stages(n, replicas, self.active) \
            if replicas > 1 else None
        self.progress, self.queue = np.zeros(n), np.zeros(n)
        self.sums_s, self.sums_cpu = np.zeros(n), np.zeros(n)

    def kern(self, name: str, layer: int, nnz: np.ndarray, buf: np.ndarray, read: np.ndarray,
             extra: np.ndarray | float = 0.0, dense: np.ndarray | None = None) -> np.ndarray:
        """``nnz`` nonzeros of ``layer`` reading ``read`` of the ``buf`` buffer rows; where
        ``dense`` (per rank), a dense block, which the runtime hands to BLAS."""
        b, table = self.b, self.table
        reuse = nnz / np.maximum(read, 1)
        structured = 1.0
        if self.structure is not None and self.work.locality is not None:
            gap = self.work.locality[layer, 1 if name == "backward" else 0]
            structured = self.structure.factor(name, b, float(gap))
        sparse = structured * ((1 - self.warm) * table.seconds(name, nnz, b, buf, reuse)
                               + self.warm * table.seconds(f"{name}_warm", nnz, b, buf, reuse))
        if table.dense is not None and dense is not None and dense.any():
            sparse = np.where(dense, table.dense.seconds(name, nnz, b), sparse)
        t = self.scale * sparse + extra
        self.kernel_time += t
        return t

    def arrivals(self, lw: LayerWork, forward: bool, t_post: np.ndarray) -> np.ndarray:
        """Arrival of each rank's last incoming message (or -inf), messages departing at
        ``t_post`` of their sender."""
        n, node = self.n, self.node
        src, dst = (lw.src, lw.dst) if forward else (lw.dst, lw.src)
        if len(src) == 0:
            return np.full(n, -np.inf)
        nbytes = lw.count * self.b * self.itemsize(forward)
        lat, tt = self.machine.link(nbytes, node[src] == node[dst], self.active)
        passes = active().passes("spdnn.cost._workload_kernels", "spdnn.cost._arrivals_numpy")
        return passes.arrivals(src, dst, np.asarray(lat, float), np.asarray(tt, float),
                               np.asarray(t_post, float), n)

    def messages(self, lw: LayerWork, forward: bool) -> np.ndarray:
        """Each rank's CPU time for its messages of one exchange: the software cost per
        message and, within a node, the copy of what it receives: shared memory moves bytes
        with a CPU, inside the MPI calls the runtime makes between its chunks of work, so the
        copy adds to the work instead of overlapping it."""
        n, rt = self.n, self.rt
        src, dst = (lw.src, lw.dst) if forward else (lw.dst, lw.src)
        total = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
        cpu = total * rt["message_s"] + (total > 0) * rt["exchange_layer_s"]
        local = self.node[src] == self.node[dst]
        if local.any():
            _, copy = self.machine.link(lw.count[local] * self.b * self.itemsize(forward),
                                        np.ones(int(local.sum()), bool), self.active)
            cpu += np.bincount(dst[local], weights=copy, minlength=n)
        return cpu

    def itemsize(self, forward: bool) -> int:
        """Bytes of a value in a message: bfloat16's rows forward are 16-bit, folds float32."""
        return self.sent_item if forward else self.item

    def stack(self, lw: LayerWork, forward: bool) -> np.ndarray:
        """Each rank's CPU time in the network stack for one exchange: per byte that crosses
        nodes, at both ends (TCP's; 0 over RDMA). It runs inside the MPI calls between the
        chunks of work and on the same core, so it lengthens the work instead of overlapping
        it; the transfer's arrival is still the link's."""
        c = self.machine.stack_s_per_byte
        if c == 0.0 or len(lw.src) == 0:
            return np.zeros(self.n)
        cross = self.node[lw.src] != self.node[lw.dst]
        nbytes = lw.count[cross] * self.b * self.itemsize(forward) * c
        return (np.bincount(lw.src[cross], weights=nbytes, minlength=self.n)
                + np.bincount(lw.dst[cross], weights=nbytes, minlength=self.n))

    def forward(self) -> None:
        """Each layer: post the expand, the owned columns' product while it travels, wait,
        the ghost columns' product."""
        for i in range(len(self.work.layers)):
            self.forward_layer(i, self.work.layer(i))

    def forward_layer(self, i: int, lw: LayerWork) -> None:
        b, item, rt = self.b, self.sent_item, self.rt
        t0 = self.clock.copy()
        buf = lw.buffer_rows
        post = self.messages(lw, True) + lw.sent * b * item * rt["pack_ns_per_byte"] * 1e-9
        own = rt["layer_forward_s"] + self.kern(
            "forward", i, lw.nnz_owned, buf, lw.prev_rows,
            dense=lw.nnz_owned == lw.rows * lw.prev_rows)
        ghost = self.kern("forward", i, lw.nnz_ghost, buf, lw.ghosts,
                          dense=lw.nnz_ghost == lw.rows * lw.ghosts)
        ready = self.arrivals(lw, True, self.clock + post)
        stack = self.stack(lw, True)
        done_own = self.clock + post + own + stack
        start = np.maximum(done_own, ready)
        self.clock = start + ghost
        self.compute += own + ghost
        self.exch += post + stack + (start - done_own)
        self.layers[i]["forward"] = float(np.max(self.clock - t0))

    def loss(self) -> None:
        """The small all-reduces over the parts, where every clock meets, and the softmax."""
        coll = LOSS_COLLECTIVES * (self.rt["collective_s"]
                                   + _collective_latency(self.machine, self.n, self.active))
        softmax = self.work.layers[-1].rows * self.b * 4 * self.ew
        self.clock = np.full(self.n, self.clock.max()) + coll + softmax
        self.exch += coll
        self.compute += softmax
        self.kernel_time += softmax

    def backward(self) -> None:
        """Each layer from the last: the ghost rows' products, post the fold, the owned rows',
        wait for the partial sums and add them; the layer's gradient sums over the replicas
        queue up and advance only while MPI is called; what is left runs at the end."""
        for i in range(len(self.work.layers) - 1, -1, -1):
            self.backward_layer(i, self.work.layer(i))
        self.backward_end()

    def backward_layer(self, i: int, lw: LayerWork) -> None:
        """Layer i+1 of the backward pass (called from the last layer down)."""
        b, rt, ew, item = self.b, self.rt, self.ew, self.item
        stages = self.stages
        t0, clock = self.clock.copy(), self.clock
        buf = lw.buffer_rows
        dense = lw.nnz == lw.rows * buf  # the whole local layer: its transpose too
        if i == 0:
            work_s = rt["layer_backward_s"] + self.kern("gradient", i, lw.nnz, buf, buf,
                                                        lw.rows * b * ew, dense)
            self.clock = clock + work_s
            self.compute += work_s
        else:
            ghost = rt["layer_backward_s"] + self.kern(
                "backward", i, lw.nnz_ghost, buf, lw.ghosts, lw.rows * b * ew, dense)
            post = self.messages(lw, False)
            own = self.kern("backward", i, lw.nnz_owned, buf, lw.prev_rows,
                            lw.prev_rows * b * ew, dense)
            ready = self.arrivals(lw, False, clock + ghost + post)
            stack = self.stack(lw, False)
            done_own = clock + ghost + post + own + stack
            start = np.maximum(done_own, ready)
            # MPI is called between the owned rows' chunks and in the wait: the sums move.
            folds = (lw.sent + lw.ghosts) > 0
            self.progress += np.where(folds, start - (clock + ghost + post), 0.0)
            add = lw.sent * b * ew
            self.kernel_time += add
            self.clock = start + add
            self.compute += ghost + own + add
            self.exch += post + stack + (start - done_own)
        if stages is not None:
            # One after another, in the time MPI is called (``progress``) from here on.
            seconds = np.array([sum(
                allreduce_seconds(v * share, ranks, net, e * 1e9 / item, self.measured)
                for net, ranks, share in stages for v in arrays)
                for arrays, e in zip(zip(lw.nnz * item, lw.rows * item), ew)])
            self.queue = np.maximum(self.queue, self.progress) + seconds
            self.sums_s += seconds
            # Across nodes, the stack's CPU time (each rank sends and receives about twice
            # its share of the bytes), charged below where the sums overlap work.
            self.sums_cpu += (lw.nnz + lw.rows) * item * sum(
                4 * (ranks - 1) / ranks * share * net.cpu_ns_per_byte * 1e-9
                for net, ranks, share in stages)
        self.layers[i]["backward"] = float(np.max(self.clock - t0))

    def backward_end(self) -> None:
        """The gradient sums left when the backward pass ends."""
        if self.stages is None:
            return
        left = np.maximum(self.queue - self.progress, 0.0)  # no MPI call since: they run now
        # The stack's CPU time slows the work only for the part of the sums that moved
        # while there was work (in MPI calls between its chunks); in the final wait the
        # core is idle, and the sums' measured time already holds the stack. Pure data
        # parallelism calls MPI only there: charged in full, 1 x 2 was over-predicted.
        overlapped = np.where(self.sums_s > 0,
                              1 - left / np.maximum(self.sums_s, 1e-300), 0.0)
        stack = self.sums_cpu * np.clip(overlapped, 0.0, 1.0)
        self.grad += left + self.rt["collective_s"] + stack
        self.clock = self.clock + left + self.rt["collective_s"] + stack

    def update(self) -> None:
        """The optimizer's update of every stored value, at its calibrated ns per value (float32
        and float64 products read W's values in place; bfloat16's copy is rounded again, at
        its own ns per weight), and the step's fixed cost."""
        rt = self.rt
        update = sum((lw.nnz + lw.rows) * self.update_ns + lw.nnz * self.round_ns
                     for lw in self.work.layers) * self.scale * 1e-9
        self.clock = self.clock + update + rt["step_s"]
        self.compute += update + rt["step_s"]
        self.kernel_time += update


def working_set(work: Workload, batch: int, itemsize: int, states: int = 1,
                stored: int | None = None) -> np.ndarray:
    """Bytes one training step touches on each rank: per nonzero its value, gradient and the
    optimizer's ``states`` arrays (SGD's momentum: one), its index and its transpose's index
    and order (int32); per sample the X buffer and the stored pre-activations and
    activations. ``stored``: the bytes of what the products gather, when not ``itemsize``
    (bfloat16: the weights' 16-bit copy beside the master, 16-bit X and outputs)."""
    stored = itemsize if stored is None else stored
    copy = stored if stored != itemsize else 0
    ws = np.zeros(work.parts)
    for lw in work.layers:
        ws += lw.nnz * ((2 + states) * itemsize + copy + 12) + \
            (lw.buffer_rows * stored + lw.rows * (itemsize + stored)) * batch
    return ws


def warm_share(work: Workload, batch: int, itemsize: int, cache: float,
               states: int = 1, stored: int | None = None) -> np.ndarray:
    """Per rank, the weight of the warm-cache kernel table against the cold one: 1 when the
    step's working set fits in the rank's share of the last-level cache, 0 from 4x that on,
    linear in log2 between (0 everywhere when the cache size is unknown)."""
    if cache <= 0:
        return np.zeros(work.parts)
    ws = np.maximum(working_set(work, batch, itemsize, states, stored), 1.0)
    return np.clip(np.log2(4 * cache / ws) / 2, 0.0, 1.0)


def _collective_latency(machine: Machine, n: int, active: int) -> float:
    if n <= 1:
        return 0.0
    net = machine.allreduce_network(n > machine.ranks_per_node, active)
    return allreduce_latency(net, n)


