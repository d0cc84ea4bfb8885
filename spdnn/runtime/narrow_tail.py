"""The narrow end of an inference pass in one kernel call (spdnn.kernels.layers): once the
live batch is a few samples wide and this replica is one rank (nothing to exchange), the
remaining layers run without a Python round each. The timers share the call's time among its
layers in proportion to nnz x width."""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from spdnn.kernels.layers import LayerRun
from spdnn.runtime.accounting import Timers
from spdnn.runtime.workspace import PingPong


class _Network(Protocol):  # spdnn.runtime.distributed.DistributedNetwork, which imports this
    layers: list
    timers: Timers
    cap: float | None
    layer_run: Any


def layer_run(dnet: _Network) -> LayerRun | None:
    """The layers' typed lists, built on first use (None: the pass stays in Python)."""
    if dnet.layer_run is False:
        dnet.layer_run = LayerRun.of([lay.product_weight for lay in dnet.layers],
                                     [lay.bias for lay in dnet.layers],
                                     [lay.n_buffer_rows for lay in dnet.layers])
    return dnet.layer_run


def narrow_tail(run: LayerRun, dnet: _Network, first: int, pp: PingPong, cur: int,
                width: int, ids: np.ndarray, compact_below: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Layers first.. on X_first in pp.x[cur] (width columns, samples ``ids``): Z_L's rows
    and the samples that reach it."""
    t0 = time.perf_counter()
    width, work = run.narrow(first, dnet.cap, compact_below, pp.x, cur, pp.z, width, ids)
    seconds = time.perf_counter() - t0
    total = float(work.sum())
    for k in np.flatnonzero(work):
        dnet.timers.add("forward", int(k), compute=seconds * float(work[k]) / total)
    n_last = len(dnet.layers[-1].rows)
    return pp.z[: n_last * width].reshape(n_last, width), ids[:width]
