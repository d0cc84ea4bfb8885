"""The distributed network: each rank's rows of every layer, and the distributed passes.

Forward: expand ghost rows while the owned-column part of every row is computed. Backward: fold
ghost partial sums to their owners while the owned part is computed. The weight gradient needs no
communication. Loss and prediction all-reduce per-sample vectors only. Math: docs/formats.md.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from spdnn.io.bundle import NetworkBundle
from spdnn.kernels import bfloat16, rounding, sparse_inputs
from spdnn.kernels import products as kernels
from spdnn.kernels.encoding import MODES
from spdnn.kernels.ranges import row_chunks
from spdnn.model.activations import Activation, output_of
from spdnn.model.counters import Dropout
from spdnn.model.fingerprint import Fingerprint
from spdnn.model.labels import MultiLabels, as_labels
from spdnn.model.network import activations_of
from spdnn.model.ops import check_targets, output
from spdnn.model.plan import Plan
from spdnn.optim import parameters
from spdnn.runtime import lsh_output, outputs
from spdnn.runtime.accounting import Timers
from spdnn.runtime.gradsum import GradientSums
from spdnn.runtime.grid import Grid
from spdnn.runtime.halo import Traffic
from spdnn.runtime.local_layer import LocalLayer
from spdnn.runtime.lsh_layer import SampledLayer
from spdnn.runtime.narrow_tail import layer_run, narrow_tail
from spdnn.runtime.workspace import Forward, PingPong, Workspace, fill_inputs

# Row chunks of the local products that overlap a message exchange; between chunks the
# messages are progressed (MPI moves large messages only inside MPI calls).
OVERLAP_CHUNKS = 8
# Dead columns stay zero, so they ride along until enough died that a copy pays for itself.
COMPACT_BELOW = 0.75


class DistributedNetwork:
    """This rank's part of a network under a plan."""

    def __init__(self, grid: Grid, plan: Plan, layers: list[LocalLayer],
                 meta: dict[str, Any], dtype: np.dtype, sizes: tuple[int, ...],
                 fingerprint: str | None, stored: np.dtype | None = None) -> None:
        self.grid, self.plan, self.layers = grid, plan, layers
        self.comm = grid.model  # the parts of this replica
        self.fingerprint = fingerprint  # of the network (sizes and patterns)
        self.cap = meta["cap"]
        self.output_activation = meta["output_activation"]
        self.output_function = output_of(self.output_activation, self.cap)
        # the hidden layers' activations, by global layer (index k - 1 for layer k's outputs)
        self.activations = activations_of(meta, len(sizes) - 1)
        self.relu_only = all(a.zeros for a in self.activations)
        self.meta = meta
        self.dtype = dtype  # of sums, gradients, master weights and the optimizer's state
        # of what the products gather and the exchanges send: ``dtype``, or bfloat16's bits
        self.stored = np.dtype(dtype if stored is None else stored)
        self.bfloat16 = bfloat16.is_bfloat16(self.stored)
        # the cap ReLU's slope is compared with: under bfloat16, on the rounded outputs, the
        # cap rounded (the slope of Z rounded: 0 < bf16(z) < bf16(cap))
        self.slope_cap = self.cap if self.cap is None or not self.bfloat16 else \
            float(bfloat16.rounded(np.array([self.cap], np.float32))[0])
        self.sizes = sizes
        # X_0 of the first layer held here: the inputs, or a streamed block's incoming rows
        self.input_rows = plan.rows_of(self.comm.rank, layers[0].index - 1)
        self.traffic = Traffic.zeros(len(layers))
        self.timers = Timers(len(layers))
        self.sums = GradientSums(grid.data, self.traffic, self.timers,
                                 [(layer.weight.nnz, len(layer.bias)) for layer in layers], dtype)
        self._workspaces: dict[tuple[int, int], Workspace] = {}
        self._pingpong: dict[int, PingPong] = {}
        self.sampled: SampledLayer | None = None  # --lsh on one layer (sampled.use_lsh)
        self.layer_run: Any = False  # spdnn.runtime.narrow_tail's typed lists, built on first use
        self.updates: Any = None  # a job's topology updates (spdnn.runtime.topology)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def activation(self, i: int) -> Activation | None:
        """The activation of local layer i's outputs (None: the network's output layer)."""
        k = self.layers[i].index
        return self.activations[k - 1] if k <= len(self.activations) else None

    @staticmethod
    def load(bundle: NetworkBundle, plan: Plan, grid: Grid, dtype: Any = None, *,
             layers: tuple[int, int] | None = None,
             fingerprint: Fingerprint | None = None) -> DistributedNetwork:
        """Read this rank's rows of every layer (and no other rows' values) and build the
        exchange schedules of its replica. World rank 0 also hashes every pattern on the way
        for the network's fingerprint, known to every rank. ``layers``: only layers first to
        last (1-based, inclusive: a block of a streamed job), hashed into ``fingerprint`` (on
        world rank 0; the network's ``fingerprint`` is then None). ``dtype`` "bfloat16": the
        weights are read in float32 (the master copy) and rounded for the products.
        Collective; input errors are agreed over all ranks."""
        world, comm = grid.world, grid.model
        first, last = layers or (1, bundle.n_layers)
        whole = layers is None
        fp = (Fingerprint(bundle.sizes) if whole else fingerprint) if world.rank == 0 else None
        layers_ = []
        for k in range(first, last + 1):
            rows = plan.rows_of(comm.rank, k)
            mine = world.check(lambda k=k, rows=rows: bundle.rows(k, rows, dtype, fp))
            layers_.append(LocalLayer.build(comm, plan, k, mine))
        meta = dict(bundle.meta)  # other keys (a PyTorch model's layer names) carry through
        pool: dict = {}  # exchanges run one at a time: every layer's can use the same buffers
        for layer in layers_:
            layer.exchange.share_buffers(pool)
        dt = np.dtype(layers_[0].weight.dtype)
        stored = None
        if isinstance(dtype, str) and dtype == "bfloat16":
            for layer in layers_:
                layer.store_bfloat16()
            stored = bfloat16.BITS
        digest = world.bcast(fp.hexdigest() if fp is not None else None) if whole else None
        return DistributedNetwork(grid, plan, layers_, meta, dt, bundle.sizes, digest, stored)

    def weights_updated(self) -> None:
        """The optimizer changed the master weights: round the products' bfloat16 copies."""
        if self.bfloat16:
            for layer in self.layers:
                layer.round_values()

    # ------------------------------------------------------------------ forward

    def workspace(self, batch: int) -> Workspace:
        key = (batch, -1 if self.sampled is None else self.sampled.index)  # LSH: no full grad
        if key not in self._workspaces:
            self._workspaces[key] = Workspace(self.layers, self.dtype, batch,
                                              sampled=None if key[1] < 0 else key[1],
                                              stored=self.stored)
        return self._workspaces[key]

    def forward_layer(self, i: int, xbuf: np.ndarray, z: np.ndarray,
                      next_top: np.ndarray | None, alive: np.ndarray | None = None,
                      known: np.ndarray | None = None, stage: np.ndarray | None = None
                      ) -> np.ndarray | None:
        """Layer i+1. ``xbuf`` is the X_i buffer with its owned rows filled. While its ghost
        rows arrive, Z = W[:, owned] X_owned + b is computed in row chunks (progressing the
        messages between chunks); then Z += W[:, ghost] X_ghost, fused with h(Z) into
        ``next_top`` when given (and a 1 in ``alive`` for every nonzero column). ``stage``:
        bytes lent for the ghost rows' encoded arrivals (``Workspace.stages``). Returns the
        live rows of a sparse first input block whose zero rows it skipped (``known``)."""
        layer, t, comm = self.layers[i], self.timers, self.comm
        act = self.activation(i)
        if act is not None and not act.zeros and next_top is not None:  # h after the product
            live = self.forward_layer(i, xbuf, z, None, alive, known, stage)
            t0 = time.perf_counter()
            if self.bfloat16:  # h over Z in place, then rounded: the backward reads no Z
                kernels.activate(act, z, z)  # (Activation.BFLOAT16: slopes from the outputs)
                rounding.round_rows(z, next_top)
            else:
                kernels.activate(act, z, next_top)
            t.add("forward", i, compute=time.perf_counter() - t0)
            return live
        t0 = time.perf_counter()
        reqs, sent = layer.exchange.start_expand(xbuf, stage)
        self.traffic.count("forward", i, layer.exchange.rows_sent, xbuf.shape[1], xbuf.itemsize,
                           sent, len(layer.exchange.send_peers))
        t1 = time.perf_counter()
        w = layer.product_weight
        if not reqs and layer.exchange.n_ghost == 0:  # nothing to wait for: one fused pass
            live = sparse_inputs.live_rows(xbuf, known) \
                if i == 0 and alive is None and not self.bfloat16 else None
            if live is None:
                kernels.spmm_act(w, xbuf, layer.bias, self.cap, z, next_top, alive=alive)
            else:  # a sparse input block: the entries on its zero rows skipped
                sparse_inputs.spmm_act(layer.transposed, layer.weight.data, xbuf, live,
                                       layer.bias, self.cap, z, next_top)
            t.add("forward", i, compute=time.perf_counter() - t1, comm=t1 - t0, wait=0.0)
            return live
        for rows in row_chunks(len(layer.rows), OVERLAP_CHUNKS if reqs else 1):
            kernels.spmm_act(w, xbuf, layer.bias, None, z, None, rows,
                             span=layer.owned_span)
            comm.progress(reqs)
        t2 = time.perf_counter()
        layer.exchange.finish_expand(reqs, xbuf)
        t3 = time.perf_counter()
        kernels.spmm_act(w, xbuf, None, self.cap, z, next_top, accumulate=True,
                         alive=alive, span=layer.ghost_span)
        t4 = time.perf_counter()
        t.add("forward", i, compute=(t2 - t1) + (t4 - t3), comm=t1 - t0, wait=t3 - t2)
        return None

    def forward(self, x0: np.ndarray, *, keep: bool = True, drop_dead: bool = False,
                sampled: bool = False, labels: MultiLabels | None = None,
                fill: np.ndarray | None = None,
                dropout: tuple[Dropout, int, np.ndarray] | None = None) -> Forward:
        """x0: this rank's input rows (n_owned_0 x B).

        ``keep``: every layer's X buffer and Z stay in the workspace of this batch size, for
        ``backward``. Otherwise two buffers are reused layer after layer, and ``drop_dead``
        drops the columns (samples) that are zero on every rank, which stay zero when no bias
        is positive (the Graph Challenge mode); ``Forward.ids`` says which samples remain.
        There, once the batch is narrow and one rank holds the replica's rows, the remaining
        layers run in one kernel call (spdnn.runtime.narrow_tail).
        ``sampled``: the last layer computes its LSH-selected pairs only (``self.sampled``),
        with the ``labels`` of the samples and the random ``fill`` joining them in training.
        ``dropout``: (the spec, the step, the samples' indices in the data set): each hidden
        layer's owned outputs times its mask before they travel (kept for ``backward``).
        """
        if sampled and self.sampled is None:
            raise ValueError("sampled forward pass without LSH tables (sampled.use_lsh)")
        if keep and drop_dead:
            raise ValueError("drop_dead needs keep=False (backward needs every sample)")
        drop_dead = drop_dead and self.relu_only  # a dead sample is one of exact zeros
        width = x0.shape[1]
        ws = self.workspace(width) if keep else None
        if not keep and width not in self._pingpong:
            self._pingpong[width] = PingPong(self.layers, self.dtype, width, self.stored)
        pp = None if keep else self._pingpong[width]
        ids = np.arange(width)
        cur = 0  # which ping-pong buffer holds X_i

        def xview(i: int, which: int, cols: int) -> np.ndarray:
            if ws is not None:
                return ws.xbufs[i]
            rows = self.layers[i].n_buffer_rows
            return pp.x[which][: rows * cols].reshape(rows, cols)

        x = xview(0, cur, width)
        if ws is not None:
            ws.masks = []
        known = fill_inputs(x[: self.layers[0].n_owned_prev], x0, ws)  # a sparse block's rows
        run = layer_run(self) if drop_dead and not sampled and self.comm.size == 1 else None
        for i, layer in enumerate(self.layers):
            if run is not None and run.fits(i, width, x.itemsize):  # the rest in one call
                return Forward(*narrow_tail(run, self, i, pp, cur, width, ids, COMPACT_BELOW),
                               None, False)
            n = len(layer.rows)
            z = ws.zs[i] if ws is not None else pp.z[: n * width].reshape(n, width)
            last = i + 1 == self.n_layers
            nxt = None if last else xview(i + 1, 1 - cur, width)
            flags = np.zeros(width, np.int32) if drop_dead and not last else None
            if sampled and i == self.sampled.index:
                self.sampled.forward_layer(x, labels, fill)
                if last:
                    break
                self.sampled.hidden_outputs(z, nxt[:n])
            else:
                live = self.forward_layer(i, x, z, nxt if nxt is None else nxt[:n], flags, known,
                                          None if ws is None else ws.stages[i])
                if ws is not None and i == 0:
                    ws.live_inputs = live
            if dropout is not None and not last:
                spec, step, samples = dropout
                mask = spec.mask(step, i + 1, layer.rows, samples, self.dtype)
                if mask is not None:
                    nxt[:n] *= mask  # dropped values are exact zeros: not sent
                ws.masks.append(mask)
            if flags is not None:
                alive = (self.comm.allreduce(flags, "max") if self.comm.size > 1 else flags) > 0
                kept = int(alive.sum())
                if kept == 0:  # every sample died on every rank: the later layers give zeros
                    n_last = len(self.layers[-1].rows)
                    return Forward(pp.z[:0].reshape(n_last, 0), ids[:0], ws, sampled)
                if kept <= COMPACT_BELOW * width:
                    keep_cols = np.flatnonzero(alive)
                    compact = xview(i + 1, cur, kept)  # X_i is no longer needed
                    np.take(nxt[:n], keep_cols, axis=1, out=compact[:n], mode="clip")
                    nxt, width, ids = compact, kept, ids[keep_cols]
                    cur = 1 - cur
            if nxt is not None:
                x = nxt
                cur = 1 - cur
        return Forward(z, ids, ws, sampled)

    # ------------------------------------------------------------------ loss and backward

    def output(self, z_last: np.ndarray) -> np.ndarray:
        return output(z_last, self.output_function)

    def predict_classes(self, out: np.ndarray) -> np.ndarray:
        """Global argmax over the distributed output rows (first index among ties)."""
        return outputs.predict_classes(self.comm, self.layers[-1].rows, out)

    def top_k(self, out: np.ndarray, k: int) -> np.ndarray:
        """The k best global output rows per sample (samples x k), best first."""
        return outputs.top_k(self.comm, self.layers[-1].rows, out, k, self.sizes[-1])

    def backward(self, fwd: Forward, y: np.ndarray, loss: str, scale: int | None = None,
                 sample_losses: np.ndarray | None = None,
                 deltas: dict[int, np.ndarray] | None = None
                 ) -> tuple[float, int, list[np.ndarray], list[np.ndarray]]:
        """Loss, correct predictions and this rank's gradients (W data and bias per layer)
        after ``forward(..., keep=True)``; the loss is a mean over ``scale`` samples (default:
        this batch). With replicas, each layer's gradients are summed over them (started as
        soon as the layer's gradient is complete, while the earlier layers run); the loss and
        the count are those of this replica's samples (and ``sample_losses``, when given).
        ``deltas``: filled with a copy of each layer's error block dL/dZ (its rows x batch),
        by local layer (RigL's scores)."""
        ws, t, comm = fwd.workspace, self.timers, self.comm
        assert ws is not None, "backward needs forward(keep=True)"
        batch = ws.xbufs[0].shape[1]
        scale = batch if scale is None else scale
        grads_w: list = list(ws.grad_w)
        grads_b: list = list(ws.grad_b)
        at = self.sampled.index if fwd.sampled and self.sampled is not None else -1
        if fwd.sampled and self.sampled is not None and self.sampled.output:
            check_targets(y, loss)
            value, correct, delta = lsh_output.loss(
                self.sampled, as_labels(y, self.sizes[-1]), scale, sample_losses)
        else:  # a softmax's passes overwrite z_last with the gradient
            value, correct, delta = outputs.training_loss(
                self.comm, self.layers[-1].rows, self.sizes[-1], fwd.z_last, y, loss, scale,
                sample_losses, self.output_function)
        # bfloat16: the error block the products gather, rounded from ``delta`` (float32) or
        # written rounded by the products of the layer above (``ready``, its row sums then in
        # the layer's bias gradient); two blocks, taken in turn
        ready: np.ndarray | None = None
        turn = 0
        for i in range(self.n_layers - 1, -1, -1):
            layer = self.layers[i]
            t0 = time.perf_counter()
            if deltas is not None:
                deltas[i] = delta.copy()
            if i == at:  # a hidden layer's error at its active pairs, the output's already
                errors = delta if self.sampled.output else self.sampled.pair_errors(delta)
                grads_w[i], grads_b[i], delta = self.sampled.backward_layer(errors, ws)
                continue
            d = delta  # what the products gather: the error block, or its bfloat16 rounding
            if ready is not None:
                d, ready = ready, None
            elif self.bfloat16:
                d = ws.errors[turn][: delta.size].reshape(delta.shape)
                rounding.round_rows(delta, d, ws.grad_b[i] if i > 0 else None)
            turn = 1 - turn
            if i == 0:  # no W^T G below the first layer: the weight gradient alone
                sparse_inputs.sddmm(layer.product_weight, d, ws.xbufs[i], ws.live_inputs,
                                    ws.grad_w[i], ws.grad_b[i], lambda lay=layer: lay.transposed)
                self.sums.start(i, ws.grad_w[i], ws.grad_b[i])
                t.add("backward", i, compute=time.perf_counter() - t0)
                break
            if not self.bfloat16:
                np.sum(delta, axis=1, out=ws.grad_b[i])
            ex = layer.exchange
            wt, values = layer.transposed, layer.values
            n_own, n_buf = layer.n_owned_prev, layer.n_buffer_rows
            # Ghost rows first: their partial sums travel while the owned rows are computed.
            kernels.backward_products(wt, values, d, ws.xbufs[i], ws.ghost[i],
                                      ws.grad_w[i], (n_own, n_buf), base=n_own)
            t1 = time.perf_counter()
            reqs, recv, sent = ex.start_fold(ws.ghost[i], ws.xbufs[i])
            self.traffic.count("backward", i, ex.n_ghost, d.shape[1], ws.ghost[i].itemsize,
                               sent, len(ex.recv_peers))
            t2 = time.perf_counter()
            g = ws.partial[i]
            # With no partials coming in, the activation mask is applied inside the pass
            # (under bfloat16 from the rounded outputs h, and the pass writes the next error
            # block rounded, with its row sums: the bias gradient below).
            drop = ws.masks[i - 1] if ws.masks else None
            act = self.activation(i - 1)
            fused = act.zeros and ex.rows_sent == 0 and drop is None
            slope = ws.xbufs[i] if self.bfloat16 else ws.zs[i - 1]
            out, sums = g, None
            if fused and self.bfloat16:
                out = ready = ws.errors[turn][: g.size].reshape(g.shape)
                sums = ws.grad_b[i - 1]
            for rows in row_chunks(n_own, OVERLAP_CHUNKS if reqs else 1):
                kernels.backward_products(wt, values, d, ws.xbufs[i], out, ws.grad_w[i],
                                          rows, z=slope if fused else None, cap=self.slope_cap,
                                          sums=sums)
                comm.progress(reqs + self.sums.requests())
            self.sums.start(i, ws.grad_w[i], ws.grad_b[i])
            t3 = time.perf_counter()
            ex.finish_fold(reqs, recv, g, ws.xbufs[i])
            t4 = time.perf_counter()
            if act.zeros and not fused:
                kernels.apply_slope(g, slope, self.slope_cap)
            elif not act.zeros:  # h'(z) from the outputs h(z) kept here, when not dropped
                kernels.activation_backward(act, g, ws.zs[i - 1],
                                            ws.xbufs[i][:n_own] if drop is None else None)
            if drop is not None:
                g *= drop
            delta = g
            t5 = time.perf_counter()
            t.add("backward", i, compute=(t1 - t0) + (t3 - t2) + (t5 - t4), comm=t2 - t1,
                  wait=t4 - t3)
        self.sums.finish(ws.grad_w, ws.grad_b)
        return value, correct, grads_w, grads_b

    def topology_changed(self) -> None:
        """Some layers were rebuilt with new patterns (spdnn.runtime.topology): drop what was
        sized by the old ones (the workspaces, the narrow tail's lists, the sums' sizes)."""
        self._workspaces.clear()
        self._pingpong.clear()
        self.layer_run = False
        self.sums.sizes = [(layer.weight.nnz, len(layer.bias)) for layer in self.layers]

    def workspaces(self) -> list[Workspace]:
        return list(self._workspaces.values())

    def pingpongs(self) -> list[PingPong]:
        return list(self._pingpong.values())

    # ------------------------------------------------------------------ parameters

    def parameters(self) -> list[np.ndarray]:
        return parameters(self.layers)

    def set_exchange(self, mode: str) -> None:
        """How rows travel (``spdnn.kernels.encoding.MODES``): dense, sparse, or the smaller per
        message (auto). Every mode computes the same result."""
        if mode not in MODES:
            raise ValueError(f"unknown exchange mode {mode!r}; choose from {MODES}")
        for i, layer in enumerate(self.layers):
            below = self.activation(i - 1) if i > 0 else None
            relu = below is None or below.zeros  # a first layer's inputs: no fold below it
            # (bfloat16: the outputs at the cap hold it rounded, and the folds' slope
            # compares with it rounded)
            layer.exchange.mode, layer.exchange.cap = mode, self.slope_cap if relu else None
            layer.exchange.masked = relu
