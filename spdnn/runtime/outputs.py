"""The output layer spread over the ranks of a replica: prediction, top-k, losses.

Each rank holds the output rows ``rows`` (global ids, ascending) of a block (rows x batch);
only per-sample vectors (maxima, sums, targets) and, for top-k, k candidates per sample travel.
The results equal the serial ``ops`` functions on the whole block (ties: the lower row first).
"""

from __future__ import annotations

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.kernels import softmax
from spdnn.model.activations import Activation
from spdnn.model.labels import MultiLabels, is_targets
from spdnn.model.ops import check_targets, output, top_rows


def global_max(comm: Communicator, out: np.ndarray) -> np.ndarray:
    local = out.max(axis=0) if len(out) else np.full(out.shape[1], -np.inf, out.dtype)
    return comm.allreduce(local, "max")


def predict_classes(comm: Communicator, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Global argmax over the distributed output rows (first index among ties)."""
    gmax = global_max(comm, out)
    none = np.iinfo(np.int64).max
    cand = np.where(out == gmax[None, :], rows[:, None], none)
    local_arg = cand.min(axis=0) if len(out) else np.full(out.shape[1], none)
    return comm.allreduce(local_arg.astype(np.int64), "min")


def top_k(comm: Communicator, rows: np.ndarray, out: np.ndarray, k: int,
          n_out: int) -> np.ndarray:
    """The k largest outputs' global rows per sample (samples x k), best first: each rank's
    own k best, gathered, merged."""
    k = min(k, n_out)
    batch = out.shape[1]
    mine = min(k, len(rows))
    order = top_rows(out, mine)  # rows ascend: ties by id
    values = np.take_along_axis(out, order, axis=0).T
    ids = rows[order].T
    parts = comm.allgather((values, ids)) if comm.size > 1 else [(values, ids)]
    values = np.concatenate([p[0] for p in parts], axis=1)
    ids = np.concatenate([p[1] for p in parts], axis=1)
    pick = np.lexsort((ids, -values), axis=1)[:, :k] if batch else \
        np.zeros((0, k), dtype=np.int64)
    return np.take_along_axis(ids, pick, axis=1).astype(np.int64)


def loss_and_gradient(comm: Communicator, rows: np.ndarray, n_out: int, out: np.ndarray,
                      y: np.ndarray | MultiLabels, loss: str, scale: int,
                      sample_losses: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """As ``ops.loss_and_gradient`` with the mean over ``scale`` samples (the whole minibatch,
    of which ``out`` holds this replica's columns); each sample's loss into ``sample_losses``
    when given."""
    check_targets(y, loss)
    batch = out.shape[1]
    local = np.full(n_out, -1, dtype=np.int64)
    local[rows] = np.arange(len(rows))
    if isinstance(y, MultiLabels):
        lab, smp = y.indices, y.samples()
        mine = local[lab] >= 0  # the label rows this rank holds
        r, c, w = local[lab[mine]], smp[mine], y.weights(out.dtype)[mine]
        shifted = out - global_max(comm, out)[None, :]
        expo = np.exp(shifted)
        packed = np.zeros((2, batch), dtype=out.dtype)
        packed[0] = expo.sum(axis=0)
        packed[1] = np.bincount(c, weights=w * shifted[r, c], minlength=batch)
        total, target = comm.allreduce(packed)
        has = y.counts > 0
        grad = expo / total[None, :]
        grad[r, c] -= w
        grad[:, ~has] = 0
        per_sample = np.where(has, np.log(total) - target, 0.0)
        if sample_losses is not None:
            sample_losses[:] = per_sample
        return float(np.sum(per_sample)) / scale, grad / scale
    # the samples whose label row is mine (real-valued targets have no label row)
    cols = None if is_targets(y) else np.flatnonzero(local[y] >= 0)
    if loss == "cross_entropy":
        shifted = out - global_max(comm, out)[None, :]
        expo = np.exp(shifted)
        packed = np.zeros((2, batch), dtype=out.dtype)
        packed[0] = expo.sum(axis=0)
        packed[1, cols] = shifted[local[y[cols]], cols]
        total, target = comm.allreduce(packed)
        grad = expo / total[None, :]
        grad[local[y[cols]], cols] -= 1
        per_sample = np.log(total) - target
        if sample_losses is not None:
            sample_losses[:] = per_sample
        return float(np.sum(per_sample)) / scale, grad / scale
    if is_targets(y):  # real-valued targets: this rank's outputs' columns of them
        diff = out - y[:, rows].T.astype(out.dtype)
    else:
        diff = out.copy()
        diff[local[y[cols]], cols] -= 1
    n = n_out * scale
    value = comm.allreduce_scalar(float(np.sum(diff.astype(np.float64) ** 2))) / n
    if sample_losses is not None:
        squares = np.sum(diff.astype(np.float64) ** 2, axis=0)
        sample_losses[:] = comm.allreduce(squares) / n_out
    return value, diff * (2.0 / n)


def training_loss(comm: Communicator, rows: np.ndarray, n_out: int, z: np.ndarray,
                  y: np.ndarray | MultiLabels, loss: str, scale: int,
                  sample_losses: np.ndarray | None, h: Activation
                  ) -> tuple[float, int, np.ndarray]:
    """A training step's loss, correct predictions and gradient with respect to ``z`` (this
    rank's rows of the last layer's pre-activation), as ``loss_and_gradient`` and ``correct``.
    Softmax cross-entropy of a linear output (every classifier here) runs as three fused
    passes over ``z`` that leave the gradient in it (``z`` is consumed): the column maxima,
    the exponentials with their sums and the predictions, the scaling; only the label
    entries are touched apart. The other losses keep the passes of ``loss_and_gradient``."""
    if loss != "cross_entropy" or not h.LINEAR:
        out = output(z, h)
        value, grad = loss_and_gradient(comm, rows, n_out, out, y, loss, scale, sample_losses)
        hits = correct(comm, rows, out, y)
        h.backward(grad, z, out)
        return value, hits, grad
    check_targets(y, loss)
    batch = z.shape[1]
    local = np.full(n_out, -1, dtype=np.int64)
    local[rows] = np.arange(len(rows))
    top = comm.allreduce(softmax.column_max(z), "max")
    if isinstance(y, MultiLabels):
        lab, c = y.indices, y.samples()
        mine = local[lab] >= 0  # the label rows this rank holds
        r, c, w = local[lab[mine]], c[mine], y.weights(z.dtype)[mine]
        has = y.counts > 0
    else:
        c = np.flatnonzero(local[y] >= 0)  # samples whose label row is mine
        r, w, has = local[y[c]], np.ones(len(c), z.dtype), None
    packed = np.zeros((2, batch), dtype=z.dtype)
    packed[1] = np.bincount(c, weights=w * (z[r, c] - top[c]), minlength=batch)
    packed[0], first = softmax.exp_columns(z, top)
    none = np.iinfo(np.int64).max  # predictions: the lowest row holding the maximum
    pred = comm.allreduce(np.where(first >= 0, rows[np.maximum(first, 0)], none)
                          if len(rows) else np.full(batch, none), "min")
    hits = int(np.sum(y.contains(pred) if has is not None else pred == y))
    total, target = comm.allreduce(packed)
    per_sample = np.log(total) - target
    factor = (1 / total) / scale
    if has is not None:
        per_sample = np.where(has, per_sample, 0.0)
        factor[~has] = 0
    softmax.scale_columns(z, factor)
    z[r, c] -= w / z.dtype.type(scale)  # label pairs are distinct; a sample with none has none
    if sample_losses is not None:
        sample_losses[:] = per_sample
    return float(np.sum(per_sample)) / scale, hits, z


def correct(comm: Communicator, rows: np.ndarray, out: np.ndarray,
            y: np.ndarray | MultiLabels) -> int:
    """Samples whose top output is (one of) their label(s); none for real targets."""
    if is_targets(y):
        return 0
    pred = predict_classes(comm, rows, out)
    return int(np.sum(y.contains(pred) if isinstance(y, MultiLabels) else pred == y))
