"""Layer-by-layer partitioning: each layer solved by a backend with the previous layer fixed."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from spdnn.errors import SpdnnError
from spdnn.kernels.ranges import concat_ranges

from .backends import Problem, solve
from .hypergraph import Hypergraph
from .time_budget import NO_DEADLINE, Deadline, Log, OutOfTime, Progress, duration


class Skipped(Exception):
    """A start given up because it cannot win; the message says why."""


def layer_by_layer(hg: Hypergraph, nparts: int, epsilon: float, seed: int,
                   backend: str | Sequence[str],
                   log: Log | None = None, threads: int = 1, deadline: Deadline = NO_DEADLINE,
                   name: str | None = None,
                   probe: Callable[[np.ndarray], str | None] | None = None,
                   fixed_inputs: np.ndarray | None = None) -> np.ndarray:
    """Partition layer k with layer k-1 fixed to its blocks (layer 0 free with layer 1, or
    fixed to ``fixed_inputs``: the blocks a window before chose, partition/windows.py).
    ``backend``: one for all layers, or one per layer. Raises OutOfTime when ``deadline``
    passes first, and Skipped when ``probe``, shown the blocks of layers 0 and 1, gives a
    reason to stop there."""
    backends = [backend] * hg.n_layers if isinstance(backend, str) else list(backend)
    parts = np.full(hg.n_vertices, -1, dtype=np.int64)
    if fixed_inputs is not None:
        parts[: hg.offsets[1]] = fixed_inputs
    net_layer = hg.net_layer
    n_layers = hg.n_layers
    layer_pins = np.bincount(net_layer, weights=np.diff(hg.net_indptr), minlength=n_layers)
    progress = Progress(name or "layer-by-layer start", float(layer_pins.sum()), log)
    for k in range(1, n_layers + 1):
        where = f"stopped before layer {k}/{n_layers}"
        deadline.check(where)
        lo, mid, hi = hg.offsets[k - 1], hg.offsets[k], hg.offsets[k + 1]
        nets = np.flatnonzero(net_layer == k - 1)
        starts, stops = hg.net_indptr[nets], hg.net_indptr[nets + 1]
        sizes = stops - starts
        keep = sizes >= 2
        nets, starts, sizes = nets[keep], starts[keep], sizes[keep]
        pins = hg.net_pins[concat_ranges(starts, sizes)] - lo
        indptr = np.concatenate([[0], np.cumsum(sizes)])
        vw = hg.vertex_weights[lo:hi].copy()
        # Layer k-1 is fixed (or, for k = 1, the work-free input layer): weight 1, the least
        # KaHyPar accepts, so that it barely moves the balance of layer k.
        vw[: mid - lo] = 1
        fixed = None
        if k > 1 or fixed_inputs is not None:
            fixed = np.full(hi - lo, -1, dtype=np.int32)
            fixed[: mid - lo] = parts[lo:mid]
        if len(nets) == 0:
            block = np.arange(hi - lo) % nparts
        else:
            problem = Problem(n_vertices=int(hi - lo), net_indptr=indptr.astype(np.int64),
                              net_pins=pins.astype(np.int64),
                              vertex_weights=np.maximum(vw, 1), net_weights=hg.net_weights[nets],
                                  nparts=nparts, epsilon=epsilon,
                              seed=seed + k, fixed=fixed)
            try:
                block = solve(problem, backends[k - 1], timeout=deadline.left(),
                              threads=threads if backends[k - 1] == "mtkahypar" else 1)
            except SpdnnError:
                if deadline.passed():  # the solve was stopped by the time limit
                    raise OutOfTime(f"{where} (in it)") from None
                raise
        parts[lo:hi] = np.where(parts[lo:hi] >= 0, parts[lo:hi], block)
        progress.advance(layer_pins[k - 1], f"layer {k}/{n_layers} done")
        # A run that will not finish in time gives its worker to the next start: after 3
        # layers, when it needs more than twice the time left at its pace so far.
        left, eta = deadline.left(), progress.eta()
        if left is not None and eta is not None and k >= 3 and k < n_layers and eta > 2 * left:
            raise OutOfTime(f"given up after layer {k}/{n_layers}: about {duration(eta)} more "
                            f"needed, {duration(left)} left")
        if k == 1 and probe is not None and n_layers > 1 and (why := probe(parts)):
            raise Skipped(why)
    return parts


def majority(coarse_of: np.ndarray, parts: np.ndarray, n_coarse: int, nparts: int
             ) -> np.ndarray:
    """Each coarse vertex takes the block most of its fine vertices are in."""
    counts = np.bincount(coarse_of * nparts + parts, minlength=n_coarse * nparts)
    return counts.reshape(n_coarse, nparts).argmax(axis=1)
