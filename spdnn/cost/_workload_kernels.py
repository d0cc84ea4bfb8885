"""numba half of spdnn.cost.workload: one layer's per-rank work and its expand messages in one
pass over the nonzeros (a counting transpose, stamps, then a rank-pair table read in the
runtime's posting order), where numpy sorted the (input row, rank) pairs, too slowly for a
network of 1,920 layers read again for every replay; and the replay's message arrivals."""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.model._plan_counts import column_users


@nb.njit(cache=True, nogil=True)
def layer_work(indptr, indices, owner_out, owner_in, nparts, pair_rows):
    """(rows, prev_rows, nnz_owned, nnz_ghost, ghosts, sent, src, dst, count) as
    ``spdnn.cost.workload.LayerWork`` defines them, the messages sorted by (src, dst).
    ``pair_rows`` (nparts x nparts, flat, zero; int32) is scratch, returned zero."""
    n_out = len(indptr) - 1
    n_in = len(owner_in)
    rows = np.zeros(nparts, dtype=np.int64)
    prev_rows = np.zeros(nparts, dtype=np.int64)
    nnz_owned = np.zeros(nparts, dtype=np.int64)
    nnz_ghost = np.zeros(nparts, dtype=np.int64)
    ghosts = np.zeros(nparts, dtype=np.int64)
    sent = np.zeros(nparts, dtype=np.int64)
    for j in range(n_in):
        prev_rows[owner_in[j]] += 1
    for i in range(n_out):
        p = owner_out[i]
        rows[p] += 1
        for t in range(indptr[i], indptr[i + 1]):
            if owner_in[indices[t]] == p:
                nnz_owned[p] += 1
            else:
                nnz_ghost[p] += 1
    colptr, users = column_users(indptr, indices, owner_out, n_in)
    stamp = np.full(nparts, -1, dtype=np.int64)
    messages = 0
    for j in range(n_in):
        s = owner_in[j]
        for t in range(colptr[j], colptr[j + 1]):
            p = users[t]
            if p == s or stamp[p] == j:
                continue
            stamp[p] = j
            ghosts[p] += 1
            sent[s] += 1
            if pair_rows[s * nparts + p] == 0:
                messages += 1
            pair_rows[s * nparts + p] += 1
    src = np.empty(messages, dtype=np.int64)
    dst = np.empty(messages, dtype=np.int64)
    count = np.empty(messages, dtype=np.int64)
    m = 0
    for s in range(nparts):
        if sent[s] == 0:
            continue
        for p in range(nparts):
            c = pair_rows[s * nparts + p]
            if c:
                src[m] = s
                dst[m] = p
                count[m] = c
                pair_rows[s * nparts + p] = 0
                m += 1
    return rows, prev_rows, nnz_owned, nnz_ghost, ghosts, sent, src, dst, count


@nb.njit(cache=True, nogil=True)
def arrivals(src, dst, latency, transfer, t_post, nparts):
    """Each rank's last incoming message's arrival (or -inf), the messages given sorted by
    (src, dst) as the runtime posts them: a sender's leave one after another through its link,
    a receiver's bytes come in through its own (from its first message's earliest arrival
    on). Pass (dst, src) for the fold: each of its senders posts by its destinations, and a
    stable counting sort by sender keeps them in that order."""
    m_all = len(src)
    order = np.empty(m_all, dtype=np.int64)
    first = np.zeros(nparts + 1, dtype=np.int64)
    for m in range(m_all):
        first[src[m] + 1] += 1
    for p in range(nparts):
        first[p + 1] += first[p]
    for m in range(m_all):
        order[first[src[m]]] = m
        first[src[m]] += 1
    ready = np.full(nparts, -np.inf)
    start = np.full(nparts, np.inf)
    into = np.zeros(nparts)
    busy = 0.0
    for k in range(m_all):
        m = order[k]
        s, d = src[m], dst[m]
        if k == 0 or src[order[k - 1]] != s:
            busy = 0.0
        busy += transfer[m]
        ready[d] = max(ready[d], t_post[s] + latency[m] + busy)
        start[d] = min(start[d], t_post[s] + latency[m])
        into[d] += transfer[m]
    for p in range(nparts):
        if start[p] < np.inf:
            ready[p] = max(ready[p], start[p] + into[p])
    return ready
