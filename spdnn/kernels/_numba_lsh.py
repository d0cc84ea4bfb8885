"""numba kernels of LSH-selected neurons (spdnn.kernels.hashing, spdnn.runtime.lsh_layer): the
union of the buckets a batch hits, and the forward and backward products on the (neuron,
sample) pairs of that union only. No Python loop per sample. The hash codes:
spdnn.kernels._numba_hashing.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels import _numba_hashing
from spdnn.kernels._prefetch import prefetch
from spdnn.kernels.cache_loads import lean_cache_loads

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
def _buckets(s, codes, keys, starts, shift, lo, hi):
    """The range [lo[t], hi[t]) of table t's rows in the bucket of sample s's code; returns
    their total length."""
    total = 0
    for t in range(codes.shape[1]):
        code = codes[s, t]
        lo[t] = hi[t] = 0
        if (code >> shift) + 1 >= starts.shape[1]:  # beyond every key
            continue
        a, b = starts[t, code >> shift], starts[t, (code >> shift) + 1]
        near = keys[t][a:b]
        lo[t] = a + np.searchsorted(near, code, side="left")
        hi[t] = a + np.searchsorted(near, code, side="right")
        total += hi[t] - lo[t]
    return total


@nb.njit(cache=True, nogil=True)
def _grown(a, size):
    """``a`` with room for ``size`` entries (its own when it has it), its contents kept."""
    if size <= len(a):
        return a
    b = np.zeros(max(size, 2 * len(a)), dtype=a.dtype)
    b[:len(a)] = a
    return b


@nb.njit(cache=True, nogil=True)
def retrieve(codes, keys, rows, starts, shift, label_ptr, label_rows, label_weights, n_rows):
    """Per sample, the union of the rows in the buckets its codes hit (table t: rows[t]
    ordered by keys[t], its directory starts[t]: spdnn.kernels.hashing.Tables) and of its
    label rows (-1: not here), ascending. Returns the CSR of the active pairs (ptr, rows),
    each pair's target mass (0 unless a label) and the number of tables whose bucket holds it
    (plus one more than the tables for a row that joined as a label or filler). One pass, the
    arrays grown as they fill (a counting pass first searched every bucket twice)."""
    batch, n_tables = codes.shape
    stamp = np.full(n_rows, -1, dtype=np.int32)
    hit_of = np.zeros(n_rows, dtype=np.int32)  # per row, for the sample at hand: the tables
    joined = np.zeros(n_rows, dtype=np.bool_)  # that hit it, whether it joined as a label or
    mass_of = np.zeros(n_rows, dtype=label_weights.dtype)  # filler, its largest target mass
    ptr = np.zeros(batch + 1, dtype=np.int64)
    lo, hi = np.empty(n_tables, np.int64), np.empty(n_tables, np.int64)
    out = np.empty(1024, dtype=np.int64)
    mass = np.zeros(1024, dtype=label_weights.dtype)
    hits = np.zeros(1024, dtype=np.int64)
    labelled = len(label_ptr) > 0
    c = 0
    for s in range(batch):
        room = c + _buckets(s, codes, keys, starts, shift, lo, hi) + \
            (label_ptr[s + 1] - label_ptr[s] if labelled else 0)
        out, mass, hits = _grown(out, room), _grown(mass, room), _grown(hits, room)
        for t in range(n_tables):
            for j in range(lo[t], hi[t]):
                r = rows[t, j]
                hit_of[r] += 1
                if stamp[r] != s:
                    stamp[r] = s
                    out[c] = r
                    c += 1
        if labelled:
            for j in range(label_ptr[s], label_ptr[s + 1]):
                r = label_rows[j]
                if r < 0:
                    continue
                if stamp[r] != s:
                    stamp[r] = s
                    out[c] = r
                    c += 1
                joined[r] = True  # once, a row also drawn as a filler
                if label_weights[j] > mass_of[r]:  # a label also drawn as a filler
                    mass_of[r] = label_weights[j]
        ptr[s + 1] = c
        out[ptr[s]:c] = np.sort(out[ptr[s]:c])
        for a in range(ptr[s], c):
            r = out[a]
            hits[a] = hit_of[r] + (n_tables + 1 if joined[r] else 0)
            mass[a] = mass_of[r]
            hit_of[r] = 0
            joined[r] = False
            mass_of[r] = 0
    return ptr, out[:c].copy(), mass[:c].copy(), hits[:c].copy()


@nb.njit(cache=True, nogil=True)
def _by_row(ptr, act, key, n_keys):
    """The active pairs grouped by key[row] ascending, samples ascending within a group:
    (the keys present, the start of each one's group, pair, sample). A row's accumulators then
    see the pairs in sample order and a sample's in row order, as a loop over samples gives
    them: the same sums, while each row's weights (512 bytes of a 50,000-row head) are read
    once per step, not per pair. The pairs are ordered by the tables' radix sort
    (_numba_hashing.bucket_order, stable: cheaper than a count per key over the whole head)."""
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
    sorted_k, pair = np.empty(n, np.int64), np.empty(n, np.int64)
    _numba_hashing.bucket_order(k, bits, sorted_k, pair)
    keys, start, sample = np.empty(n, np.int64), np.empty(n + 1, np.int64), np.empty(n, np.int64)
    groups = 0
    for i in range(n):
        sample[i] = owner[pair[i]]
        if i == 0 or sorted_k[i] != sorted_k[i - 1]:
            keys[groups] = sorted_k[i]
            start[groups] = i
            groups += 1
    start[groups] = n
    return keys[:groups], start[:groups + 1], pair, sample


@nb.njit(cache=True, nogil=True, inline="always")
def _dot(bias, w, x, cols, dense):
    """bias + w . x[cols] (x[:len(w)] when ``dense``): eight partial sums over the entries
    j = l mod 8, added as a tree, then the entries past the last multiple of 8, so that the
    multiply-adds run in SIMD lanes, not as one chain of dependent adds (twice as fast)."""
    n = len(w)
    m = n - n % 8
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = w.dtype.type(0)
    if dense:
        for j in range(0, m, 8):
            a0 += w[j] * x[j]
            a1 += w[j + 1] * x[j + 1]
            a2 += w[j + 2] * x[j + 2]
            a3 += w[j + 3] * x[j + 3]
            a4 += w[j + 4] * x[j + 4]
            a5 += w[j + 5] * x[j + 5]
            a6 += w[j + 6] * x[j + 6]
            a7 += w[j + 7] * x[j + 7]
    else:
        for j in range(0, m, 8):
            a0 += w[j] * x[cols[j]]
            a1 += w[j + 1] * x[cols[j + 1]]
            a2 += w[j + 2] * x[cols[j + 2]]
            a3 += w[j + 3] * x[cols[j + 3]]
            a4 += w[j + 4] * x[cols[j + 4]]
            a5 += w[j + 5] * x[cols[j + 5]]
            a6 += w[j + 6] * x[cols[j + 6]]
            a7 += w[j + 7] * x[cols[j + 7]]
    acc = bias + (((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)))
    for j in range(m, n):
        acc += w[j] * (x[j] if dense else x[cols[j]])
    return acc


@nb.njit(cache=True, nogil=True)
def sampled_forward(ptr, act, indptr, indices, data, bias, xt, z, dense):
    """z[a] = bias[r] + W[r] . xt[s] for every active pair a = (r, s) (``_dot``); xt is
    (batch x inputs). ``dense``: every row of W holds every input in order (a full output
    layer), so the input row is read in place instead of gathered: the same terms in the same
    order. The rows are visited in ascending order, a few apart in memory: each one is
    prefetched PREFETCH_GROUPS rows ahead (a large head's step is markedly faster with)."""
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
            z[pair[k]] = _dot(bias[r], w, xt[sample[k]], cols, dense)


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
    loop, LLVM's overlap checks kept the loop scalar, several times slower."""
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
        _numba_hashing.warm_up()
    for dt in (np.float32, np.float64):
        # a local layer's int32 indptr and indices (int64 ones, beyond 2**31 values, compile
        # when first used)
        ip, ix, dd = np.array([0, 2], np.int32), np.array([0, 1], np.int32), np.ones(2, dt)
        out = np.zeros((1, 1), dtype=np.int64)
        index = np.zeros((1, 1), np.int32)  # the tables' keys and rows (int64: when used)
        ptr, act, mass, _ = retrieve(out, index, index, np.zeros((1, 2), np.int32), 0,
                                     np.array([0, 1]), np.array([0]), np.ones(1, dt), 1)
        z = np.empty(len(act), dtype=dt)
        xt = np.ones((1, 2), dtype=dt)
        for dense in (False, True):
            sampled_forward(ptr, act, ip, ix, dd, np.zeros(1, dt), xt, z, dense)
            sampled_backward(ptr, act, z, ip, ix, dd, xt, np.zeros(1, np.int64),
                             np.zeros(1, np.int64), np.zeros(2, dt), np.zeros(1, dt),
                             np.zeros((1, 2), dt), dense)


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
