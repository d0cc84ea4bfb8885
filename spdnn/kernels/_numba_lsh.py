"""numba kernels of LSH-selected neurons (spdnn.kernels.hashing, spdnn.runtime.sampled): the
union of the buckets a batch hits, and the forward and backward products on the (neuron,
sample) pairs of that union only. No Python loop per sample. The hash codes:
spdnn.kernels._numba_hash.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels import _numba_hash
from spdnn.kernels._prefetch import prefetch

PREFETCH_GROUPS = 8  # rows prefetched ahead (2, 4, 8, 16 measured: 8 best, by a little)


@nb.njit(cache=True, nogil=True, inline="always")
def _prefetch_row(indptr, indices, data, r, dense):
    """Every cache line of row r of W (and of its column indices unless ``dense``)."""
    for e in range(indptr[r], indptr[r + 1], max(1, 64 // data.itemsize)):
        prefetch(data, e)
    if not dense:
        for e in range(indptr[r], indptr[r + 1], 16):
            prefetch(indices, e)


@nb.njit(cache=True, nogil=True)
def _union(s, codes, keys, rows, label_ptr, label_rows, stamp, hit_of, out, c):
    """Sample s's rows: those of the buckets it hits, then its label rows, each once (stamped
    with s), written to out[c:] when ``out`` has room (the counting pass gives it none), and
    the tables that hit each row counted in ``hit_of``. Returns the new end c."""
    write = len(out) > 0
    for t in range(codes.shape[1]):
        lo = np.searchsorted(keys[t], codes[s, t], side="left")
        hi = np.searchsorted(keys[t], codes[s, t], side="right")
        for j in range(lo, hi):
            r = rows[t, j]
            hit_of[r] += 1
            if stamp[r] != s:
                stamp[r] = s
                if write:
                    out[c] = r
                c += 1
    if len(label_ptr) > 0:
        for j in range(label_ptr[s], label_ptr[s + 1]):
            r = label_rows[j]
            if r >= 0 and stamp[r] != s:
                stamp[r] = s
                if write:
                    out[c] = r
                c += 1
    return c


@nb.njit(cache=True, nogil=True)
def retrieve(codes, keys, rows, label_ptr, label_rows, label_weights, n_rows):
    """Per sample, the union of the rows in the buckets its codes hit (table t: rows[t]
    ordered by keys[t]) and of its label rows (-1: not here), ascending. Returns the CSR of
    the active pairs (ptr, rows), each pair's target mass (0 unless a label) and the number
    of tables whose bucket holds it (plus one more than the tables for a row that joined as
    a label or filler). Two passes: count, then fill."""
    batch = codes.shape[0]
    stamp = np.full(n_rows, -1, dtype=np.int64)
    hit_of = np.zeros(n_rows, dtype=np.int64)
    ptr = np.zeros(batch + 1, dtype=np.int64)
    none = np.empty(0, dtype=np.int64)
    for s in range(batch):
        ptr[s + 1] = _union(s, codes, keys, rows, label_ptr, label_rows, stamp, hit_of, none,
                            ptr[s])
    out = np.empty(ptr[batch], dtype=np.int64)
    mass = np.zeros(ptr[batch], dtype=label_weights.dtype)
    hits = np.zeros(ptr[batch], dtype=np.int64)
    stamp[:] = -1
    hit_of[:] = 0
    for s in range(batch):
        c = _union(s, codes, keys, rows, label_ptr, label_rows, stamp, hit_of, out, ptr[s])
        out[ptr[s]:c] = np.sort(out[ptr[s]:c])
        for a in range(ptr[s], c):
            hits[a] = hit_of[out[a]]
            hit_of[out[a]] = 0
        if len(label_ptr) > 0:
            for j in range(label_ptr[s], label_ptr[s + 1]):
                r = label_rows[j]
                if r >= 0:
                    a = ptr[s] + np.searchsorted(out[ptr[s]:c], r)
                    if hits[a] <= codes.shape[1]:  # once, a row also drawn as a filler
                        hits[a] += codes.shape[1] + 1
                    if label_weights[j] > mass[a]:  # a label also drawn as a filler
                        mass[a] = label_weights[j]
    return ptr, out, mass, hits


@nb.njit(cache=True, nogil=True)
def _by_row(ptr, act, key, n_keys):
    """The active pairs grouped by key[row] ascending, samples ascending within a group:
    (the keys present, the start of each one's group, pair, sample). A row's accumulators then
    see the pairs in sample order and a sample's in row order, as a loop over samples gives
    them: the same sums, while each row's weights (512 bytes of a 50,000-row head) are read
    once per step, not per pair. A stable radix sort of the pairs (digits of at most 11 bits:
    a count per key over a 200,000-row head cost 1.9 ms a step, this 0.2)."""
    n = len(act)
    k = np.empty(n, np.int64)
    owner = np.empty(n, np.int64)
    for s in range(len(ptr) - 1):
        for a in range(ptr[s], ptr[s + 1]):
            k[a] = key[act[a]]
            owner[a] = s
    bits = 1
    while (1 << bits) < n_keys:
        bits += 1
    passes = -(-bits // 11)
    width = -(-bits // passes)
    mask = (1 << width) - 1
    pair, spare = np.arange(n), np.empty(n, np.int64)
    count = np.empty(mask + 2, np.int64)
    for p in range(passes):
        count[:] = 0
        shift = p * width
        for i in range(n):
            count[((k[pair[i]] >> shift) & mask) + 1] += 1
        for d in range(mask + 1):
            count[d + 1] += count[d]
        for i in range(n):
            d = (k[pair[i]] >> shift) & mask
            spare[count[d]] = pair[i]
            count[d] += 1
        pair, spare = spare, pair
    keys, start, sample = np.empty(n, np.int64), np.empty(n + 1, np.int64), np.empty(n, np.int64)
    groups = 0
    for i in range(n):
        sample[i] = owner[pair[i]]
        if i == 0 or k[pair[i]] != k[pair[i - 1]]:
            keys[groups] = k[pair[i]]
            start[groups] = i
            groups += 1
    start[groups] = n
    return keys[:groups], start[:groups + 1], pair, sample


@nb.njit(cache=True, nogil=True)
def sampled_forward(ptr, act, indptr, indices, data, bias, xt, z, dense):
    """z[a] = bias[r] + W[r] . xt[s] for every active pair a = (r, s); xt is (batch x inputs).
    ``dense``: every row of W holds every input in order (a full output layer), so the
    input row is read in place instead of gathered: the same terms in the same order. The
    rows are visited in ascending order, a few apart in memory: each one is prefetched
    PREFETCH_GROUPS rows ahead (a 200,000-row head: 4.5 ms a step without, 2.5 with)."""
    rows, start, pair, sample = _by_row(ptr, act, np.arange(len(indptr) - 1),
                                        len(indptr) - 1)
    for g in range(min(PREFETCH_GROUPS, len(rows))):
        _prefetch_row(indptr, indices, data, rows[g], dense)
    for g in range(len(rows)):
        if g + PREFETCH_GROUPS < len(rows):
            _prefetch_row(indptr, indices, data, rows[g + PREFETCH_GROUPS], dense)
        r = rows[g]
        lo, hi = indptr[r], indptr[r + 1]
        w, cols = data[lo:hi], indices[lo:hi]
        for k in range(start[g], start[g + 1]):
            x = xt[sample[k]]
            acc = bias[r]
            if dense:
                for j in range(hi - lo):
                    acc += w[j] * x[j]
            else:
                for j in range(hi - lo):
                    acc += w[j] * x[cols[j]]
            z[pair[k]] = acc


@nb.njit(cache=True, nogil=True)
def sampled_backward(ptr, act, delta, indptr, indices, data, xt, slot, entry_start, gw, gb,
                     part_t, dense):
    """For every active pair a = (r, s) with error delta[a]: the bias and weight gradients of
    row r (at slot[r] of the compact arrays, rows ascending: gb[slot], gw[entry_start[slot] +
    entry]) and the partial sums part_t[s, c] += delta W[r, c] of the inputs (transposed: a
    sample's sums are one contiguous row). Every sum is taken in sample order for a row's
    gradients and in row order for a sample's partial sums (``_by_row``), the rows prefetched
    as in sampled_forward. ``dense``: as sampled_forward. The row's arrays are taken as
    slices and the two updates run as two loops: with offsets into the whole arrays and one
    loop, LLVM's overlap checks kept the loop scalar (22 ms against 6 for 40,000 pairs of
    128)."""
    slots, start, pair, sample = _by_row(ptr, act, slot, len(gb))
    first = act[pair[start[:-1]]]  # the row of each group
    for g in range(min(PREFETCH_GROUPS, len(slots))):
        _prefetch_row(indptr, indices, data, first[g], dense)
    for g in range(len(slots)):
        if g + PREFETCH_GROUPS < len(slots):
            _prefetch_row(indptr, indices, data, first[g + PREFETCH_GROUPS], dense)
        u, r = slots[g], first[g]
        lo, hi = indptr[r], indptr[r + 1]
        grad = gw[entry_start[u]:entry_start[u] + hi - lo]
        w, cols = data[lo:hi], indices[lo:hi]
        for k in range(start[g], start[g + 1]):
            d = delta[pair[k]]
            x, p = xt[sample[k]], part_t[sample[k]]
            gb[u] += d
            if dense:
                for j in range(hi - lo):
                    grad[j] += d * x[j]
                for j in range(hi - lo):
                    p[j] += d * w[j]
            else:
                for j in range(hi - lo):
                    grad[j] += d * x[cols[j]]
                for j in range(hi - lo):
                    p[cols[j]] += d * w[j]


def warm_up(*, hashing: bool = True) -> None:
    """Compile the kernels (and the hashing's, unless not ``hashing``) for both value types
    now, not in a timed step."""
    if hashing:
        _numba_hash.warm_up()
    for dt in (np.float32, np.float64):
        # a local layer's int32 indptr and indices (int64 ones, beyond 2**31 values, compile
        # when first used)
        ip, ix, dd = np.array([0, 2], np.int32), np.array([0, 1], np.int32), np.ones(2, dt)
        out = np.zeros((1, 1), dtype=np.int64)
        index = np.zeros((1, 1), np.int32)  # the tables' keys and rows (int64: when used)
        ptr, act, mass, _ = retrieve(out, index, index, np.array([0, 1]), np.array([0]),
                                     np.ones(1, dt), 1)
        z = np.empty(len(act), dtype=dt)
        xt = np.ones((1, 2), dtype=dt)
        for dense in (False, True):
            sampled_forward(ptr, act, ip, ix, dd, np.zeros(1, dt), xt, z, dense)
            sampled_backward(ptr, act, z, ip, ix, dd, xt, np.zeros(1, np.int64),
                             np.zeros(1, np.int64), np.zeros(2, dt), np.zeros(1, dt),
                             np.zeros((1, 2), dt), dense)
