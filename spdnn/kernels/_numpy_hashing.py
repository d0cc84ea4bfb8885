"""LSH's hashing in numpy (spdnn.kernels.hashing), for the scipy backend: what
spdnn.kernels._numba_hashing computes, with the same arguments and the same codes. Rows are
hashed a block at a time, as arrays (no Python loop per row)."""

from __future__ import annotations

import numpy as np

from spdnn.kernels.ranges import concat_ranges

# rows hashed at a time by simhash_codes (its pairs of entries and functions: one array)
SIMHASH_ROWS = 1024


def _probe(f: np.ndarray, attempt: int, n: int) -> np.ndarray:
    """The function whose winner an empty DWTA bin borrows at this attempt (densification)."""
    return (f * 40503 + attempt * 2654435761 + attempt * attempt * 97) % n


def _dense_rows(indptr: np.ndarray, indices: np.ndarray, columns: np.ndarray,
                data: np.ndarray, rows: np.ndarray, dense_rows: bool, n_in: int) -> np.ndarray:
    """The rows as a dense (rows x n_in) block in input coordinates (entry e of a row at
    ``columns[indices[e]]``; with ``dense_rows``, entry c of a row at ``columns[c]``)."""
    counts = indptr[rows + 1] - indptr[rows]
    entry = concat_ranges(indptr[rows], counts)
    at = np.repeat(np.arange(len(rows)), counts)
    local = entry - np.repeat(indptr[rows], counts) if dense_rows else indices[entry]
    block = np.zeros((len(rows), n_in), dtype=data.dtype)
    block[at, columns[local]] = data[entry]
    return block


def dwta_codes(indptr: np.ndarray, indices: np.ndarray, columns: np.ndarray,
               data: np.ndarray, sel: np.ndarray, dense_rows: bool, members: np.ndarray,
               k: int, tables: int, n_in: int, block: int, out: np.ndarray) -> None:
    """The codes of rows ``sel`` (out[t, i]): densified winner-take-all, as the numba half."""
    n_fn, base = members.shape
    functions = np.arange(n_fn, dtype=np.int64)
    for r0 in range(0, len(sel), block):
        rows = sel[r0:r0 + block]
        values = _dense_rows(indptr, indices, columns, data, rows, dense_rows, n_in)[:, members]
        # a nonzero value above every other wins, the first among equals; -inf and NaN never
        values[(values == 0) | ~(values > -np.inf)] = -np.inf
        arg = np.argmax(values, axis=2).astype(np.int64)
        arg[np.max(values, axis=2) == -np.inf] = -1
        won = arg.copy()
        for attempt in range(1, 2 * n_fn + 1):  # an empty bin borrows from the winners
            empty = won < 0
            if not empty.any():
                break
            won[empty] = arg[:, _probe(functions, attempt, n_fn)][empty]
        won = np.maximum(won, 0)
        code = np.zeros((len(rows), tables), dtype=np.int64)
        for j in range(k):  # table t packs functions t k, ..., t k + k - 1, the first highest
            code = code * base + won[:, np.arange(tables) * k + j]
        out[:, r0:r0 + len(rows)] = code.T


def simhash_codes(indptr: np.ndarray, indices: np.ndarray, columns: np.ndarray,
                  data: np.ndarray, sel: np.ndarray, col_ptr: np.ndarray, col_fn: np.ndarray,
                  col_sign: np.ndarray, k: int, tables: int, out: np.ndarray) -> None:
    """The codes of rows ``sel`` (out[t, i]): signed random projections summed in float64,
    each function's sum in the order of the row's entries, as the numba half."""
    n_fn = k * tables
    weights = 2 ** np.arange(k - 1, -1, -1, dtype=np.int64)
    for r0 in range(0, len(sel), SIMHASH_ROWS):
        rows = sel[r0:r0 + SIMHASH_ROWS]
        counts = indptr[rows + 1] - indptr[rows]
        entry = concat_ranges(indptr[rows], counts)
        c = columns[indices[entry]]
        fans = col_ptr[c + 1] - col_ptr[c]  # the functions each entry feeds
        feed = concat_ranges(col_ptr[c], fans)
        owner = np.repeat(np.repeat(np.arange(len(rows)), counts), fans)
        terms = col_sign[feed] * np.repeat(data[entry].astype(np.float64), fans)
        # bincount adds each target's terms in their order here: the kernel's order
        acc = np.bincount(owner * n_fn + col_fn[feed], weights=terms,
                          minlength=len(rows) * n_fn).reshape(len(rows), n_fn)
        bits = (acc > 0).reshape(len(rows), tables, k).astype(np.int64)
        out[:, r0:r0 + len(rows)] = (bits @ weights).T


def bucket_order(codes: np.ndarray, bits: int, keys: np.ndarray, rows: np.ndarray) -> None:
    """The rows ordered by their code, ties by row, as (keys, rows): a stable sort."""
    order = np.argsort(codes, kind="stable")
    keys[:] = codes[order]
    rows[:] = order


def warm_up() -> None:
    """Nothing to compile."""
