"""numba half of spdnn.model.plan.plan_statistics: a layer's cut rows, each rank's rows sent
and received and the communicating rank pairs in one pass over the nonzeros (a counting
transpose, then stamps), where numpy sorted the (input row, rank) pairs."""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def column_users(indptr, indices, owner_out, n_in):
    """The counting transpose: per input column j, the owners of the rows that read it,
    ``users[colptr[j]:colptr[j + 1]]``."""
    n_out = len(indptr) - 1
    colptr = np.zeros(n_in + 1, dtype=np.int64)
    for t in range(indptr[n_out]):
        colptr[indices[t] + 1] += 1
    for j in range(n_in):
        colptr[j + 1] += colptr[j]
    fill = colptr[:-1].copy()
    users = np.empty(indptr[n_out], dtype=np.int32)
    for i in range(n_out):
        for t in range(indptr[i], indptr[i + 1]):
            j = indices[t]
            users[fill[j]] = owner_out[i]
            fill[j] += 1
    return colptr, users


@nb.njit(cache=True, nogil=True)
def layer_cuts(indptr, indices, owner_out, owner_in, nparts, fold, sent, received, pair_stamp,
               layer):
    """Adds one layer's forward rows (and, with ``fold``, its backward rows, the other way) to
    ``sent`` and ``received``; returns (rows cut, rank pairs). ``pair_stamp`` (nparts x nparts,
    flat) remembers the pairs seen, by ``layer``, which must differ for every call."""
    n_in = len(owner_in)
    colptr, users = column_users(indptr, indices, owner_out, n_in)
    stamp = np.full(nparts, -1, dtype=np.int64)
    cut = 0
    pairs = 0
    for j in range(n_in):
        s = owner_in[j]
        for t in range(colptr[j], colptr[j + 1]):
            p = users[t]
            if p == s or stamp[p] == j:
                continue
            stamp[p] = j
            cut += 1
            sent[s] += 1
            received[p] += 1
            if fold:
                sent[p] += 1
                received[s] += 1
            if pair_stamp[s * nparts + p] != layer:
                pair_stamp[s * nparts + p] = layer
                pairs += 1
    return cut, pairs
