"""The job behind ``spdnn.predict``: classes (or output scores) of samples held in memory, on
every rank, under any plan and grid."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.io.arrays import matrix
from spdnn.jobs._open import open_job
from spdnn.kernels.loading import load_kernels
from spdnn.model.batching import columns
from spdnn.model.network import Network
from spdnn.model.options import RunOptions
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.inference import eval_batch


def _scores(dnet: DistributedNetwork, out: np.ndarray) -> np.ndarray:
    """Every output row of a batch (outputs x B), from the model parts that own them."""
    full = np.empty((dnet.sizes[-1], out.shape[1]), dtype=out.dtype)
    for rows, part in dnet.comm.allgather((dnet.layers[-1].rows, out)):
        full[rows] = part
    return full


def run_prediction(comm: Communicator, network: str | os.PathLike | Network, inputs: Any,  # noqa: ANN401
                   run: RunOptions, scores: bool) -> np.ndarray:
    """Collective. Each replica computes its contiguous share of the samples in batches; the
    shares are then gathered, so every rank returns the whole result in sample order."""
    job = open_job(comm, network, run, 1)
    dnet = job.dnet
    n_in = job.bundle.sizes[0]

    def read() -> Any:  # noqa: ANN401
        return matrix(inputs, "inputs", run.dtype, dnet.input_rows, n_in)[0]

    x_local = comm.check(read)
    shapes = comm.allgather(x_local.shape[0])
    if any(n != shapes[0] for n in shapes):
        comm.agree("inputs in memory differ between ranks (in their number of samples): every "
                   "rank must pass the same array")
    load_kernels(dnet.dtype, bfloat16=dnet.bfloat16)
    grid = dnet.grid
    mine = x_local[grid.share(x_local.shape[0])]
    batch = eval_batch(dnet)
    parts = []
    for start in range(0, mine.shape[0], batch):
        fwd = dnet.forward(columns(mine, slice(start, start + batch)), keep=False)
        out = dnet.output(fwd.z_last)
        parts.append(_scores(dnet, out).T if scores else dnet.predict_classes(out))
    width = (0, dnet.sizes[-1]) if scores else (0,)
    result = np.concatenate(parts) if parts else \
        np.empty(width, dtype=dnet.dtype if scores else np.int64)
    if grid.replicas > 1:
        result = np.concatenate(grid.data.allgather(result))
    return result
