"""Each rank's memory as a scheduler counts it: its private memory plus its share of the
pages the ranks of its node share (the libraries every rank maps, MPI's shared-memory
segments), what it held (by the arrays' own sizes) and what ``spdnn.model.memory`` predicts
for its shapes above its process baseline, which is measured once the kernels are loaded and
before the network's arrays are, gathered for the summary line and ``--metrics-out``
(docs/memory.md). A job's total on a node is what its memory cgroup is charged."""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.kernels.loading import load_kernels
from spdnn.model.memory import LayerShape, format_bytes, predict
from spdnn.runtime.distributed import DistributedNetwork

_KIND = ("weights", "training", "buffers", "data")
_baseline: list[int] = []  # this process's, once measured (measure_baseline)


def peak_rss() -> int:
    """This process's peak resident set in bytes, what ``/usr/bin/time -f %M`` reports: Linux's
    ``VmHWM``, else ``ru_maxrss`` (kB on Linux, bytes on macOS). Not ``ru_maxrss`` on Linux:
    it keeps the resident set of the process it was forked from (a large parent made a small
    job report the parent's peak)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def resident() -> tuple[int, int]:
    """This process's resident bytes now: (private, shared with other processes), from
    Linux's ``/proc/self/smaps_rollup``; elsewhere the peak resident set as private."""
    found = dict.fromkeys(("Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty"), 0)
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in found:
                    found[key] = int(value.split()[0]) * 1024
    except OSError:
        return peak_rss(), 0
    return (found["Private_Clean"] + found["Private_Dirty"],
            found["Shared_Clean"] + found["Shared_Dirty"])


def share_now(node_ranks: int) -> int:
    """This rank's bytes now: its private pages and 1/``node_ranks`` of its shared ones (the
    ranks of a node map the same libraries and MPI segments). Counted by the job's ranks, not
    by whoever else maps them, so the figure does not move with other processes."""
    private, shared = resident()
    return private + shared // max(1, node_ranks)


def peak_bytes(node_ranks: int) -> int:
    """This rank's peak as a scheduler counts it: its peak resident set less the part of its
    shared pages that the other ranks of its node are counted for (its shared pages as now:
    libraries and MPI's segments are mapped from the start and stay)."""
    shared = resident()[1]
    return peak_rss() - shared + shared // max(1, node_ranks)


def measure_baseline(dtype: Any = "float32", *, node_ranks: int = 1,  # noqa: ANN401
                     training: bool = False) -> int:
    """This process's own bytes, kept for its predictions: ``share_now`` once the job's
    kernels are loaded (loaded here: interpreter, numpy, scipy, MPI, numba and the kernels,
    and whatever the calling process already holds). A job measures it once its inputs are
    checked and before it allocates anything sized by them."""
    half = isinstance(dtype, str) and dtype == "bfloat16"  # float32 beside the 16-bit kernels
    dtype = "float32" if half else dtype
    load_kernels(dtype, bfloat16=half)
    if training:  # the default optimizer's update; another's loads with its job
        from spdnn.kernels.update import PARALLEL
        from spdnn.model.options import TrainOptions
        from spdnn.optim import load_kernels as load_updates

        load_updates((TrainOptions().optimizer,), (np.dtype(dtype).type,), parallel=PARALLEL)
    _baseline[:] = [share_now(node_ranks)]
    return _baseline[0]


def baseline() -> int:
    """The baseline measured by ``measure_baseline`` (measured now, alone, if it never was)."""
    return _baseline[0] if _baseline else measure_baseline()


def shapes(dnet: DistributedNetwork) -> list[LayerShape]:
    return [LayerShape(nnz=int(lay.weight.nnz), rows=len(lay.rows), prev_rows=lay.n_owned_prev,
                       ghosts=lay.exchange.n_ghost, sent=lay.exchange.rows_sent)
            for lay in dnet.layers]


def _nbytes(arrays: Iterable[Any]) -> int:
    return int(sum(a.nbytes for a in arrays if isinstance(a, np.ndarray)))


def held(dnet: DistributedNetwork, optimizer: Iterable[Any] = (),
         data: Iterable[Any] = ()) -> dict[str, int]:
    """Bytes of the arrays this rank holds now, by kind: weights (values, indices, maps),
    training state (transposes, gradients, ``optimizer``'s buffers), buffers (activation
    blocks and messages) and ``data`` (arrays or sparse matrices)."""
    weights = sum(lay.nbytes()["weights"] for lay in dnet.layers)
    tables = dnet.sampled.tables if dnet.sampled is not None else None
    if tables is not None:  # LSH: an index of the output layer's rows
        weights += tables.keys.nbytes + tables.rows.nbytes
    training = sum(lay.transposed.nbytes for lay in dnet.layers if lay.has_transpose)
    training += sum(lay.exchange.index_nbytes()["training"] for lay in dnet.layers)
    training += _nbytes(optimizer)
    # the activation blocks (training, inference) and the exchanges' messages (one pool)
    buffers = sum(ws.nbytes() for ws in dnet.workspaces()) + \
        sum(pp.nbytes() for pp in dnet.pingpongs()) + dnet.layers[0].exchange.pool_nbytes()
    for ws in dnet.workspaces():
        training += _nbytes(ws.grad_w) + _nbytes(ws.grad_b)
    if dnet.sampled is not None:  # LSH: the last rebuild's codes, kept for the next, and
        buffers += _nbytes([dnet.sampled.codes])  # the tables' directories
        buffers += tables.starts.nbytes if tables is not None else 0
    return {"weights": int(weights), "training": int(training), "buffers": int(buffers),
            "data": data_nbytes(data)}


def data_nbytes(data: Iterable[Any]) -> int:
    """Bytes of arrays and sparse matrices (None skipped), and counts of bytes (int)."""
    total, seen = 0, set()
    for a in data:
        if isinstance(a, int):
            total += a
            continue
        if a is None or id(a) in seen:  # the same array given twice (a rank's columns that
            continue                      # are the data set's own) is held once
        seen.add(id(a))
        total += a.nbytes if isinstance(a, np.ndarray) else \
            a.data.nbytes + a.indices.nbytes + a.indptr.nbytes
    return int(total)


def report(comm: Communicator, dnet: DistributedNetwork, *, batch: int, training: bool,
           optimizer: Iterable[Any] = (), data: Iterable[Any] = (),
           challenge: bool = False, optimizer_arrays: int = 1,
           dropout: bool = False) -> dict[str, Any]:
    """Per rank (lists in rank order, on every rank): the measured peak, the prediction and
    what was held (``challenge``: of Graph Challenge chunks). Collective."""
    mine_held = held(dnet, optimizer, data)
    mine_pred = predict(shapes(dnet), batch=batch, itemsize=dnet.dtype.itemsize,
                        stored=dnet.stored.itemsize,
                        training=training, data_bytes=mine_held["data"],
                        challenge=challenge,
                        lsh_tables=dnet.sampled.spec.tables if dnet.sampled else 0,
                        lsh_layer=dnet.sampled.index if dnet.sampled else -1,
                        baseline=baseline(),
                        optimizer_arrays=optimizer_arrays, dropout=dropout,
                        relu=dnet.relu_only).as_dict()
    every = comm.allgather((peak_bytes(comm.node_size()), mine_pred, mine_held))
    return {"peak_bytes": [e[0] for e in every], "predicted_bytes": [e[1] for e in every],
            "held_bytes": [e[2] for e in every]}


def format_memory(mem: dict[str, Any]) -> str:
    """One line: the largest rank's measured peak beside its prediction, and what it held."""
    peaks = mem["peak_bytes"]
    r = int(np.argmax(peaks))
    pred, kept = mem["predicted_bytes"][r], mem["held_bytes"][r]
    parts = ", ".join(f"{k} {format_bytes(kept[k])}" for k in _KIND)
    return (f"memory: peak {format_bytes(peaks[r])} on rank {r} (predicted "
            f"{format_bytes(pred['total'])}; of {len(peaks)} rank(s), lowest "
            f"{format_bytes(min(peaks))}); held {parts}, process baseline "
            f"{format_bytes(pred['baseline'])}")
