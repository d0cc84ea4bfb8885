"""Replanning for a topology that changed (``spdnn train --replan``, ``--save-plan``): when
to refine the plan in force, and moving the rows that change owner.

The loop lives here, in the runtime, because it moves weights and optimizer state between the
ranks mid-run; the refinement itself is the partitioner's (``partition.replan.refine_plan``),
found by its entry point, since spdnn never imports the partition package (which imports
spdnn). The refinement runs on the replica's rank 0, on the patterns gathered there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from spdnn.kernels.ranges import concat_ranges
from spdnn.model.fingerprint import fingerprint_of
from spdnn.model.network import Layer
from spdnn.model.plan import Plan, plan_statistics
from spdnn.model.sparsity import SparseUpdate
from spdnn.optim import Optimizer
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.local_layer import LocalLayer

# ``--replan auto`` checks after every update while its checks pay; after one that does not,
# it waits twice as many updates as before (1, 2, 4, ...) up to this many.
AUTO_MAX_WAIT = 16


class Replanning:
    """``--replan`` over one job: after an update, whether to refine the plan and move."""

    def __init__(self, dnet: DistributedNetwork, opt: Optimizer, update: SparseUpdate,
                 replanner: Replanner, batch: int) -> None:
        self.dnet, self.opt, self.update = dnet, opt, update
        self.replanner, self.batch = replanner, batch
        self.wait, self.next_check = 1, 1  # auto: updates between checks, and the next

    def after(self, count: int, rows: int) -> int | None:
        """After the ``count``-th update: refine the plan for the current topology (on the
        replica's rank 0: ``replanner``), and move the rows that change owner when
        ``--replan`` asks (every K updates, or when it pays: ``_pays``). Returns the neurons
        moved (0 when the refinement does not pay or changes nothing), None when no
        refinement was due; ``rows``: what a step moves now. Collective."""
        dnet, k_every = self.dnet, self.update.replan_every()
        due = count % k_every == 0 if k_every else count >= self.next_check
        if not due:
            return None
        comm = dnet.comm
        patterns = gather_patterns(dnet)
        owners = None
        if comm.rank == 0:
            owners, refined = self.replanner(patterns, dnet.plan.owners, dnet.plan.parts)
            if not k_every and not self._pays(patterns, owners, rows - refined):
                owners = None
        owners = comm.bcast(owners)
        if not k_every:
            self.wait = 1 if owners is not None else min(2 * self.wait, AUTO_MAX_WAIT)
            self.next_check = count + self.wait
        if owners is None:
            return 0
        old = dnet.plan
        moved = sum(int(np.count_nonzero(a != b)) for a, b in zip(owners, old.owners))
        if moved == 0:  # the plan in force is as good as the search finds
            return 0
        meta = {k: v for k, v in old.meta.items() if k != "stats"}  # the old plan's volume
        move_rows(dnet, self.opt, Plan(old.parts, tuple(owners), {**meta, "method": "replanned"}))
        return moved

    def _pays(self, patterns: list, owners: tuple, saved_rows: int) -> bool:
        """``auto``: the rows a step saves (``saved_rows``), over the steps to the next
        update, outweigh the values the move carries (each moved neuron's weights and
        optimizer state, with an index each) and those it rewrites (every layer rebuilt
        because its rows or its inputs change owner). Rank 0, with the network's patterns."""
        dnet, old = self.dnet, self.dnet.plan.owners
        saved = saved_rows * self.batch * dnet.dtype.itemsize * self.update.every
        per_value = dnet.dtype.itemsize * (1 + self.opt.state_arrays(self.opt.config)) + 8
        values = 0
        for k, (indptr, _, _) in enumerate(patterns, start=1):
            moved = owners[k] != old[k]
            values += int(np.diff(indptr)[moved].sum())
            if moved.any() or not np.array_equal(owners[k - 1], old[k - 1]):
                values += int(indptr[-1])
        return saved > values * per_value


# (patterns, owners, parts) -> (refined owners, rows a training step moves under them)
Replanner = Callable[[list, tuple, int], tuple[tuple, int]]


def find_replanner() -> Replanner | None:
    """The partitioner's replanning (``partition.replan.refine_plan``), found by its entry
    point: spdnn does not import the partition package (it imports spdnn)."""
    from spdnn.plugins import entry_point

    return entry_point("spdnn.replanners", "refine")


def gather_patterns(dnet: DistributedNetwork) -> list:
    """Every layer's current pattern (indptr, global column indices, shape) on the
    replica's rank 0 (None elsewhere). Collective."""
    comm = dnet.comm
    out: list = []
    for layer in dnet.layers:
        k = layer.index
        mine = (layer.rows, np.diff(layer.weight.indptr), layer.global_columns())
        parts = comm.gather(mine)
        if comm.rank != 0:
            continue
        n_out, n_in = dnet.sizes[k], dnet.sizes[k - 1]
        rows = np.concatenate([np.repeat(r.astype(np.int64), c) for r, c, _ in parts])
        cols = np.concatenate([g.astype(np.int64) for _, _, g in parts])
        w = sp.csr_matrix((np.ones(len(cols), dtype=np.int8), (rows, cols)),
                          shape=(n_out, n_in))
        w.sort_indices()
        out.append((w.indptr.astype(np.int64), w.indices.astype(np.int64), (n_out, n_in)))
    return out if comm.rank == 0 else []


def move_rows(dnet: DistributedNetwork, opt: Optimizer, plan: Plan) -> None:
    """Put ``plan`` in force: every row whose owner changes travels to its new owner with its
    weights, bias and optimizer state (one all-to-all of indices and one of values per
    layer), and every layer whose rows or inputs change owner is rebuilt for the new plan.
    The input layer's owners must not change (they hold the data's columns). Collective."""
    comm, rank = dnet.comm, dnet.comm.rank
    if not np.array_equal(plan.owners[0], dnet.plan.owners[0]):
        raise ValueError("a replan must keep the input layer's owners")
    dt = dnet.dtype
    new_layers = []
    for i, layer in enumerate(dnet.layers):
        k = layer.index
        if all(np.array_equal(plan.owners[j], dnet.plan.owners[j]) for j in (k - 1, k)):
            new_layers.append(layer)  # neither its rows nor its inputs change owner
            continue
        n_in = dnet.sizes[k - 1]
        w = layer.weight
        names_w, names_b = sorted(opt.state[2 * i]), sorted(opt.state[2 * i + 1])
        counts = np.diff(w.indptr).astype(np.int64)
        cols = layer.global_columns().astype(np.int64)
        dest = plan.owners[k][layer.rows]
        ints, floats = [], []
        for q in range(comm.size):
            r = np.flatnonzero(dest == q)
            entries = concat_ranges(w.indptr[:-1][r].astype(np.int64), counts[r])
            ints.append(np.concatenate([[len(r)], layer.rows[r], counts[r], cols[entries]]))
            floats.append(np.concatenate([w.data[entries], layer.bias[r],
                                          *[opt.state[2 * i][n][entries] for n in names_w],
                                          *[opt.state[2 * i + 1][n][r] for n in names_b]]))
        got_i = comm.alltoall_lists(ints, np.int64)
        got_f = comm.alltoall_lists(floats, dt)
        rows, cnt, gcol, vals, bias = [], [], [], [], []
        state_w: dict[str, list] = {n: [] for n in names_w}
        state_b: dict[str, list] = {n: [] for n in names_b}
        for a, f in zip(got_i, got_f):
            n = int(a[0])
            c = a[1 + n:1 + 2 * n]
            e = int(c.sum())
            rows.append(a[1:1 + n])
            cnt.append(c)
            gcol.append(a[1 + 2 * n:])
            at = 0
            for target, size in ((vals, e), (bias, n)):
                target.append(f[at:at + size])
                at += size
            for name in names_w:
                state_w[name].append(f[at:at + e])
                at += e
            for name in names_b:
                state_b[name].append(f[at:at + n])
                at += n
        rows_a, cnt_a = np.concatenate(rows), np.concatenate(cnt)
        keys = np.repeat(rows_a, cnt_a) * n_in + np.concatenate(gcol)
        order = np.argsort(keys)  # by global row, then column
        row_order = np.argsort(rows_a)
        mine_rows = rows_a[row_order]
        if not np.array_equal(mine_rows, plan.rows_of(rank, k)):
            raise AssertionError(f"layer {k}: the rows received are not the plan's")
        local = np.searchsorted(mine_rows, np.repeat(rows_a, cnt_a))
        keys_sorted = keys[order]
        csr = sp.csr_matrix((np.concatenate(vals)[order],
                             (keys_sorted % n_in).astype(w.indices.dtype),
                             np.concatenate([[0], np.cumsum(np.bincount(
                                 local[order], minlength=len(mine_rows)))]).astype(
                                 w.indptr.dtype)), shape=(len(mine_rows), n_in))
        rebuilt = LocalLayer.build(comm, plan, k, Layer(csr, np.concatenate(bias)[row_order]))
        new_keys = np.repeat(mine_rows, np.diff(rebuilt.weight.indptr)) * n_in \
            + rebuilt.global_columns().astype(np.int64)
        where = order[np.searchsorted(keys_sorted, new_keys)]
        rebuilt.weight.data[:] = np.concatenate(vals)[where]
        ex_old, ex_new = layer.exchange, rebuilt.exchange
        ex_new.mode, ex_new.cap, ex_new.masked = ex_old.mode, ex_old.cap, ex_old.masked
        opt.params[2 * i], opt.params[2 * i + 1] = rebuilt.weight.data, rebuilt.bias
        opt.state[2 * i] = {n: np.concatenate(v)[where] for n, v in state_w.items()}
        opt.state[2 * i + 1] = {n: np.concatenate(v)[row_order] for n, v in state_b.items()}
        opt.forget_scratch(2 * i)
        opt.forget_scratch(2 * i + 1)
        new_layers.append(rebuilt)
    dnet.layers[:] = new_layers
    dnet.plan = plan
    pool: dict = {}
    for layer in dnet.layers:
        layer.exchange.share_buffers(pool)
    dnet.topology_changed()


def plan_in_force(dnet: DistributedNetwork) -> Plan | None:
    """The plan in force, for the network as it is now (``--save-plan``): its statistics and
    the fingerprint of the current topology, on the replica's rank 0 (None elsewhere).
    Collective."""
    patterns = gather_patterns(dnet)
    if dnet.comm.rank != 0:
        return None
    plan = dnet.plan
    stats = plan_statistics(patterns, plan.owners, parts=plan.parts)
    fingerprint = fingerprint_of(dnet.sizes, [(p[0], p[1]) for p in patterns])
    return Plan(plan.parts, plan.owners, {**plan.meta, "stats": stats.summary(),
                                          "fingerprint": fingerprint})
