"""Layer-streamed inference: a network whose weights pass a rank's memory limit runs in blocks
of consecutive layers that fit it. A block is read (each rank its rows), every input chunk
passes through it, and it is freed before the next block is read, so the weights are read once
per job. Between blocks each chunk's activations wait in a ``BoundaryStore`` (spdnn.runtime.
boundary). Every sample meets the same products in the same order as in memory: categories
and accuracies are identical (docs/memory.md)."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spdnn.comm.mpi import AgreedError
from spdnn.model.fingerprint import Fingerprint
from spdnn.model.memory import (
    LayerShape,
    MemoryPrediction,
    format_bytes,
    predict,
)
from spdnn.model.plan import Plan
from spdnn.runtime import memory_report
from spdnn.runtime.accounting import Timers
from spdnn.runtime.boundary import BoundaryStore, Chunk
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.grid import Grid
from spdnn.runtime.halo import Traffic
from spdnn.runtime.workspace import Forward

# The share of a limit (above the process baseline) that a block of layers may take; the rest
# keeps the activations between blocks in memory (they spill to scratch files beyond it).
BLOCK_SHARE = 0.5


@dataclass(frozen=True, kw_only=True)
class StreamPlan:
    """The blocks of a streamed job: (first, last) layer numbers, 1-based and inclusive; the
    bytes of activations kept in memory between blocks (0: no bound); why it streams."""

    blocks: tuple[tuple[int, int], ...]
    allowance: int
    reason: str
    challenge: bool = False  # in Graph Challenge chunks (the memory each block needs)

    def describe(self) -> str:
        widest = max(b - a + 1 for a, b in self.blocks)
        return (f"streaming {self.blocks[-1][1]} layers in {len(self.blocks)} block(s) of at "
                f"most {widest} ({self.reason}); each block is read once")


def _block_end(shapes: list[LayerShape], start: int, cap: int, itemsize: int,
               room: float, challenge: bool) -> int:
    """The largest ``end`` (exclusive, at most ``start + cap``) whose block fits ``room``
    bytes on this rank; ``start`` when not even one layer does."""

    def fits(end: int) -> bool:
        return _block(shapes[start:end], itemsize, challenge).total <= room

    lo, hi = start, min(len(shapes), start + cap)
    while lo < hi:  # the prediction grows with the block
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _block(shapes: list[LayerShape], itemsize: int, challenge: bool,
           data: int = 0) -> MemoryPrediction:
    """A block's prediction: a streamed job loads its kernels before its first block."""
    return predict(shapes, batch=1, itemsize=itemsize, training=False, challenge=challenge,
                   data_bytes=data, baseline=memory_report.baseline())


def choose_blocks(grid: Grid, shapes: list[LayerShape], *, limit: int, itemsize: int,
                  max_layers: int | None, reason: str, challenge: bool = False,
                  data: int = 0) -> StreamPlan:
    """Blocks of consecutive layers that fit every rank: a block may take BLOCK_SHARE of what
    ``limit`` leaves above the baseline and this rank's ``data`` (its inputs, held through
    every block); 0: no limit, blocks of ``max_layers``. The job is refused on every rank
    when one layer alone does not fit. Collective."""
    world, n = grid.world, len(shapes)
    cap = max_layers or n
    base = memory_report.baseline()
    if limit:
        short = world.allgather(data if limit - data <= base else 0)
        if any(short):
            r = int(np.argmax(short))
            raise AgreedError(f"--memory-limit {format_bytes(limit)}: rank {r}'s inputs alone "
                              f"take {format_bytes(short[r])}, which leaves no room for its "
                              "layers (more ranks or a larger limit)")
    free = limit - data  # what the blocks and the activations between them may share
    room = math.inf if not limit else base + BLOCK_SHARE * (free - base)
    blocks, start, biggest = [], 0, 0
    while start < n:
        end = int(world.allreduce_scalar(
            _block_end(shapes, start, cap, itemsize, room, challenge), "min"))
        if end == start:
            need = _block(shapes[start:start + 1], itemsize, challenge).total
            every = world.allgather(need)
            r = int(np.argmax(every))
            raise AgreedError(f"--memory-limit {format_bytes(limit)}: layer {start + 1} alone "
                              f"needs {format_bytes(every[r])} on rank {r}, more than a block "
                              f"may take ({format_bytes(room)}); no block of layers fits "
                              "(more ranks or a larger limit)")
        biggest = max(biggest, _block(shapes[start:end], itemsize, challenge).total)
        blocks.append((start + 1, end))
        start = end
    allowance = 0 if not limit else max(1, free - biggest)
    allowance = int(world.allreduce_scalar(allowance, "min")) if limit else 0
    return StreamPlan(blocks=tuple(blocks), allowance=allowance, reason=reason,
                      challenge=challenge)


def _place(whole: Any, part: Any, offset: int) -> None:  # noqa: ANN401
    """Add a block's per-layer counters (``Traffic``, ``Timers``) into the whole network's."""
    for name, arr in vars(part).items():
        if isinstance(arr, np.ndarray):
            target = getattr(whole, name)
            if arr.ndim == 1:
                target[offset:offset + len(arr)] += arr
            else:
                target[:, offset:offset + arr.shape[1]] += arr


class LayerStream:
    """A network under a plan, run block by block (``run``); after it, the whole network's
    traffic, timers, ghost rows per layer, fingerprint and the largest block's memory."""

    def __init__(self, bundle: Any, plan: Plan, grid: Grid, dtype: Any,  # noqa: ANN401
                 exchange: str, stream: StreamPlan, *, planned: list[LayerShape],
                 plan_source: str, scratch: str | None = None) -> None:
        self.bundle, self.plan, self.grid, self.stream = bundle, plan, grid, stream
        self.planned = planned  # this rank's shapes, counted before loading
        self.plan_source = plan_source
        self.dtype = np.dtype(dtype if dtype is not None else "float32")
        self.exchange, self.scratch = exchange, scratch
        self.comm = grid.model
        n = bundle.n_layers
        self.sizes = tuple(bundle.sizes)
        self.input_rows = plan.rows_of(self.comm.rank, 0)
        self.traffic, self.timers = Traffic.zeros(n), Timers(n)
        self.ghost_rows = [0] * n
        self.shapes: list[LayerShape] = []
        self.fingerprint: str | None = None
        self.cap: float | None = bundle.meta["cap"]
        self.predicted: MemoryPrediction | None = None  # of the largest block, with the store
        self.held: dict[str, int] | None = None
        self.store_peak = self.spilled = 0
        self.load_seconds = 0.0

    def max_bias(self) -> float:
        """The largest bias of the network (0 when none is positive), read one layer at a
        time on world rank 0. Collective."""
        world = self.grid.world

        def top() -> float:
            return max((float(self.bundle.bias(k).max(initial=0))
                        for k in range(1, self.bundle.n_layers + 1)), default=0.0)

        return float(world.bcast(world.check(lambda: top() if world.rank == 0 else None)))

    def run(self, n_chunks: int, first: Callable[[int], np.ndarray],
            finish: Callable[[int, np.ndarray, DistributedNetwork, Forward], None], *,
            drop_dead: bool = False) -> float:
        """Every chunk through every block: ``first(c)`` gives chunk c's input rows (mine x
        width); ``finish(c, ids, dnet, fwd)`` takes its last block's output for the samples
        ``ids`` of the chunk. ``drop_dead``: as ``DistributedNetwork.forward``, and samples
        dead at a block's end are dropped (no bias may be positive). Returns the seconds of
        the passes (reading the blocks not included: ``load_seconds``). Collective."""
        world = self.grid.world
        fp = Fingerprint(self.sizes) if world.rank == 0 else None
        store = BoundaryStore(self.stream.allowance, self.scratch)
        seconds = 0.0
        try:
            for first_layer, last_layer in self.stream.blocks:
                t0 = time.perf_counter()
                world.check(self.bundle.check_unchanged)
                dnet = DistributedNetwork.load(self.bundle, self.plan, self.grid, self.dtype,
                                               layers=(first_layer, last_layer),
                                               fingerprint=fp)
                dnet.set_exchange(self.exchange)
                world.barrier()
                t1 = time.perf_counter()
                self.load_seconds += t1 - t0
                final = last_layer == len(self.sizes) - 1
                for c in range(n_chunks):
                    if first_layer == 1:
                        x0 = first(c)
                        ids = np.arange(x0.shape[1])
                    else:
                        chunk = store.take(c)
                        if chunk is None:  # every sample of it died
                            continue
                        x0, ids = chunk.dense(), chunk.ids
                    fwd = dnet.forward(x0, keep=False, drop_dead=drop_dead)
                    ids = ids[fwd.ids]
                    if final:
                        finish(c, ids, dnet, fwd)
                        continue
                    act = dnet.activation(dnet.n_layers - 1).apply(fwd.z_last)
                    if drop_dead:
                        alive = self.comm.allreduce(np.any(act != 0, axis=0).astype(np.int32),
                                                    "max") > 0
                        if not alive.all():
                            act, ids = act[:, alive], ids[alive]
                        if not len(ids):
                            continue
                    store.put(c, Chunk.of(ids, act))
                world.barrier()
                seconds += time.perf_counter() - t1
                self._account(dnet, first_layer, store)
                del dnet
                gc.collect()
        finally:
            self.spilled = store.spilled_bytes
            store.close()
        self.fingerprint = world.bcast(fp.hexdigest() if fp is not None else None)
        world.check(lambda: self.plan.check_for(self.sizes, self.fingerprint, self.plan_source))
        return float(self.grid.world.allreduce_scalar(seconds, "max"))

    def _account(self, dnet: DistributedNetwork, first_layer: int, store: BoundaryStore) -> None:
        off = first_layer - 1
        _place(self.traffic, dnet.traffic, off)
        _place(self.timers, dnet.timers, off)
        for i, layer in enumerate(dnet.layers):
            self.ghost_rows[off + i] = layer.exchange.n_ghost
        block_shapes = memory_report.shapes(dnet)
        self.shapes.extend(block_shapes)
        self.store_peak = max(self.store_peak, store.peak)
        pred = _block(block_shapes, self.dtype.itemsize, self.stream.challenge, store.peak)
        if self.predicted is None or pred.total > self.predicted.total:
            self.predicted, self.held = pred, memory_report.held(dnet)

    def memory_report(self, data: list[Any]) -> dict[str, Any]:  # noqa: ANN401
        """``spdnn.runtime.memory_report.report``'s record for the streamed job (the largest block's
        prediction and holdings, the store's peak counted as data). Collective."""
        assert self.predicted is not None and self.held is not None
        data_bytes = memory_report.data_nbytes(data) + self.store_peak
        pred = self.predicted.as_dict() | {"data": data_bytes}
        pred["total"] = sum(pred[k] for k in ("weights", "training", "buffers", "data",
                                              "baseline"))
        held = self.held | {"data": data_bytes}
        every = self.grid.world.allgather(
            (memory_report.peak_bytes(self.grid.world.node_size()), pred, held))
        return {"peak_bytes": [e[0] for e in every], "predicted_bytes": [e[1] for e in every],
                "held_bytes": [e[2] for e in every], "stream": {
                    "blocks": [list(b) for b in self.stream.blocks],
                    "spilled_bytes": self.grid.world.allgather(self.spilled)}}
