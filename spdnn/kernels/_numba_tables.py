"""numba kernels that keep LSH tables (spdnn.kernels.hashing.Tables) up to date between
rebuilds: the codes that changed logged, the rows that changed moved in their tables, and
each table's directory of key prefixes. No Python loop per row.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from spdnn.kernels.cache_loads import lean_cache_loads


@nb.njit(cache=True, nogil=True)
def directory(keys, shift, starts):
    """starts[t, p]: where the keys of table t with key >> shift >= p begin (keys ascending),
    for p up to starts.shape[1] - 1 (then past the end)."""
    tables, n = keys.shape
    top = starts.shape[1] - 1
    for t in range(tables):
        kt, st = keys[t], starts[t]
        p = 0
        for i in range(n):
            v = kt[i] >> shift
            while p <= v and p <= top:
                st[p] = i
                p += 1
        while p <= top:
            st[p] = n
            p += 1


@nb.njit(cache=True, nogil=True)
def log_changes(codes, sel, fresh, log, at):
    """Rows ``sel`` take the codes ``fresh`` (L x m) in ``codes`` (L x n); each code that
    changes is logged as (table, row, old, new) in the columns of ``log`` (4 x room) from
    ``at`` on. Returns the new end of the log, or -1 once it has no room (the codes are still
    all written)."""
    for t in range(codes.shape[0]):
        ct, ft = codes[t], fresh[t]
        for i in range(len(sel)):
            r = sel[i]
            if ft[i] != ct[r]:
                if 0 <= at < log.shape[1]:
                    log[0, at], log[1, at], log[2, at], log[3, at] = t, r, ct[r], ft[i]
                    at += 1
                else:
                    at = -1
                ct[r] = ft[i]
    return at


@nb.njit(cache=True, nogil=True)
def _position(keys, rows, key, row):
    """Where (key, row) is, or would go, in a table ordered by key, ties by row."""
    lo = np.searchsorted(keys, key, side="left")
    hi = np.searchsorted(keys, key, side="right")
    return lo + np.searchsorted(rows[lo:hi], row)


@nb.njit(cache=True, nogil=True)
def _move(kt, rt, gone, nk, nr, tmp_k, tmp_r):
    """One table: the entries at the old places ``gone`` leave, (nk, nr) (ordered by key, then
    row) enter; the unchanged stretches between are copied whole."""
    n, c = len(kt), len(nk)
    enter = np.empty(c, np.int64)
    for j in range(c):
        enter[j] = _position(kt, rt, nk[j], nr[j])  # in the old order
    out_at = np.sort(gone)
    i = o = a = j = 0
    while i < n or j < c:
        stop = min(out_at[a] if a < c else n, enter[j] if j < c else n)
        tmp_k[o:o + stop - i] = kt[i:stop]
        tmp_r[o:o + stop - i] = rt[i:stop]
        o += stop - i
        i = stop
        if j < c and enter[j] == i:
            tmp_k[o], tmp_r[o] = nk[j], nr[j]
            o += 1
            j += 1
        elif a < c and out_at[a] == i:
            i += 1
            a += 1
    kt[:] = tmp_k
    rt[:] = tmp_r


@nb.njit(cache=True, nogil=True)
def move_rows(keys, rows, log):
    """Each logged change (table, row, old, new; a table's rows ascending, as log_changes
    writes them chunk after chunk) moves its row from the old code's place to the new one's,
    each table kept ordered by (key, row): the same arrays as a sort of every code. A code
    rarely changes between rebuilds."""
    tables, n = keys.shape
    count = np.zeros(tables + 1, np.int64)
    for e in range(log.shape[1]):
        count[log[0, e] + 1] += 1
    for t in range(tables):
        count[t + 1] += count[t]
    order = np.empty(log.shape[1], np.int64)  # the log by table, stable
    at = count[:-1].copy()
    for e in range(log.shape[1]):
        order[at[log[0, e]]] = e
        at[log[0, e]] += 1
    tmp_k, tmp_r = np.empty(n, keys.dtype), np.empty(n, rows.dtype)
    for t in range(tables):
        mine = order[count[t]:count[t + 1]]
        if len(mine) == 0:
            continue
        kt, rt = keys[t], rows[t]
        gone = np.empty(len(mine), np.int64)
        for j in range(len(mine)):
            gone[j] = _position(kt, rt, log[2, mine[j]], log[1, mine[j]])
        by_key = mine[np.argsort(log[3, mine], kind="mergesort")]  # stable: rows ascending
        _move(kt, rt, gone, log[3, by_key], log[1, by_key], tmp_k, tmp_r)


def warm_up() -> None:
    """Compile the kernels now, for int32 and int64 keys."""
    log = np.zeros((4, 1), np.int64)
    for index in (np.int32, np.int64):
        keys, rows = np.zeros((1, 1), index), np.zeros((1, 1), np.int32)
        directory(keys, 0, np.zeros((1, 2), np.int32))
        log_changes(np.zeros((1, 1), np.int64), np.zeros(1, np.int64),
                    np.zeros((1, 1), np.int64), log, 0)
        move_rows(keys, rows, log[:, :0])


lean_cache_loads(globals())  # loaded without numba's registries (spdnn.kernels.cache_loads)
