"""Where a topology update grows connections on a rank's rows (the rule:
spdnn.model.sparsity): SET's draws keyed by the row (or, in layer scope, the layer's draws in
order, each checked by its row's owner), RigL's largest |dL/dw| among the columns a row does
not hold, scored in blocks of rows, never a dense gradient of the layer."""

from __future__ import annotations

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.kernels.selection import largest_per_row
from spdnn.model.sparsity import SparseUpdate, grow_draws, layer_draws
from spdnn.runtime.bit_search import float_bits, in_sorted, select_least
from spdnn.runtime.local_layer import LocalLayer


def weighted(score: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """|dL/dw| scores times ``--grow-locality``'s column weights, in float64 and at most the
    largest finite float64 (a float32 product overflows to inf, and 0 x inf is NaN: the
    selection needs finite scores); the reference weights them alike."""
    out = score.astype(np.float64)
    out *= weight
    return np.minimum(out, np.finfo(np.float64).max, out=out)


# Rows whose RigL scores are computed at once (bounds the dense block to ROWS x n_in).
SCORE_ROWS = 256


def layer_growth(comm: Communicator, update: SparseUpdate, layer: LocalLayer,
                 keep_keys: np.ndarray, n_in: int, n_out: int, k: int, number: int, count: int,
                 scores: tuple | None) -> tuple[np.ndarray, np.ndarray]:
    """Layer scope: ``count`` connections grown anywhere the layer holds none (SET: the
    layer's draws in order; RigL: the largest |dL/dw|, ties the lower row, then column);
    returns those in this rank's rows (local row, column). Collective."""
    rows = layer.rows
    local = np.full(n_out, -1, dtype=np.int64)
    local[rows] = np.arange(len(rows))
    held = np.sort(rows[keep_keys // n_in].astype(np.int64) * n_in + keep_keys % n_in)
    if scores is not None:
        cand_bits, cand_keys = rigl_candidates(scores[0], scores[1], keep_keys, n_in,
                                                rows, count, scores[2] if len(scores) > 2
                                                else None)
        chosen = cand_keys[select_least(comm, cand_bits, cand_keys, count)]
    else:
        taken = np.zeros(0, dtype=np.int64)
        found: list[np.ndarray] = []
        first, need = 0, count
        while need > 0:
            size = max(2 * need, 64)
            keys = layer_draws(update.seed, number, k, first, size, n_out, n_in)
            first += size
            mine = local[keys // n_in] >= 0
            free = (mine & ~in_sorted(held, keys)).astype(np.int8)
            free = comm.allreduce(free, "max") > 0  # its row's owner knows
            _, at = np.unique(keys, return_index=True)
            once = np.zeros(len(keys), dtype=bool)
            once[at] = True  # a position's first draw in this chunk
            ok = np.flatnonzero(free & once & ~in_sorted(taken, keys))[:need]
            found.append(keys[ok])
            taken = np.sort(np.concatenate([taken, keys[ok]]))
            need -= len(ok)
        chosen = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    chosen = chosen[local[chosen // n_in] >= 0]
    return local[chosen // n_in], chosen % n_in


def set_growth(update: SparseUpdate, rows: np.ndarray, counts: np.ndarray,
               keep_keys: np.ndarray, n_in: int, k: int, number: int,
               near: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """SET: each row takes its draws in order (``grow_draws``), skipping a column it keeps
    or took already, until it has grown ``counts[r]``. One draw per needing row a round."""
    got = np.zeros(len(rows), dtype=np.int64)
    taken: list[np.ndarray] = []
    taken_keys = np.zeros(0, dtype=np.int64)
    attempt = 0
    need = np.flatnonzero(counts > got)
    while len(need):
        cand = grow_draws(update.seed, number, k, rows[need], attempt, n_in, near,
                          update.locality)
        keys = need * n_in + cand
        ok = ~in_sorted(keep_keys, keys) & ~in_sorted(taken_keys, keys)
        taken.append(keys[ok])
        taken_keys = np.sort(np.concatenate([taken_keys, keys[ok]]))
        got[need[ok]] += 1
        attempt += 1
        need = np.flatnonzero(counts > got)
    keys = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
    return keys // n_in, keys % n_in


def rigl_candidates(delta: np.ndarray, x: np.ndarray, keep_keys: np.ndarray, n_in: int,
                     rows: np.ndarray, count: int, weight: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """This rank's best ``count`` growth candidates in layer scope, as (bits, key) of least
    first: the complement of |dL/dw|'s bits (the largest first) and row x n_in + column."""
    best_bits = np.zeros(0, dtype=np.uint64)
    best_keys = np.zeros(0, dtype=np.int64)
    keep_rows, keep_cols = keep_keys // n_in, keep_keys % n_in
    for lo in range(0, len(rows), SCORE_ROWS):
        hi = min(len(rows), lo + SCORE_ROWS)
        score = np.abs(delta[lo:hi] @ x.T).astype(np.float64)
        if weight is not None:
            score *= weight
        free = np.ones(score.shape, dtype=bool)
        inside = (keep_rows >= lo) & (keep_rows < hi)
        free[keep_rows[inside] - lo, keep_cols[inside]] = False
        r, j = np.nonzero(free)
        bits = ~float_bits(score[r, j])
        keys = rows[lo + r].astype(np.int64) * n_in + j
        bits, keys = np.concatenate([best_bits, bits]), np.concatenate([best_keys, keys])
        keep = np.lexsort((keys, bits))[:count]
        best_bits, best_keys = bits[keep], keys[keep]
    return best_bits, best_keys


def rigl_growth(delta: np.ndarray, x: np.ndarray, counts: np.ndarray, keep_keys: np.ndarray,
                 n_in: int, weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """RigL: per row, the ``counts[r]`` columns of largest |dL/dw| = |delta_r . x_j| among
    those it does not keep (ties: the lower column), in blocks of SCORE_ROWS rows."""
    rows_out, cols_out = [], []
    keep_rows, keep_cols = keep_keys // n_in, keep_keys % n_in
    for lo in range(0, len(counts), SCORE_ROWS):
        hi = min(len(counts), lo + SCORE_ROWS)
        if not counts[lo:hi].any():
            continue
        score = delta[lo:hi] @ x.T
        np.abs(score, out=score)
        if weight is not None:  # in float64, kept finite: any W the option takes ranks rows
            score = weighted(score, weight)
        inside = (keep_rows >= lo) & (keep_rows < hi)
        score[keep_rows[inside] - lo, keep_cols[inside]] = -np.inf
        rows, cols = largest_per_row(score, counts[lo:hi])
        rows_out.append(rows + lo)
        cols_out.append(cols)
    if not rows_out:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows_out), np.concatenate(cols_out)
