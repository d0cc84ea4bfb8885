"""Kernel tables for the cost model: the three local products timed per nonzero x sample
over reuse x buffer rows x batch, from cold and warm caches, and a RadiX-Net layer against a
random one (structured columns). Part of ``spdnn calibrate``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from spdnn.cost._calibrate_grid import CalibrationGrid
from spdnn.cost.machine import KERNELS, TABLE_KEYS, DenseTable, KernelTable, Structure
from spdnn.kernels import bfloat16
from spdnn.kernels import products as kernels
from spdnn.kernels.transposed import Transposed
from spdnn.model.csr import as_dtype
from spdnn.model.generate import fixed_fan_in

FAN_IN = 32
MAX_UNITS = 2**27  # nonzeros x samples per timed call, at most (time and memory)


def median_time(fn: Callable[[], object], reps: int, min_seconds: float = 0.0,
                 before: Callable[[], object] | None = None) -> float:
    """Median seconds of ``fn`` over ``reps`` calls, or more until ``min_seconds`` are spent
    (a shared machine's noise hits short calls hardest); ``before`` runs untimed before
    each call."""
    fn()  # warm: pages faulted in, code compiled
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - start < min_seconds and len(times) < 1000):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


class _Evict:
    """Writes a buffer larger than the last-level cache: a kernel then starts with cold
    caches, as in a real step, where the other layers' arrays have been through them."""

    def __init__(self, nbytes: int | None = None) -> None:
        self.buf = np.zeros((nbytes or _evict_bytes()) // 8)
        self.tick = 0.0

    def __call__(self) -> None:
        self.tick += 1.0
        self.buf.fill(self.tick)


def _evict_bytes() -> int:
    """1.5x the last-level cache (64 MiB if the CPU reports none), at most 512 MiB: past
    that, writing it would dominate the calibration's time."""
    return int(min(max(1.5 * cache_bytes(), 64 * 2**20), 512 * 2**20))


def _stored(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` as the products read it: its bfloat16 bits (uint16) under bfloat16."""
    return bfloat16.narrow(a.astype(np.float32)) if dtype == "bfloat16" else a.astype(dtype)


def _layer(w: sp.csr_matrix, dtype: str) -> sp.csr_matrix:
    """``w`` with the values the products read (its bfloat16 copy under bfloat16)."""
    if dtype != "bfloat16":
        return w
    return sp.csr_matrix((_stored(w.data, dtype), w.indices, w.indptr), shape=w.shape)


def _kernel_ns(w, x: np.ndarray, d: np.ndarray, reps: int,  # noqa: ANN001
               evict: Callable[[], object], wt: Transposed | None = None) -> list[float]:
    """ns per nonzero x sample of the three products of one layer ``w`` (transpose ``wt``,
    made here when not given) on inputs ``x``, each call after ``evict`` (a no-op: warm
    caches). bfloat16 bits (uint16) in ``w``, ``x`` and ``d`` are summed in float32 and the
    outputs h stored in bfloat16, as a bfloat16 step runs them."""
    rows, b = w.shape[0], x.shape[1]
    dtype = np.float32 if x.dtype == np.uint16 else x.dtype  # what the sums hold
    wt = kernels.transpose(w) if wt is None else wt
    z, h = np.empty((rows, b), dtype), np.empty((rows, b), x.dtype)
    g = np.empty((x.shape[0], b), dtype)
    gw, gb, bias = np.empty(w.nnz, dtype), np.empty(rows, dtype), np.zeros(rows, dtype)
    units = w.nnz * b * 1e-9
    return [median_time(lambda: kernels.spmm_act(w, x, bias, None, z, h), reps, 0.01, evict)
            / units,
            median_time(lambda: kernels.backward_products(wt, w.data, d, x, g, gw), reps, 0.01,
                         evict) / units,
            median_time(lambda: kernels.sddmm(w, d, x, out=gw, bias_grad=gb), reps, 0.01,
                         evict) / units]


def kernel_table(dtype: str, rng: np.random.Generator, grid: CalibrationGrid, reps: int = 3
                 ) -> KernelTable:
    """ns per nonzero x sample of the forward product, the two backward products (one pass)
    and the weight gradient alone (first layer), on random fixed fan-in layers whose nonzeros
    read each of their input rows ``reuse`` times on average; each from cold caches (after
    writing a buffer larger than the last-level cache) and warm (called again and again).
    Cells that would pass ``MAX_UNITS`` per call (the largest buffers at the largest batches
    and reuses) copy the next lower reuse's value: per-nonzero costs fall with reuse, so these
    lean pessimistic."""
    ns = {k: np.zeros((len(grid.reuses), len(grid.inputs), len(grid.batches)))
          for k in TABLE_KEYS}
    evict = _Evict(grid.evict_bytes)  # one buffer for the whole table
    x_all = _stored(rng.random(max(grid.inputs) * max(grid.batches)), dtype)
    d_all = _stored(rng.random(MAX_UNITS // FAN_IN), dtype)
    for r, reuse in enumerate(grid.reuses):
        for j, n_in in enumerate(grid.inputs):
            rows = max(8, reuse * n_in // FAN_IN)
            w = wt = None  # one layer and its transpose for every batch (slow to build)
            for i, b in enumerate(grid.batches):
                if r > 0 and rows * FAN_IN * b > MAX_UNITS:
                    for k in TABLE_KEYS:
                        ns[k][r, j, i] = ns[k][r - 1, j, i]
                    continue
                if w is None:
                    w = _layer(fixed_fan_in(rows, n_in, FAN_IN, rng, as_dtype(dtype)), dtype)
                    wt = kernels.transpose(w)
                x = x_all[: n_in * b].reshape(n_in, b)
                d = d_all[: rows * b].reshape(rows, b)
                cold = _kernel_ns(w, x, d, grid.cold_reps, evict, wt)
                warm = _kernel_ns(w, x, d, reps, lambda: None, wt)
                for k, c, h in zip(KERNELS, cold, warm):
                    ns[k][r, j, i], ns[f"{k}_warm"][r, j, i] = c, h
    return KernelTable(batches=grid.batches, inputs=grid.inputs, reuses=grid.reuses, ns=ns)


# Dense layers (rows x columns): a split and a whole 10-way head, a wide head, a dense
# hidden layer (the grid's dense_shapes); timed at every batch up to DENSE_UNITS per call.
DENSE_UNITS = 2**27


def dense_table(dtype: str, rng: np.random.Generator, grid: CalibrationGrid, reps: int = 3
                ) -> DenseTable:
    """ns per nonzero x sample of the three products of dense layers (warm caches: such
    layers are small or compute-bound; float32 and float64 run BLAS, bfloat16 its dense
    forward kernel from DENSE_ROWS_MIN_BATCH columns and else the gathers);
    cells past ``DENSE_UNITS`` copy the smaller batch."""
    ns = {k: np.zeros((len(grid.dense_shapes), len(grid.batches))) for k in KERNELS}
    for n, (rows, cols) in enumerate(grid.dense_shapes):
        w = _layer(sp.csr_matrix(rng.random((rows, cols)).astype(as_dtype(dtype))), dtype)
        w.sort_indices()
        wt = kernels.transpose(w)
        for i, b in enumerate(grid.batches):
            if i > 0 and rows * cols * b > DENSE_UNITS:
                for k in KERNELS:
                    ns[k][n, i] = ns[k][n, i - 1]
                continue
            x, d = _stored(rng.random((cols, b)), dtype), _stored(rng.random((rows, b)), dtype)
            for k, v in zip(KERNELS, _kernel_ns(w, x, d, reps, lambda: None, wt)):
                ns[k][n, i] = v
    return DenseTable(tuple(r * c for r, c in grid.dense_shapes), grid.batches, ns)


def structure_ratios(dtype: str, rng: np.random.Generator, grid: CalibrationGrid,
                     reps: int = 3) -> Structure:
    """A RadiX-Net layer's kernel times over those of a random layer of its shape (the mean of
    cold and warm caches), per batch size: what the tables, built on random columns, miss on
    layers whose neighbouring rows share columns (``spdnn.cost.workload.locality``)."""
    from spdnn.cost.workload import locality
    from spdnn.model.generate import radixnet

    n = grid.structured
    structured = radixnet(n, 1, seed=0, dtype=dtype).layers[0].weight
    random = fixed_fan_in(n, n, FAN_IN, rng, dtype)
    evict = _Evict(grid.evict_bytes)
    ratio: dict[str, list[float]] = {k: [] for k in KERNELS}
    layers = [(w, kernels.transpose(w)) for w in (structured, random)]
    for b in grid.structure_batches:
        x = rng.random((n, b)).astype(dtype)
        d = rng.random((n, b)).astype(dtype)
        times = [np.add(_kernel_ns(w, x, d, grid.cold_reps, evict, wt),
                        _kernel_ns(w, x, d, reps, lambda: None, wt)) for w, wt in layers]
        for k, r in zip(KERNELS, times[0] / times[1]):
            ratio[k].append(float(r))
    gap = locality([(structured.indptr, structured.indices, structured.shape)])[0]
    return Structure(grid.structure_batches, {k: tuple(v) for k, v in ratio.items()},
                     (float(gap[0]), float(gap[1])))


def cache_bytes() -> int:
    """The largest cache this CPU reports (0 when it reports none)."""
    largest = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = [e for e in os.listdir(base) if e.startswith("index")]
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            largest = max(largest, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return largest
