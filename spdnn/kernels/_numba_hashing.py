"""numba kernels of LSH's hashing (spdnn.kernels.hashing): DWTA and SimHash codes of sparse
vectors, and the order of a table's rows by bucket. No Python loop per vector.

Vectors come as CSR rows (indptr, indices, data) whose column j is input coordinate
columns[j] (a rank's local columns: its buffer rows); a zero value counts as absent, so a
neuron's stored zero and a sample's ReLU zero hash alike.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels import _numba_tables
from spdnn.kernels.cache_loads import lean_cache_loads


@nb.njit(cache=True, nogil=True)
def _probe(f, attempt, n):
    """The function whose winner an empty DWTA bin borrows at this attempt (densification)."""
    return (f * 40503 + attempt * 2654435761 + attempt * attempt * 97) % n


@nb.njit(cache=True, nogil=True, inline="always")
def _pick(x, best, won, q):
    """One position of a bin: a nonzero value above the best so far wins (the first among
    equals stays; -inf and NaN never win)."""
    take = (x != 0) & (x > best)
    return (x if take else best), (np.int32(q) if take else won)


@nb.njit(cache=True, nogil=True)
def _winners8(dense, m, out):
    """out[b]: the winning position of the bin ``m`` (8 coordinates) in buffer column b, -1
    when all 8 are zero. The 8 rows are named apart, so that each column's comparisons stay
    in registers and the loop over columns runs in SIMD lanes (a loop over positions storing
    the best so far each time was several times slower)."""
    v0, v1, v2, v3 = dense[m[0]], dense[m[1]], dense[m[2]], dense[m[3]]
    v4, v5, v6, v7 = dense[m[4]], dense[m[5]], dense[m[6]], dense[m[7]]
    lowest = dense.dtype.type(-np.inf)
    for b in range(len(out)):
        best, won = lowest, np.int32(-1)
        best, won = _pick(v0[b], best, won, 0)
        best, won = _pick(v1[b], best, won, 1)
        best, won = _pick(v2[b], best, won, 2)
        best, won = _pick(v3[b], best, won, 3)
        best, won = _pick(v4[b], best, won, 4)
        best, won = _pick(v5[b], best, won, 5)
        best, won = _pick(v6[b], best, won, 6)
        best, won = _pick(v7[b], best, won, 7)
        out[b] = won


@nb.njit(cache=True, nogil=True)
def _winners(dense, m, out, best):
    """_winners8 for a bin of any size (an input narrower than 8 coordinates)."""
    best[:] = -np.inf
    out[:] = -1
    for q in range(len(m)):
        v = dense[m[q]]
        for b in range(len(out)):
            best[b], out[b] = _pick(v[b], best[b], out[b], q)


@nb.njit(cache=True, nogil=True)
def _spread(indptr, indices, columns, data, sel, r0, size, rm, dense, dense_rows):
    """Rows sel[r0], ..., sel[r0+size-1] as the columns of ``dense`` (n_in x block).
    ``dense_rows`` (every row holds every input in order: a full layer): copied straight from
    the rows, an input at a time (a third of the time of the general path). Else scattered
    into the row-major ``rm`` (sequential writes), then transposed in 8 x 8 tiles (a scatter
    straight into the columns wrote one cache line per value); ``rm`` is left
    zero."""
    block, n_in = rm.shape
    if dense_rows:
        for c in range(n_in):
            d = dense[columns[c]]
            for b in range(size):
                d[b] = data[indptr[sel[r0 + b]] + c]
        return
    stored = 0
    for b in range(size):
        row = rm[b]
        r = sel[r0 + b]
        stored += indptr[r + 1] - indptr[r]
        for e in range(indptr[r], indptr[r + 1]):
            row[columns[indices[e]]] = data[e]
    for b0 in range(0, block, 8):
        for c0 in range(0, n_in, 8):
            for i in range(8):
                src = rm[b0 + i]
                for j in range(min(8, n_in - c0)):
                    dense[c0 + j, b0 + i] = src[c0 + j]
    if stored > rm.size // 8:
        rm[:] = 0
    else:
        for b in range(size):
            row = rm[b]
            r = sel[r0 + b]
            for e in range(indptr[r], indptr[r + 1]):
                row[columns[indices[e]]] = 0


@nb.njit(cache=True, nogil=True)
def dwta_codes(indptr, indices, columns, data, sel, dense_rows, members, k, tables, n_in,
               block, out):
    """The codes of rows ``sel`` (out[t, i]: row sel[i] in table t). Densified
    winner-take-all: function f's code is the position q of the largest nonzero value among
    its bin's coordinates ``members[f]`` (the first among equals); an empty bin borrows the
    code of another function. Table t's bucket packs functions t*k..t*k+k-1 in base
    len(members[f]). ``block`` rows (a multiple of 8) are hashed side by side, as the
    columns of a dense buffer, so that the comparisons and the packing run across rows in SIMD
    lanes: one row at a time, each function's comparisons were a chain of dependent selects
    (several times slower)."""
    n_fn, base = members.shape
    n_rows = len(sel)
    rm = np.zeros((block, n_in), dtype=data.dtype)
    dense = np.zeros((n_in, block), dtype=data.dtype)
    arg = np.empty((n_fn, block), dtype=np.int32)
    res = np.empty((n_fn, block), dtype=np.int32)
    code = np.empty(block, dtype=np.int64)
    best = np.empty(block, dtype=data.dtype)
    shift = 0  # base a power of 2 (BIN is 8): the packing shifts, as AVX2 has no 64-bit mul
    while (1 << shift) < base:
        shift += 1
    if (1 << shift) != base:
        shift = -1
    for r0 in range(0, n_rows, block):
        size = min(block, n_rows - r0)
        _spread(indptr, indices, columns, data, sel, r0, size, rm, dense, dense_rows)
        for f in range(n_fn):
            if base == 8:
                _winners8(dense, members[f], arg[f])
            else:
                _winners(dense, members[f], arg[f], best)
        for f in range(n_fn):  # an empty bin borrows: from the winners, never the borrowed
            src, dst = arg[f], res[f]
            empty = False
            for b in range(block):
                dst[b] = src[b]
                empty |= src[b] < 0
            if empty:
                for b in range(block):
                    w = src[b]
                    attempt = 1
                    while w < 0 and attempt <= 2 * n_fn:
                        w = arg[_probe(f, attempt, n_fn), b]
                        attempt += 1
                    dst[b] = max(w, 0)
        for t in range(tables):
            code[:] = 0
            for j in range(k):
                won_f = res[t * k + j]
                if shift >= 0:
                    for b in range(block):
                        code[b] = (code[b] << shift) | won_f[b]
                else:
                    for b in range(block):
                        code[b] = code[b] * base + won_f[b]
            out[t, r0:r0 + size] = code[:size]


@nb.njit(cache=True, nogil=True)
def simhash_codes(indptr, indices, columns, data, sel, col_ptr, col_fn, col_sign, k, tables,
                  out):
    """The codes of rows ``sel`` (out[t, i]: row sel[i] in table t). Signed random
    projections: bit j of table t is 1 when the projection of function t*k+j (coordinate c
    feeds the functions col_fn[col_ptr[c]:col_ptr[c+1]] with signs col_sign) is positive;
    sums in float64."""
    n_fn = k * tables
    acc = np.zeros(n_fn, dtype=np.float64)
    for i in range(len(sel)):
        acc[:] = 0.0
        for e in range(indptr[sel[i]], indptr[sel[i] + 1]):
            c = columns[indices[e]]
            v = np.float64(data[e])
            for j in range(col_ptr[c], col_ptr[c + 1]):
                acc[col_fn[j]] += col_sign[j] * v
        for t in range(tables):
            code = 0
            for j in range(k):
                code = code * 2 + (1 if acc[t * k + j] > 0 else 0)
            out[t, i] = code


@nb.njit(cache=True, nogil=True)
def bucket_order(codes, bits, keys, rows):
    """The rows ordered by their code (below 2**bits), ties by row, as (keys, rows): a stable
    least-significant-digit radix sort in passes of at most 11 bits, so the same order as a
    sort of (code, row) pairs. Its counts stay in L1: a counting sort over all 262,144
    buckets of K = 6 missed the cache at every row. Every
    pass's counts come from one read of the codes, and the first pass reads them in place."""
    n = len(codes)
    passes = max(1, -(-bits // 11))
    width = -(-bits // passes) if bits > 0 else 1
    mask = (1 << width) - 1
    tmp_k, tmp_r = np.empty_like(keys), np.empty_like(rows)
    count = np.zeros((passes, mask + 2), dtype=np.int64)
    for i in range(n):
        c = codes[i]
        for p in range(passes):
            count[p, ((c >> (p * width)) & mask) + 1] += 1
    for p in range(passes):
        for d in range(mask + 1):
            count[p, d + 1] += count[p, d]
    for p in range(passes):  # the last pass writes into keys, rows
        last = (passes - 1 - p) % 2 == 0
        dst_k, dst_r = (keys, rows) if last else (tmp_k, tmp_r)
        src_k, src_r = (tmp_k, tmp_r) if last else (keys, rows)
        at = count[p]
        shift = p * width
        for i in range(n):
            c = codes[i] if p == 0 else src_k[i]
            d = (c >> shift) & mask
            j = at[d]
            dst_k[j] = c
            dst_r[j] = i if p == 0 else src_r[i]
            at[d] = j + 1


def warm_up() -> None:
    """Compile the kernels for both value types now, not in a timed step."""
    sel = np.zeros(1, np.int64)
    _numba_tables.warm_up()
    for index in (np.int32, np.int64):  # a table's keys: int64 when a code needs it
        bucket_order(np.zeros(1, np.int64), 1, np.empty(1, index), np.empty(1, np.int32))
    for dt in (np.float32, np.float64):
        # int64 offsets of the samples' codes, int32 of the weight rows' (a layer's indptr);
        # int32 column indices (HashFunctions.codes, Tables.build)
        for offsets in (np.int64, np.int32):
            ip, ix, dd = np.array([0, 2], offsets), np.array([0, 1]), np.ones(2, dt)
            out = np.empty((1, 1), dtype=np.int64)
            local = ix.astype(np.int32)
            for dense_rows in (False, True):
                dwta_codes(ip, local, ix, dd, sel, dense_rows, np.zeros((1, 2), np.int32), 1, 1,
                           2, 8, out)
            simhash_codes(ip, local, ix, dd, sel, np.array([0, 1, 1]), np.zeros(1, np.int32),
                          np.ones(1, np.int8), 1, 1, out)


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
