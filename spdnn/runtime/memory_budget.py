"""A rank's memory budget, checked before it reads its rows: each rank counts what it will
hold (its nonzeros and ghost rows, streamed from the file; the rows it will send, from the
others' counts), predicts its peak (``spdnn.model.memory``) and the job is refused on every
rank when any rank's prediction passes the limit (docs/memory.md)."""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from spdnn.comm.memlimit import cgroup_memory, node_memory
from spdnn.comm.mpi import AgreedError, Communicator
from spdnn.model.activations import relu_only
from spdnn.model.memory import (
    LayerShape,
    MemoryPrediction,
    format_bytes,
    predict,
    replica_batch,
)
from spdnn.model.plan import Plan
from spdnn.runtime import memory_report
from spdnn.runtime.grid import Grid


def default_limit(comm: Communicator) -> tuple[int, str]:
    """Per rank: the cgroup's limit when one is set, divided among the ranks of this node in
    the same cgroup (Slurm puts a node's ranks of a step in one), else the node's memory
    divided by the ranks on it; with where it came from. Collective."""
    ranks = comm.node_size()
    cg = cgroup_memory()
    where = None if cg is None else (socket.gethostname(), cg[1])
    sharing = sum(1 for w in comm.allgather(where) if where is not None and w == where)
    if cg is not None:
        if sharing > 1:
            return cg[0] // sharing, f"the cgroup memory limit / {sharing} ranks in it"
        return cg[0], "the cgroup memory limit"
    return node_memory() // ranks, f"the node's memory / {ranks} rank(s) on it"


@dataclass(frozen=True, kw_only=True)
class Budget:
    """What a job checks before it loads: ``limit`` in bytes per rank (None: the default,
    ``default_limit``; 0: none), its batch, whether it trains; an inference job may instead
    stream its layers (``can_stream``), in blocks of at most ``stream_layers`` when given."""

    limit: int | None
    batch: int
    training: bool
    can_stream: bool = False
    stream_layers: int | None = None
    challenge: bool = False  # inference in Graph Challenge chunks (spdnn.model.memory)
    lsh_tables: int = 0  # --lsh: hash tables over a layer's rows (spdnn.model.memory)
    lsh_layer: int = -1  # that layer, from 0 (-1: the output layer)
    optimizer_arrays: int = 1  # training: the optimizer's state per value (model.memory)
    dropout: bool = False  # training: dropout's masks of the step (model.memory)
    baseline: int | None = None  # measured earlier by this job (else measured by ``check``)
    # This rank's input data in bytes, from the grid (its replica's share of the samples), its
    # first layer's features and the network's input size, counted before anything is read
    # (None: not known ahead).
    data: Callable[[Grid, np.ndarray, int], int] | None = None


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """``check``'s answer: this rank's prediction and shapes, the limit in force (0: none)
    and where it came from, and the refusal line when some rank's prediction passes it."""

    prediction: MemoryPrediction
    shapes: list[LayerShape]
    limit: int
    source: str
    over: str | None


def planned_shapes(grid: Grid, bundle: object, plan: Plan) -> list[LayerShape]:
    """This rank's ``LayerShape``s before loading: its rows' indices streamed from the file
    (a bounded group at a time). Collective over the job; input errors agreed."""
    comm, world = grid.model, grid.world
    me = comm.rank
    shapes = []
    for k in range(1, len(plan.owners)):
        rows, owner_prev = plan.rows_of(me, k), plan.owners[k - 1]

        def count(k: int = k, rows: np.ndarray = rows,
                  owner_prev: np.ndarray = owner_prev) -> tuple[int, np.ndarray]:
            used, nnz = np.zeros(len(owner_prev), dtype=bool), 0
            for part in bundle.row_indices(k, rows):  # type: ignore[attr-defined]
                used[part] = True
                nnz += len(part)
            cols = np.flatnonzero(used)
            foreign = cols[owner_prev[cols] != me]
            return nnz, np.bincount(owner_prev[foreign], minlength=comm.size)

        nnz, need = world.check(count)
        sent = int(sum(n[me] for n in comm.allgather(need)))
        shapes.append(LayerShape(nnz=nnz, rows=len(rows), prev_rows=len(plan.rows_of(me, k - 1)),
                                 ghosts=int(need.sum()), sent=sent))
    return shapes


def check(grid: Grid, bundle: object, plan: Plan, itemsize: int, budget: Budget,
          stored: int | None = None) -> Verdict:
    """Predict this rank's peak, and every rank's against its limit: the verdict names the
    rank, the bytes, the limit and the smallest P expected to fit when one passes it. A limit
    below the baseline is refused on every rank (``stored``: ``predict``'s). Collective."""
    world = grid.world
    limit, source = (budget.limit, "--memory-limit") if budget.limit is not None else \
        default_limit(world)
    shapes = planned_shapes(grid, bundle, plan)
    if budget.lsh_tables and budget.lsh_layer >= len(shapes):  # before its tables are counted
        world.agree(f"--lsh: layer {budget.lsh_layer + 1} is beyond the network's "
                    f"{len(shapes)} layers")
    data = 0 if budget.data is None else \
        world.check(lambda: budget.data(grid, plan.rows_of(grid.model.rank, 0),
                                                bundle.sizes[0]))  # type: ignore[attr-defined]
    # Every input checked: the kernels load now, before anything sized by the network, and
    # what the process then holds is its baseline
    floor = budget.baseline if budget.baseline is not None else \
        memory_report.measure_baseline("bfloat16" if stored == 2 else
                                       {4: "float32", 8: "float64"}[itemsize],
                                       node_ranks=world.node_size(), training=budget.training)
    if budget.limit is not None and budget.limit != 0 and budget.limit < floor:
        world.agree(f"--memory-limit {format_bytes(budget.limit)} is below this rank's "
                    f"baseline of {format_bytes(floor)} (interpreter, numpy, MPI, kernels)")
    pred = predict(shapes, batch=replica_batch(budget.batch, grid.replicas), itemsize=itemsize,
                   training=budget.training, challenge=budget.challenge, data_bytes=data,
                   lsh_tables=budget.lsh_tables, lsh_layer=budget.lsh_layer, baseline=floor,
                   optimizer_arrays=budget.optimizer_arrays,
                   dropout=budget.dropout, stored=stored,
                   relu=relu_only(bundle.meta.get("activations", ())))  # type: ignore[attr-defined]
    everyone = world.allgather((pred.total, limit, pred.baseline))
    over = [r for r, (total, lim, _) in enumerate(everyone) if lim and total > lim]
    line = None
    if over:
        r = max(over, key=lambda q: everyone[q][0])
        total, lim, base = everyone[r]
        share = sum(t - b for t, _, b in everyone)  # what the ranks split between them
        fit = math.ceil(share / (lim - base)) if lim > base else None
        hint = f"about {fit} ranks would fit (the network's share split evenly)" if fit else \
            "no rank count fits"
        line = (f"rank {r}: predicted peak {format_bytes(total)} is over the allowed "
                f"{format_bytes(lim)} ({source}); {hint}")
    return Verdict(prediction=pred, shapes=shapes, limit=int(limit or 0), source=source,
                   over=line)


class DryRun(AgreedError):  # noqa: N818 (not a failure: the job's answer)
    """A dry run's report, raised on every rank together (so it passes ``guard`` as an
    agreed outcome); rank 0's text is the table, and the command exits 0."""

    exit_code = 0


def dry_run_report(comm: Communicator, pred: MemoryPrediction, limit: int | None,
                   budget: Budget) -> str:
    """The table of every rank's predicted peak, on rank 0 (empty elsewhere). Collective."""
    rows = comm.gather((pred.as_dict(), limit))
    if rows is None:
        return ""
    counted = budget.data is not None  # the inputs' bytes, when counted before loading
    kinds = ("weights", "training", "buffers", *(("data",) * counted), "baseline", "total")
    what = "training at batch " + str(budget.batch) if budget.training else "inference"
    lines = [f"predicted peak memory per rank ({what}"
             f"{'' if counted else '; data not included'}):",
             "rank  " + "  ".join(f"{k:>10}" for k in (*kinds, "limit"))]
    for r, (p, lim) in enumerate(rows):
        cells = [format_bytes(p[k]) for k in kinds] + [format_bytes(lim) if lim else "none"]
        lines.append(f"{r:>4}  " + "  ".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)
