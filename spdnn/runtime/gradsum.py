"""The sum of each layer's gradients over the replicas (the data communicator), started as
soon as the layer's gradient is complete and finished after the backward pass.

Exact (the default): a non-blocking all-reduce per array. Compressed (``--compress``): each
rank's compressor (spdnn.lossy.compress, with error feedback) picks (position, value) pairs; every
replica gathers all of them and adds them, replica by replica, into zeroed gradients, so every
replica applies the same update, bit for bit. ``--compress hylo`` (spdnn.lossy.hylo) gathers
each replica's 2-bit codes and scale instead and adds them in the same order. Layers with
fewer values than ``CompressSpec.min_values`` are summed exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from spdnn.comm.mpi import Communicator, Request
from spdnn.lossy import hylo
from spdnn.lossy.compress import Compressor, CompressSpec, warm_up
from spdnn.runtime.accounting import Timers
from spdnn.runtime.halo import Traffic


@dataclass(kw_only=True)
class _Pending:
    layer: int
    requests: list[Request]
    index: np.ndarray | None = None  # compressed: positions and values of every replica
    values: np.ndarray | None = None
    counts: np.ndarray | None = None
    packed: np.ndarray | None = None  # hylo: every replica's message


class GradientSums:
    """One per distributed network; ``compressors[i]`` is layer i's (None: exact)."""

    def __init__(self, data: Communicator, traffic: Traffic, timers: Timers,
                 sizes: list[tuple[int, int]], dtype: np.dtype) -> None:
        self.data, self.traffic, self.timers = data, traffic, timers
        self.sizes, self.dtype = sizes, np.dtype(dtype)
        self.spec = CompressSpec()
        self.compressors: list[Compressor | hylo.HyloCompressor | None] = [None] * len(sizes)
        self.step = 0
        self._pending: list[_Pending] = []

    def set_compression(self, spec: CompressSpec, seed: int, stream: tuple[int, ...]) -> None:
        """Compress the layers ``spec`` applies to; ``stream`` tells this rank's random draws
        apart from the other ranks'."""
        self.spec = spec
        if spec.enabled and self.data.size > 1:
            # load the kernels now, not in the first timed step
            hylo.warm_up() if spec.kind == "hylo" else warm_up()
        self.compressors = [
            None if self.data.size == 1 or not spec.applies(nw + nb) else
            hylo.HyloCompressor(nw + nb, self.dtype) if spec.kind == "hylo" else
            Compressor(spec, nw + nb, self.dtype, seed, (*stream, i))
            for i, (nw, nb) in enumerate(self.sizes)]

    def start(self, i: int, gw: np.ndarray, gb: np.ndarray) -> None:
        """Start summing layer i's gradients (nothing with one replica)."""
        if self.data.size == 1:
            return
        t0 = time.perf_counter()
        comp = self.compressors[i]
        t = self.traffic
        if comp is None:
            self._pending.append(_Pending(layer=i, requests=[self.data.iallreduce_sum(gw),
                                              self.data.iallreduce_sum(gb)]))
            t.grad_values[i] += len(gw) + len(gb)
            t.grad_bytes[i] += (len(gw) + len(gb)) * self.dtype.itemsize
        elif isinstance(comp, hylo.HyloCompressor):
            message, nonzero = comp.pack((gw, gb))
            self.timers.grad_select[i] += time.perf_counter() - t0
            size = self.data.size
            packed = np.empty(size * len(message), dtype=np.uint8)
            self._pending.append(_Pending(layer=i, requests=[self.data.iallgatherv(
                message, packed, np.full(size, len(message), dtype=np.int64))], packed=packed))
            t.grad_values[i] += len(message) / self.dtype.itemsize  # in values' worth of bytes
            t.grad_bytes[i] += len(message)
            t.grad_selected[i] += nonzero
            t.grad_considered[i] += comp.n
        else:
            idx, values = comp.compress((gw, gb), self.step)
            t1 = time.perf_counter()
            self.timers.grad_select[i] += t1 - t0
            small = comp.n < 2**31
            idx = idx.astype(np.int32 if small else np.int64)
            counts = np.array([c for c in self.data.allgather(len(idx))], dtype=np.int64)
            total = int(counts.sum())
            index = np.empty(total, dtype=idx.dtype)
            gathered = np.empty(total, dtype=self.dtype)
            self._pending.append(_Pending(
                layer=i, requests=[self.data.iallgatherv(idx, index, counts),
                    self.data.iallgatherv(values, gathered, counts)], index=index, values=gathered,
                        counts=counts))
            t.grad_values[i] += 2 * len(idx)  # positions travel as values too
            t.grad_bytes[i] += len(idx) * (idx.itemsize + self.dtype.itemsize)
            t.grad_selected[i] += len(idx)
            t.grad_considered[i] += comp.n
        self.timers.grad_post[i] += time.perf_counter() - t0

    def requests(self) -> list[Request]:
        """The sums in flight (to let MPI move them while computing)."""
        return [r for p in self._pending for r in p.requests]

    def finish(self, grad_w: list[np.ndarray], grad_b: list[np.ndarray]) -> None:
        """Wait for every sum started this step, layer by layer (to time each layer's wait);
        compressed layers are rebuilt from the gathered pairs."""
        for p in self._pending:
            t0 = time.perf_counter()
            self.data.waitall(p.requests, f"the gradient sum of layer {p.layer + 1} over the "
                              "replicas")
            gw, gb = grad_w[p.layer], grad_b[p.layer]
            if p.packed is not None or p.index is not None:
                # replica by replica: the same order everywhere
                total = np.zeros(len(gw) + len(gb), dtype=self.dtype)
                if p.packed is not None:
                    hylo.add_messages(p.packed, len(total), total)
                else:
                    start = 0
                    for c in p.counts:
                        seg = slice(start, start + int(c))
                        total[p.index[seg]] += p.values[seg]  # unique within a replica
                        start += int(c)
                gw[:] = total[:len(gw)]
                gb[:] = total[len(gw):]
            self.timers.grad_wait[p.layer] += time.perf_counter() - t0
        self._pending = []
        self.step += 1
