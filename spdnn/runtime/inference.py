"""Distributed inference: classification accuracy, and the Graph Challenge mode (categories
and the official rate), both on ``DistributedNetwork.forward``."""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from spdnn.comm.mpi import Communicator
from spdnn.errors import InputError
from spdnn.io.images import ImageShare
from spdnn.model.batching import columns
from spdnn.model.labels import MultiLabels
from spdnn.model.memory import (
    CHALLENGE_BLOCK_BYTES,
    CHALLENGE_MIN_CHUNK,
    EVAL_BATCH,
    EVAL_BLOCK_BYTES,
)
from spdnn.model.ops import activate
from spdnn.model.reports import ChallengeResult
from spdnn.runtime import lsh_output
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.grid import Grid

# Graph Challenge chunks (CHALLENGE_BLOCK_BYTES, CHALLENGE_MIN_CHUNK) and evaluation batches
# (EVAL_BATCH, EVAL_BLOCK_BYTES): spdnn.model.memory, which predicts them.
# A sample's outputs do not depend on its batch, so the accuracy is the same at any width.


def eval_batch(dnet: DistributedNetwork) -> int:
    """The evaluation batch of this network on these ranks (the same on the ranks of a
    replica: the smallest of theirs). Collective over the replica."""
    widest = max(max(layer.n_buffer_rows, len(layer.rows)) for layer in dnet.layers)
    # a rank that owns no neuron is a valid rank: it takes the others' width
    mine = max(1, min(EVAL_BATCH,
                      EVAL_BLOCK_BYTES // (3 * max(widest, 1) * dnet.dtype.itemsize)))
    return int(dnet.comm.allreduce_scalar(mine, "min"))


def local_inputs(dnet: DistributedNetwork, x: np.ndarray | sp.csr_matrix,
                 source: str, features: np.ndarray | None = None) -> np.ndarray | sp.csr_matrix:
    """This rank's feature columns of a (samples x features) array, C-contiguous (or CSR, for
    sparse data: batches are made dense one at a time). ``features``: the columns ``x``
    holds, when it was read with only those (``Dataset.features``)."""
    if features is not None:
        if not np.array_equal(features, dnet.input_rows):
            raise ValueError("the data's columns are not this rank's inputs")
        if sp.issparse(x):
            return sp.csr_matrix(x, dtype=dnet.dtype)
        return np.ascontiguousarray(x, dtype=dnet.dtype)
    if x.shape[1] != dnet.sizes[0]:
        raise InputError(source, f"data has {x.shape[1]} features but the network's layer 0 "
                                 f"has {dnet.sizes[0]} neurons")
    rows = dnet.input_rows
    if len(rows) == x.shape[1] and np.array_equal(rows, np.arange(len(rows))):
        # every column, in order: x itself where it already is what the passes read (not a
        # second copy of the data)
        if sp.issparse(x):
            return x if x.format == "csr" and x.dtype == dnet.dtype else \
                sp.csr_matrix(x, dtype=dnet.dtype)
        return np.ascontiguousarray(x, dtype=dnet.dtype)
    if sp.issparse(x):
        return sp.csr_matrix(x[:, rows], dtype=dnet.dtype)
    return np.ascontiguousarray(x[:, rows], dtype=dnet.dtype)


def evaluate(dnet: DistributedNetwork, x_local: np.ndarray | sp.csr_matrix,
             y: np.ndarray | MultiLabels, batch_size: int | None = None, *,
             shared: bool = False) -> float:
    """Accuracy on samples whose features ``x_local`` (samples x my features) this rank owns;
    replicas take contiguous shares of the samples (``shared``: x_local holds only this
    replica's share already). Label sets: P@1 (``precisions``). ``batch_size``: default
    ``eval_batch``."""
    if isinstance(y, MultiLabels):
        return precisions(dnet, x_local, y, batch_size, shared=shared)[0]
    batch_size = batch_size or eval_batch(dnet)
    grid = dnet.grid
    share = grid.share(len(y))
    x_local, y_mine = (x_local if shared else x_local[share]), y[share]
    correct = 0
    for start in range(0, len(y_mine), batch_size):
        fwd = dnet.forward(columns(x_local, slice(start, start + batch_size)), keep=False)
        pred = dnet.predict_classes(dnet.output(fwd.z_last))
        correct += int(np.sum(pred == y_mine[start:start + batch_size]))
    if grid.replicas > 1:
        correct = int(grid.data.allreduce_scalar(correct))
    return correct / len(y) if len(y) else float("nan")


def evaluate_loss(dnet: DistributedNetwork, x_local: np.ndarray | sp.csr_matrix,
                  y: np.ndarray, loss: str, batch_size: int | None = None
                  ) -> tuple[float, float]:
    """The mean loss (as training computes it) and the accuracy on samples whose features
    ``x_local`` (every sample, this rank's features) this rank owns; replicas take
    contiguous shares of the samples, as ``evaluate``."""
    from spdnn.runtime.outputs import training_loss

    batch_size = batch_size or eval_batch(dnet)
    grid = dnet.grid
    share = grid.share(len(y))
    x_mine, y_mine = x_local[share], y[share]
    total = np.zeros(2)
    last = dnet.layers[-1]
    for start in range(0, len(y_mine), batch_size):
        block = y_mine[start:start + batch_size]
        fwd = dnet.forward(columns(x_mine, slice(start, start + batch_size)), keep=False)
        value, hits, _ = training_loss(dnet.comm, last.rows, dnet.sizes[-1], fwd.z_last,
                                       block, loss, len(block), None, dnet.output_function)
        total += [value * len(block), hits]
    if grid.replicas > 1:
        total = grid.data.allreduce(total)
    n = max(len(y), 1)
    return float(total[0] / n), float(total[1] / n)


def precisions(dnet: DistributedNetwork, x_local: np.ndarray | sp.csr_matrix, y: MultiLabels,
               batch_size: int | None = None, sampled: bool = False, *,
               shared: bool = False) -> tuple[float, float]:
    """P@1 and P@5 on label sets (as ``evaluate``); ``sampled``: among the outputs that the
    LSH tables retrieve (``dnet.sampled``), the others count as misses."""
    batch_size = batch_size or eval_batch(dnet)
    grid = dnet.grid
    share = grid.share(len(y))
    x_local, y_mine = (x_local if shared else x_local[share]), y[share]
    hits = np.zeros(2)
    for start in range(0, len(y_mine), batch_size):
        fwd = dnet.forward(columns(x_local, slice(start, start + batch_size)), keep=False,
                           sampled=sampled)
        top = lsh_output.top_k(dnet.sampled, 5) if sampled and dnet.sampled.output else \
            dnet.top_k(dnet.output(fwd.z_last), 5)
        labels = y_mine[start:start + batch_size]
        hits += [labels.hits(top[:, :1]).sum(), labels.hits(top).sum()]
    if grid.replicas > 1:
        hits = grid.data.allreduce(hits)
    n = len(y)
    return (hits[0] / n, hits[1] / (5 * n)) if n else (float("nan"), float("nan"))


def my_images(grid: Grid, images: sp.csr_matrix | ImageShare, input_rows: np.ndarray,
              dtype: np.dtype) -> tuple[ImageShare, sp.csr_matrix]:
    """This replica's share of the images and my feature columns of it, in ``dtype`` (no copy
    when ``read_image_share`` already read only those, in that dtype)."""
    if not isinstance(images, ImageShare):
        share = grid.share(images.shape[0])
        images = ImageShare(images[share], share.start, images.shape[0])
    mine = images.matrix  # rows first: the column selection then copies only this share
    if images.features is not None:
        if not np.array_equal(images.features, input_rows):
            raise ValueError("the images' columns are not this rank's inputs")
    elif not np.array_equal(input_rows, np.arange(mine.shape[1])):
        mine = mine[:, input_rows]
    return images, sp.csr_matrix(mine.astype(dtype, copy=False))


def challenge_chunk(comm: Communicator, widest: int, dtype: np.dtype) -> int:
    """Inputs per chunk for this rank's widest block of rows; every rank takes the smallest.
    Collective."""
    mine = max(CHALLENGE_MIN_CHUNK, CHALLENGE_BLOCK_BYTES // (widest * np.dtype(dtype).itemsize))
    return int(comm.allreduce_scalar(mine, "min"))


def challenge_infer(comm: Communicator, dnet: DistributedNetwork,
                    images: sp.csr_matrix | ImageShare, edges: int,
                    chunk: int | None = None) -> ChallengeResult:
    """Graph Challenge inference: the hidden activation and cap on every layer; when no bias is
    positive, samples whose activation column died are dropped on every rank alike. Replicas
    take contiguous shares of the inputs; the categories come back in input order.

    Inputs go through in chunks of ``chunk`` samples (default: as many as keep one dense
    activation block near CHALLENGE_BLOCK_BYTES), so memory stays bounded at any input count
    and a chunk's activations stay in cache; the time includes making each chunk dense.
    ``images``: every image, or this rank's share as ``read_image_share`` read it with
    ``dnet.grid.share``."""
    images, mine = my_images(dnet.grid, images, dnet.input_rows, dnet.dtype)
    if chunk is None:  # from this rank's widest block; every rank takes the smallest chunk
        widest = max(max(layer.n_buffer_rows, len(layer.rows)) for layer in dnet.layers)
        chunk = challenge_chunk(comm, widest, dnet.dtype)
    top_bias = max((float(lay.bias.max(initial=0)) for lay in dnet.layers), default=0.0)
    can_drop = comm.allreduce_scalar(top_bias, "max") <= 0
    found = []
    comm.barrier()
    t0 = time.perf_counter()
    for start in range(0, max(mine.shape[0], 1), chunk):
        x0 = mine[start:start + chunk].T.tocsr().toarray()  # C order: rows are features
        fwd = dnet.forward(x0, keep=False, drop_dead=can_drop)
        last = activate(fwd.z_last.copy(), dnet.cap)
        final = dnet.comm.allreduce(np.any(last != 0, axis=0).astype(np.int32), "max") > 0
        found.append(fwd.ids[final] + start)
    seconds = comm.allreduce_scalar(time.perf_counter() - t0, "max")
    found = np.concatenate(found) + images.first + 1
    if dnet.grid.replicas > 1:
        found = np.concatenate(dnet.grid.data.allgather(found))
    return ChallengeResult(np.sort(found), seconds, images.total, edges)
