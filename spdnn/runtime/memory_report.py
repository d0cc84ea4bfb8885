"""Each rank's memory at the end of a job: its measured peak resident set, what it held (by the
arrays' own sizes) and what ``spdnn.model.memory`` predicts for its shapes, gathered for the
summary line and ``--metrics-out`` (docs/memory.md)."""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.kernels import products
from spdnn.model.memory import LayerShape, format_bytes, predict
from spdnn.runtime.distributed import DistributedNetwork

_KIND = ("weights", "training", "buffers", "data")


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
                        training=training, data_bytes=mine_held["data"],
                        challenge=challenge,
                        lsh_tables=dnet.sampled.spec.tables if dnet.sampled else 0,
                        lsh_layer=dnet.sampled.index if dnet.sampled else -1,
                        numba=products.backend() == "numba",
                        optimizer_arrays=optimizer_arrays, dropout=dropout).as_dict()
    every = comm.allgather((peak_rss(), mine_pred, mine_held))
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
