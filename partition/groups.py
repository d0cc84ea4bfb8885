"""Groups of identical rows: neurons of a layer that read the same inputs (RadiX-Net and the
Graph Challenge: 16 a group) can share a rank at no cost, so the partitioners place them as one
vertex. Found by hashing each row's column set (two independent 64-bit sums of random values,
one numba pass over the nonzeros), checked exactly, and cut into chunks no heavier than a
rank's share of the layer. ``grouped_hypergraph`` builds the hypergraph of the groups straight
from the layers, reading one row a group: the neurons' hypergraph is never built."""

from __future__ import annotations

from collections.abc import Sequence

import numba as nb
import numpy as np

from spdnn.model.plan import Pattern

from .hypergraph import Hypergraph, check_objective

# Groups are worth a coarse level only when they shrink the hypergraph's vertices at least
# this much (a dense head's few groups are not).
GROUP_SHRINK = 0.9


@nb.njit(cache=True, nogil=True)
def _row_hashes(indptr, indices, r1, r2, h1, h2):
    for i in range(len(indptr) - 1):
        a = np.uint64(0)
        b = np.uint64(0)
        for t in range(indptr[i], indptr[i + 1]):
            a += r1[indices[t]]
            b += r2[indices[t]]
        h1[i] = a
        h2[i] = b


@nb.njit(cache=True, nogil=True)
def _equal_rows(indptr, indices, i, j):
    n = indptr[i + 1] - indptr[i]
    if n != indptr[j + 1] - indptr[j]:
        return False
    for t in range(n):
        if indices[indptr[i] + t] != indices[indptr[j] + t]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _same_rows(indptr, indices, order, group):
    """Exact groups: within each run of rows with equal hashes (consecutive in ``order``),
    each row is compared with the distinct rows found so far in the run, so a hash collision
    never joins rows that differ. Returns group ids, numbered in order of appearance."""
    n = len(order)
    out = np.empty(n, dtype=np.int64)
    reps = np.empty(n, dtype=np.int64)
    ids = np.empty(n, dtype=np.int64)
    next_id = 0
    s = 0
    while s < n:
        e = s
        while e < n and group[order[e]] == group[order[s]]:
            e += 1
        m = 0  # distinct rows of this run so far
        for q in range(s, e):
            i = order[q]
            found = -1
            for r in range(m):
                if _equal_rows(indptr, indices, i, reps[r]):
                    found = ids[r]
                    break
            if found < 0:
                reps[m] = i
                ids[m] = next_id
                found = next_id
                next_id += 1
                m += 1
            out[i] = found
        s = e
    return out


def row_groups(indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int], nparts: int,
               rng: np.random.Generator, epsilon: float = 0.03) -> np.ndarray:
    """Each row's group (0..): rows with the same column set share one, cut into chunks no
    heavier than a rank's share of the layer, or, where whole chunks of that size could not
    meet the layer's balance limit, no heavier than its slack. Every row is single when the
    layer has fewer than 4 rows a rank. Column indices must be sorted within rows (as a network
    bundle's are)."""
    n = shape[0]
    if n < 4 * nparts:
        return np.arange(n, dtype=np.int64)
    r = rng.integers(0, 2**63, size=(2, shape[1]), dtype=np.uint64)
    h1, h2 = np.empty(n, np.uint64), np.empty(n, np.uint64)
    _row_hashes(indptr, indices, r[0], r[1], h1, h2)
    length = np.diff(indptr)
    order = np.lexsort((length, h2, h1))
    changed = np.ones(n, dtype=bool)
    changed[1:] = (np.diff(h1[order]) != 0) | (np.diff(h2[order]) != 0) | \
        (np.diff(length[order]) != 0)
    hashed = np.empty(n, dtype=np.int64)
    hashed[order] = np.cumsum(changed) - 1
    group = _same_rows(indptr, indices, order, hashed)
    by_group = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(group[by_group]) != 0])
    rank_in_group = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    total = float(length.sum())
    limit = (1 + epsilon) * total / nparts + float(length.max())
    for share in (max(1.0, total / nparts), max(1.0, limit - total / nparts)):
        # Chunks of at most ``share``: a rank's share first; its slack over the average where
        # whole chunks cannot balance (then any block under the average takes one more).
        per_chunk = np.maximum(1, (share // np.maximum(length, 1)).astype(np.int64))
        chunk = np.empty(n, dtype=np.int64)
        chunk[by_group] = rank_in_group // per_chunk[by_group]
        _, local = np.unique(group * (n + 1) + chunk, return_inverse=True)
        local = local.reshape(-1).astype(np.int64)
        weights = np.bincount(local, weights=length)
        if weights.min() == weights.max() and \
                -(-len(weights) // nparts) * weights[0] <= limit + 1e-9:
            break  # equal chunks that fit whole
    return local


def first_layer_grouped(source: object, nparts: int, epsilon: float = 0.03) -> bool:
    """Whether the first layer of ``source`` (a network bundle or
    partition.windows.PatternList) forms groups that shrink it: what the sweep's memory
    prediction assumes for every layer before reading them."""
    indptr, indices = source.pattern(1)
    shape = source.shapes[0]
    g = row_groups(indptr, indices, shape, nparts, np.random.default_rng(12345), epsilon)
    return (int(g.max()) + 1 if len(g) else 0) <= GROUP_SHRINK * shape[0]


def layer_groups(patterns: Sequence[Pattern], nparts: int,
                 epsilon: float = 0.03) -> list[np.ndarray]:
    """``row_groups`` of every layer (seeded: the same groups every run)."""
    rng = np.random.default_rng(12345)
    return [row_groups(indptr, indices, shape, nparts, rng, epsilon)
            for indptr, indices, shape in patterns]


def identical_row_clusters(patterns: Sequence[Pattern], nparts: int,
                           groups: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """The cluster of every vertex of the neurons' hypergraph: input neurons single, the
    neurons of each layer by ``layer_groups`` (or ``groups``), numbered layer after layer."""
    clusters = [np.arange(patterns[0][2][1], dtype=np.int64)]
    next_id = len(clusters[0])
    for g in layer_groups(patterns, nparts) if groups is None else groups:
        clusters.append(next_id + g)
        next_id += int(g.max()) + 1 if len(g) else 0
    return np.concatenate(clusters)


def shrinks(patterns: Sequence[Pattern], groups: Sequence[np.ndarray]) -> bool:
    """Whether the groups shrink the vertices enough for a coarse level (GROUP_SHRINK)."""
    n0 = patterns[0][2][1]
    fine = n0 + sum(p[2][0] for p in patterns)
    coarse = n0 + sum(int(g.max()) + 1 if len(g) else 0 for g in groups)
    return coarse <= GROUP_SHRINK * fine


@nb.njit(cache=True, nogil=True)
def _group_nets(indptr, indices, n_in, reps, source, base):
    """The nets of one layer's input neurons on the groups: net j = {source[j]} and the groups
    (numbered from ``base``) whose rows read j; nets of one pin are dropped. Returns (sizes of
    the kept nets, their pins, the kept input neurons)."""
    count = np.zeros(n_in, dtype=np.int64)
    for c in range(len(reps)):
        r = reps[c]
        for t in range(indptr[r], indptr[r + 1]):
            count[indices[t]] += 1
    kept = np.flatnonzero(count > 0)
    pos = np.zeros(n_in + 1, dtype=np.int64)
    for j in range(n_in):
        pos[j + 1] = pos[j] + (count[j] + 1 if count[j] > 0 else 0)
    pins = np.empty(pos[n_in], dtype=np.int64)
    fill = pos[:-1].copy()
    for j in range(n_in):
        if count[j] > 0:
            pins[fill[j]] = source[j]
            fill[j] += 1
    for c in range(len(reps)):
        r = reps[c]
        for t in range(indptr[r], indptr[r + 1]):
            j = indices[t]
            pins[fill[j]] = base + c
            fill[j] += 1
    sizes = np.empty(len(kept), dtype=np.int64)
    for q in range(len(kept)):
        sizes[q] = count[kept[q]] + 1
    return sizes, pins, kept


def grouped_hypergraph(patterns: Sequence[Pattern], groups: Sequence[np.ndarray], *,
                       objective: str = "train",
                       first_layer: int = 1) -> tuple[Hypergraph, np.ndarray]:
    """The hypergraph of the groups (a vertex per group of each layer, the input neurons
    single) and the group vertex of every neuron, as ``contract`` of the neurons' hypergraph
    by ``identical_row_clusters`` would give them (nets of one pin dropped), but built from one
    row a group."""
    check_objective(objective)
    fold = 1 if objective == "train" else 0
    n0 = patterns[0][2][1]
    counts = [n0] + [int(g.max()) + 1 if len(g) else 0 for g in groups]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    coarse_of = [np.arange(n0, dtype=np.int64)]
    weights = [np.zeros(n0, dtype=np.int64)]
    sizes, pins, net_w, net_l = [], [], [], []
    for k, ((indptr, indices, shape), g) in enumerate(zip(patterns, groups), start=1):
        source = coarse_of[-1]
        _, reps = np.unique(g, return_index=True)  # each group's first row
        s, p, kept = _group_nets(indptr, indices, shape[1], reps, source, offsets[k])
        sizes.append(s)
        pins.append(p)
        net_w.append(np.full(len(kept), 1 if k + first_layer - 1 == 1 else 1 + fold, np.int64))
        net_l.append(np.full(len(kept), k - 1, dtype=np.int32))
        weights.append(np.bincount(g, weights=np.diff(indptr), minlength=counts[k])
                       .astype(np.int64))
        coarse_of.append(offsets[k] + g)
    net_indptr = np.concatenate([[0], np.cumsum(np.concatenate(sizes))]).astype(np.int64)
    hg = Hypergraph(offsets=offsets, vertex_weights=np.concatenate(weights),
                    net_indptr=net_indptr, net_pins=np.concatenate(pins),
                    net_weights=np.concatenate(net_w), net_layer=np.concatenate(net_l))
    return hg, np.concatenate(coarse_of)
