"""Inference on a layer-streamed network (``spdnn.runtime.layer_stream.LayerStream``): accuracy
and P@k on a data set, and the Graph Challenge categories, as ``spdnn.runtime.inference``
computes them in memory, chunk for chunk."""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from spdnn.comm.mpi import Communicator
from spdnn.io.images import ImageShare
from spdnn.model.batching import columns
from spdnn.model.labels import MultiLabels
from spdnn.model.memory import eval_batch
from spdnn.model.ops import activate
from spdnn.model.reports import ChallengeResult
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.inference import challenge_chunk, my_images
from spdnn.runtime.layer_stream import LayerStream
from spdnn.runtime.workspace import Forward


def stream_scores(stream: LayerStream, x_local: np.ndarray | sp.csr_matrix,
                  y: np.ndarray | MultiLabels, *, shared: bool = False
                  ) -> tuple[float, float | None]:
    """Accuracy (P@5 None), or P@1 and P@5 on label sets, as ``evaluate`` and ``precisions``
    give them; replicas take contiguous shares of the samples (``shared``: x_local holds
    only this replica's). Collective."""
    grid = stream.grid
    batch = int(grid.model.allreduce_scalar(eval_batch(stream.planned, stream.dtype.itemsize),
                                            "min"))
    share = grid.share(len(y))
    x_mine, y_mine = (x_local if shared else x_local[share]), y[share]
    multi = isinstance(y, MultiLabels)
    hits = np.zeros(2)

    def first(c: int) -> np.ndarray:
        return columns(x_mine, slice(c * batch, (c + 1) * batch))

    def finish(c: int, ids: np.ndarray, dnet: DistributedNetwork, fwd: Forward) -> None:
        labels = y_mine[c * batch:(c + 1) * batch]
        out = dnet.output(fwd.z_last)
        if multi:
            top = dnet.top_k(out, 5)
            hits[:] += [labels.hits(top[:, :1]).sum(), labels.hits(top).sum()]
        else:
            hits[0] += int(np.sum(dnet.predict_classes(out) == labels))

    stream.run(math.ceil(len(y_mine) / batch), first, finish)
    if grid.replicas > 1:
        hits[:] = grid.data.allreduce(hits)
    n = len(y)
    if not n:
        return float("nan"), (float("nan") if multi else None)
    return (hits[0] / n, hits[1] / (5 * n)) if multi else (hits[0] / n, None)


def stream_challenge(comm: Communicator, stream: LayerStream,
                     images: sp.csr_matrix | ImageShare, edges: int) -> ChallengeResult:
    """``challenge_infer`` block by block: the same chunks, the same dropping of dead samples
    (when no bias of the network is positive), the same categories. The time is that of the
    passes; reading the blocks is ``stream.load_seconds``. Collective."""
    grid = stream.grid
    images, mine = my_images(grid, images, stream.input_rows, stream.dtype)
    widest = max(max(s.buffer_rows, s.rows) for s in stream.planned)
    chunk = challenge_chunk(comm, widest, stream.dtype)
    can_drop = stream.max_bias() <= 0
    found: list[np.ndarray] = []
    cap = stream.cap

    def first(c: int) -> np.ndarray:
        return mine[c * chunk:(c + 1) * chunk].T.tocsr().toarray()  # C order: rows features

    def finish(c: int, ids: np.ndarray, dnet: DistributedNetwork, fwd: Forward) -> None:
        last = activate(fwd.z_last.copy(), cap)
        final = dnet.comm.allreduce(np.any(last != 0, axis=0).astype(np.int32), "max") > 0
        found.append(ids[final] + c * chunk)

    seconds = stream.run(math.ceil(max(mine.shape[0], 1) / chunk), first, finish,
                         drop_dead=can_drop)
    hits = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    hits = hits.astype(np.int64) + images.first + 1
    if grid.replicas > 1:
        hits = np.concatenate(grid.data.allgather(hits))
    return ChallengeResult(np.sort(hits), seconds, images.total, edges)
