"""The reference's LSH-sampled output layer (SLIDE): its tables and the sampled backward pass."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from spdnn.kernels.hashing import HashFunctions, Tables
from spdnn.kernels.lsh import (
    apply_cap,
    forced,
    tail_pairs,
    tail_weights,
)
from spdnn.kernels.ranges import concat_ranges, segment_ids
from spdnn.model.labels import MultiLabels
from spdnn.model.network import Network
from spdnn.optim import RowGrad
from spdnn.reference.passes import Gradients, _backward_from, forward, sampled_products


def lsh_tables(net: Network, hashes: HashFunctions) -> Tables:
    """Tables over every neuron of the LSH layer (its rows' current weights)."""
    w = net.layers[hashes.spec.layer - 1].weight
    return Tables.build(hashes.codes(w.indptr, w.indices, w.data))


def sampled_backward(net: Network, x0: np.ndarray, y: MultiLabels, hashes: HashFunctions,
                     tables: Tables, seed: int = 0, fill: np.ndarray | None = None,
                     top_rows: np.ndarray | None = None) -> tuple[Gradients, int]:
    """SLIDE's step on one batch: the last layer's active (neuron, sample) pairs are the
    buckets the samples' inputs hit plus their labels; softmax cross-entropy over those; the
    last layer's gradients only for the rows active for some sample (as RowGrad). Also the
    number of active pairs. ``fill``: random rows per sample, ``top_rows``: rows for every
    sample."""
    last = net.layers[-1]
    zs, xs = forward(net, x0)  # (the last layer's dense Z is not used)
    h = xs[-1]
    w, batch = last.weight, h.shape[1]
    ptr, act, mass, hits = tables.retrieve(hashes.codes_of_columns(h), net.sizes[-1],
                                           *forced(y, fill, h.dtype, batch, top_rows))
    if hashes.spec.max_active:
        ptr, act, mass, hits = apply_cap(ptr, act, mass, hits, act, hashes.spec, net.sizes[-1],
                                         seed, lambda samples, keys: (samples, keys))
    s = segment_ids(ptr)
    z = np.asarray(w[act].multiply(h[:, s].T).sum(axis=1)).ravel() + last.bias[act]
    gmax = np.full(batch, -np.inf)
    np.maximum.at(gmax, s, z)
    e = np.exp(z - gmax[s])
    if hashes.spec.estimate_tail:  # the random pairs stand for the outputs not retrieved
        rand = tail_pairs(hits, mass, act, np.zeros(0) if top_rows is None else top_rows,
                          hashes.spec.tables)
        weight = tail_weights(np.bincount(s[~rand], minlength=batch),
                              np.bincount(s[rand], minlength=batch), net.sizes[-1])
        e = np.where(rand, e * weight[s], e)
    total = np.bincount(s, weights=e, minlength=batch)
    target = np.bincount(s, weights=mass * (z - gmax[s]), minlength=batch)
    has = y.counts > 0
    value = float(np.sum(np.where(has, np.log(np.where(has, total, 1)) - target, 0))) / batch
    none = np.iinfo(np.int64).max
    best = np.full(batch, none)
    top = z == gmax[s]
    np.minimum.at(best, s[top], act[top])  # the lowest row among the largest
    correct = int(np.sum(y.contains(np.where(best == none, -1, best))))
    delta = (e / np.where(has, total, 1)[s] - mass) / batch
    delta[~has[s]] = 0
    d = sp.csr_matrix((delta, (act, s)), shape=(net.sizes[-1], batch)).toarray()
    union = np.unique(act)
    counts = np.diff(w.indptr)[union]
    gw, gb = [np.empty(0)] * net.n_layers, [np.empty(0)] * net.n_layers
    gw[-1] = RowGrad(concat_ranges(w.indptr[union], counts),
                     sampled_products(w, d, h)[concat_ranges(w.indptr[union], counts)])
    gb[-1] = RowGrad(union, d.sum(axis=1)[union])
    if net.n_layers > 1:
        below = w.T @ d
        net.hidden(net.n_layers - 1).backward(below, zs[-2])
        _backward_from(net, zs, xs, below, net.n_layers - 2, gw, gb)
    return Gradients(gw, gb, value, correct), len(act)
