"""The sampled output layer's softmax and ranking (``--lsh`` on the output layer): the loss
over the active outputs of every rank, and the best active outputs per sample."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from spdnn.kernels.lsh import tail_weights
from spdnn.kernels.softmax import flush_below
from spdnn.model.labels import MultiLabels

if TYPE_CHECKING:
    from spdnn.runtime.lsh_layer import PairBatch, SampledLayer


def _best(s: SampledLayer, b: PairBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: the largest active output over all ranks, its global row (the lowest
    among equals; int64 max when nothing is active) and the pair's sample index."""
    batch, samples = len(b.ptr) - 1, b.samples
    local_max = np.full(batch, -np.inf, dtype=b.z.dtype)
    np.maximum.at(local_max, samples, b.z)
    gmax = s.comm.allreduce(local_max, "max") if s.comm.size > 1 else local_max
    none = np.iinfo(np.int64).max
    cand = np.full(batch, none, dtype=np.int64)
    top = b.z == gmax[samples]
    np.minimum.at(cand, samples[top], s.layer.rows[b.act[top]])
    pred = s.comm.allreduce(cand, "min") if s.comm.size > 1 else cand
    return gmax, pred, samples


def loss(s: SampledLayer, labels: MultiLabels, scale: int,
         sample_losses: np.ndarray | None = None) -> tuple[float, int, np.ndarray]:
    """Softmax cross-entropy over the active outputs of every rank (with
    ``--lsh-estimate-tail``, the random ones weighted to stand for every output not
    retrieved: ``tail_weights``), the target mass split over the labels (always active in
    training): the loss (mean over ``scale`` samples), the count of samples whose best
    active output is a label, and the error of each active pair."""
    b = s.batch
    assert b is not None
    gmax, pred, samples = _best(s, b)
    shifted = b.z - gmax[samples]
    e = np.exp(shifted)
    batch = len(b.ptr) - 1
    rand = b.tail
    packed = np.zeros((2 if rand is None else 5, batch), dtype=b.z.dtype)
    packed[0] = np.bincount(samples, weights=e if rand is None else np.where(rand, 0, e),
                            minlength=batch)
    packed[1] = np.bincount(samples, weights=b.mass * shifted, minlength=batch)
    if rand is not None:
        packed[2] = np.bincount(samples, weights=np.where(rand, e, 0), minlength=batch)
        packed[3] = np.bincount(samples[~rand], minlength=batch)
        packed[4] = np.bincount(samples[rand], minlength=batch)
    packed = s.comm.allreduce(packed) if s.comm.size > 1 else packed
    total, target = packed[0], packed[1]
    if rand is not None:
        weight = tail_weights(packed[3], packed[4], s.n_out)
        total = total + weight * packed[2]
        e = np.where(rand, e * weight[samples], e)
    has = labels.counts > 0
    per_sample = np.where(has, np.log(np.where(has, total, 1)) - target, 0.0)
    if sample_losses is not None:
        sample_losses[:] = per_sample
    delta = (e / np.where(has, total, 1)[samples] - b.mass) / scale
    delta[~has[samples]] = 0
    delta = delta.astype(b.z.dtype, copy=False)
    delta[np.abs(delta) < flush_below(delta.dtype)] = 0  # as the full softmax's gradient
    correct = int(np.sum(labels.contains(np.where(pred == np.iinfo(np.int64).max, -1,
                                                  pred))))
    return float(np.sum(per_sample)) / scale, correct, delta


def top_k(s: SampledLayer, k: int) -> np.ndarray:
    """The k best active outputs' global rows per sample (samples x k, -1 past the active
    ones), best first, ties by row: each rank's k best, gathered, merged."""
    b = s.batch
    assert b is not None
    batch, samples = len(b.ptr) - 1, b.samples
    rows = s.layer.rows[b.act]
    order = np.lexsort((rows, -b.z, samples))
    rank_in = np.arange(len(order)) - b.ptr[samples[order]]
    keep = order[rank_in < k]
    values = np.full((batch, k), -np.inf)
    ids = np.full((batch, k), np.iinfo(np.int64).max, dtype=np.int64)
    pos = rank_in[rank_in < k]
    values[samples[keep], pos] = b.z[keep]
    ids[samples[keep], pos] = rows[keep]
    parts = s.comm.allgather((values, ids)) if s.comm.size > 1 else [(values, ids)]
    values = np.concatenate([p[0] for p in parts], axis=1)
    ids = np.concatenate([p[1] for p in parts], axis=1)
    pick = np.lexsort((ids, -values), axis=1)[:, :k]
    best = np.take_along_axis(ids, pick, axis=1)
    return np.where(best == np.iinfo(np.int64).max, -1, best)


