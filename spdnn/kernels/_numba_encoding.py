"""numba kernels of the exchange encodings (spdnn.kernels.encoding holds the format, its
rationale and the numpy fallback). One call encodes, or decodes, every message of one exchange:
per message the Python overhead would cost more than the kernels on the small blocks of deep
layers.

Values are handled as their bit patterns (int32 / int64 views of float32 / float64): a zero is
the all-zero pattern (so -0.0 travels as a value, bit-exact) and "at the cap" is the cap's
pattern. Each step works one 512-bit vector at a time (spdnn.kernels._simd: lane masks, compress,
expand), with a scalar tail: branchy scalar code was several times slower. One thread: a
rank's other threads run the products. Measured against the numpy version: docs/BENCHMARKS.md,
"Kernels".
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels._numba_bfloat16 import value
from spdnn.kernels._simd import (
    compress_store,
    equal_lanes,
    expand_add,
    expand_load,
    nonzero_lanes,
    popcount,
    slope_lanes,
)
from spdnn.kernels.cache_loads import lean_cache_loads

HEADER = 16
POP = np.array([bin(b).count("1") for b in range(256)], np.int64)


@nb.njit(cache=True, nogil=True, inline="always")
def _store_mask(bits, k, lanes, m):
    c = k >> 3
    for j in range(lanes >> 3):  # 8, 16 or (bfloat16) 32 lanes
        bits[c + j] = (m >> np.uint64(8 * j)) & np.uint64(255)


@nb.njit(cache=True, nogil=True)
def _classify(u, abits, bbits, capped, capu):
    """abits: the entries whose value travels (pattern neither 0 nor the cap's); bbits (when
    ``capped``): the entries at the cap. Little-endian bits within a byte. Returns the two
    counts."""
    n = len(u)
    lanes = 64 // u.itemsize
    nv = n_cap = k = 0
    while k + lanes <= n:
        a = nonzero_lanes(u, k)
        if capped:
            b = equal_lanes(u, k, capu)
            a &= ~b
            _store_mask(bbits, k, lanes, b)
            n_cap += popcount(b)
        _store_mask(abits, k, lanes, a)
        nv += popcount(a)
        k += lanes
    a = b = 0
    for i in range(n - k):  # the tail, < one vector: whole bytes
        w = u[k + i]
        t = np.int64(capped and w == capu)
        a |= (np.int64(w != 0) & (t ^ 1)) << i
        b |= t << i
    for j in range((n - k + 7) // 8):
        abits[(k >> 3) + j] = (a >> (8 * j)) & 255
        if capped:
            bbits[(k >> 3) + j] = (b >> (8 * j)) & 255
    return nv + popcount(np.uint64(a)), n_cap + popcount(np.uint64(b))


@nb.njit(cache=True, nogil=True)
def _count(bits, pop):
    s = 0
    for c in range(len(bits)):
        s += pop[bits[c]]
    return s


@nb.njit(cache=True, nogil=True, inline="always")
def _vector_mask(bits, k, lanes):
    """The bits of entries k .. k + lanes - 1 (k a multiple of 8; 8, 16 or 32 lanes)."""
    c = k >> 3
    m = np.uint64(bits[c])
    for j in range(1, lanes >> 3):
        m |= np.uint64(bits[c + j]) << np.uint64(8 * j)
    return m


@nb.njit(cache=True, nogil=True)
def _compact(u, abits):
    """Move the entries marked in ``abits`` to the front, in order, one vector at a time (the
    store of a vector's packed lanes lands at or before the vector itself)."""
    n = len(u)
    lanes = 64 // u.itemsize
    nv = k = 0
    while k + lanes <= n:
        m = _vector_mask(abits, k, lanes)
        compress_store(u, k, u, nv, m)
        nv += popcount(m)
        k += lanes
    while k < n:
        u[nv] = u[k]
        nv += (np.int64(abits[k >> 3]) >> (k & 7)) & 1
        k += 1
    return nv


@nb.njit(cache=True, nogil=True)
def encode_all(x, rows, row_starts, out, out_starts, sparse_only, capped, capu, used):
    """Message p holds rows rows[row_starts[p]:row_starts[p + 1]] of ``x`` (an integer view),
    written at out[out_starts[p]:] in the smaller form (or the sparse one when
    ``sparse_only``); used[p] = its bytes. The rows are gathered into the dense form's place;
    the bitmaps are built in the spare bytes after it and move down behind the values when the
    sparse form is chosen."""
    batch, item = x.shape[1], x.itemsize
    for p in range(len(row_starts) - 1):
        r0, r1 = row_starts[p], row_starts[p + 1]
        n = (r1 - r0) * batch
        nb_ = (n + 7) // 8
        o = out_starts[p]
        head = out[o:o + HEADER].view(np.int64)
        u = out[o + HEADER:o + HEADER + n * item].view(x.dtype)
        tail = o + HEADER + n * item
        for i in range(r1 - r0):
            xr = x[rows[r0 + i]]
            for b in range(batch):
                u[i * batch + b] = xr[b]
        abits = out[tail:tail + nb_]
        bbits = out[tail + nb_:tail + 2 * nb_]
        nv, n_cap = _classify(u, abits, bbits, capped, capu)
        sparse = HEADER + nv * item + nb_ * (2 if capped else 1)
        if not sparse_only and sparse >= HEADER + n * item:
            head[0], head[1] = -1, 0
            used[p] = HEADER + n * item
            continue
        _compact(u, abits)
        start = o + HEADER + nv * item
        for k in range(nb_ * (2 if capped else 1)):  # forward copy: start <= tail
            out[start + k] = out[tail + k]
        head[0], head[1] = nv, n_cap
        used[p] = sparse


@nb.njit(cache=True, nogil=True)
def _unpack(u, abits, bbits, flat, capped, capu):
    """Inverse of classify + compact, one vector at a time; reads exactly the nv values."""
    n = len(flat)
    lanes = 64 // flat.itemsize
    v = k = 0
    zero = np.uint64(0)
    while k + lanes <= n:
        m = _vector_mask(abits, k, lanes)
        expand_load(u, v, flat, k, m, _vector_mask(bbits, k, lanes) if capped else zero, capu)
        v += popcount(m)
        k += lanes
    while k < n:
        if (np.int64(abits[k >> 3]) >> (k & 7)) & 1:
            flat[k] = u[v]
            v += 1
        elif capped and (np.int64(bbits[k >> 3]) >> (k & 7)) & 1:
            flat[k] = capu
        else:
            flat[k] = 0
        k += 1


@nb.njit(cache=True, nogil=True)
def decode_all(stage, in_starts, x, first_row, counts, capped, capu, pop):
    """Rebuild rows first_row.. of ``x`` (an integer view), counts[p] rows per message, from the
    messages at stage[in_starts[p]:in_starts[p + 1]]. Returns the index of the first corrupt
    message (header or bitmaps inconsistent), or -1; nothing is read or written out of bounds
    either way."""
    batch, item = x.shape[1], x.itemsize
    row = first_row
    for p in range(len(counts)):
        n = counts[p] * batch
        nb_ = (n + 7) // 8
        o, limit = in_starts[p], in_starts[p + 1]
        flat = x[row:row + counts[p]].reshape(n)
        row += counts[p]
        head = stage[o:o + HEADER].view(np.int64)
        nv, n_cap = head[0], head[1]
        if nv == -1 and n_cap == 0:
            u = stage[o + HEADER:o + HEADER + n * item].view(x.dtype)
            for k in range(n):
                flat[k] = u[k]
            continue
        nmaps = 2 if capped else 1
        if not (0 <= nv and 0 <= n_cap and nv + n_cap <= n and (capped or n_cap == 0)
                and o + HEADER + nv * item + nmaps * nb_ <= limit):
            return p
        start = o + HEADER + nv * item
        abits = stage[start:start + nb_]
        bbits = stage[start + nb_:start + nmaps * nb_]
        if _count(abits, pop) != nv or (capped and _count(bbits, pop) != n_cap):
            return p
        if capped:
            for c in range(nb_):
                if abits[c] & bbits[c]:
                    return p
        rem = n & 7  # the last byte's padding bits must be zero
        if rem and (np.int64(abits[nb_ - 1]) | (np.int64(bbits[nb_ - 1]) if capped else 0)) >> rem:
            return p
        u = stage[o + HEADER:o + HEADER + nv * item].view(x.dtype)
        _unpack(u, abits, bbits, flat, capped, capu)
    return -1


@nb.njit(cache=True, nogil=True)
def _slope(v, cap) -> bool:  # noqa: ANN001
    v = value(v)  # bfloat16 bits widened
    return v > 0 and (cap < 0 or v < cap)


@nb.njit(cache=True, nogil=True, inline="always")
def _fold_lanes(x):  # noqa: ANN001, ANN202
    """Entries a step of the folds: a vector of the partial sums (bfloat16 outputs x beside
    float32 partial sums: 16, as float32's)."""
    return 16 if x.itemsize == 2 else 64 // x.itemsize


@nb.njit(cache=True, nogil=True)
def slope_count(x, rows, cap):
    """Entries of x[rows] where h' is 1 (0 < x, and x < cap when cap >= 0)."""
    batch = x.shape[1]
    lanes = _fold_lanes(x)
    n = 0
    for r in rows:
        xr = x[r]
        b = 0
        while b + lanes <= batch:
            n += popcount(slope_lanes(xr, b, cap))
            b += lanes
        while b < batch:
            n += _slope(xr[b], cap)
            b += 1
    return n


@nb.njit(cache=True, nogil=True)
def fold_pack(partials, x, rows, cap, out):
    """out = the entries of ``partials`` (one row per entry of ``rows``) where h'(x[rows]) is
    1, in row-major order; returns their number. Vector stores: ``out`` needs as many entries
    as ``partials`` (the packed ones and room for a vector's spare lanes). In place too: each
    store lands no later than the vector just loaded."""
    batch = x.shape[1]
    lanes = _fold_lanes(x)
    n = 0
    for i in range(len(rows)):
        xr, pr = x[rows[i]], partials[i]
        b = 0
        while b + lanes <= batch:
            m = slope_lanes(xr, b, cap)
            compress_store(pr, b, out, n, m)
            n += popcount(m)
            b += lanes
        while b < batch:
            out[n] = pr[b]
            n += _slope(xr[b], cap)
            b += 1
    return n


@nb.njit(cache=True, nogil=True)
def fold_add(g, rows, values, x, cap):
    """g[rows] += the packed partial sums, each where h'(x[rows]) is 1 (fold_pack's order);
    vector by vector, adding 0 where the slope is 0 (the owner multiplies those by 0)."""
    batch = x.shape[1]
    lanes = _fold_lanes(x)
    n = 0
    for r in rows:
        xr, gr = x[r], g[r]
        b = 0
        while b + lanes <= batch:
            m = slope_lanes(xr, b, cap)
            expand_add(values, n, gr, b, m)
            n += popcount(m)
            b += lanes
        while b < batch:
            if _slope(xr[b], cap):
                gr[b] += values[n]
                n += 1
            b += 1


@nb.njit(cache=True, nogil=True)
def add_rows(g, rows, block):
    """g[rows[i]] += block[i] (rows unique)."""
    for i in range(len(rows)):
        gr, br = g[rows[i]], block[i]
        for b in range(g.shape[1]):
            gr[b] += br[b]


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Compile (or load from cache) for ``dtypes`` (each loaded type costs resident memory)."""
    rows = np.zeros(1, np.int64)
    starts = np.array([0, 1], np.int64)
    for dt in dtypes:
        it = {2: np.int16, 4: np.int32, 8: np.int64}[np.dtype(dt).itemsize]
        x = np.ones((1, 2), dt)
        buf = np.zeros(64, np.uint8)
        used = np.zeros(1, np.int64)
        for capped in (False, True):
            encode_all(x.view(it), rows, starts, buf, starts[:1], True, capped, it(0), used)
            decode_all(buf, np.array([0, 64]), x.view(it), 0, rows + 1, capped, it(0), POP)
        sums = np.float32 if np.dtype(dt) == np.uint16 else dt  # bfloat16's folds: float32
        partials = np.ones((1, 2), sums)
        vals = np.zeros(2, sums)
        slope_count(x, rows, -1.0)
        fold_pack(partials, x, rows, -1.0, vals)
        fold_add(partials, rows, vals, x, -1.0)
        add_rows(partials, rows, partials)


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
