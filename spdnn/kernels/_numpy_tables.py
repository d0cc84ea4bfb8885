"""The LSH tables' upkeep in numpy (spdnn.kernels.hashing.Tables), for the scipy backend: what
spdnn.kernels._numba_tables computes, with the same arguments and the same arrays."""

from __future__ import annotations

import numpy as np


def directory(keys: np.ndarray, shift: int, starts: np.ndarray) -> None:
    """starts[t, p]: where the keys of table t with key >> shift >= p begin."""
    prefixes = np.arange(starts.shape[1])
    for t in range(keys.shape[0]):
        starts[t] = np.searchsorted(keys[t] >> shift, prefixes, side="left")


def log_changes(codes: np.ndarray, sel: np.ndarray, fresh: np.ndarray, log: np.ndarray,
                at: int) -> int:
    """Rows ``sel`` take the codes ``fresh`` in ``codes``; each change logged as (table, row,
    old, new) from ``at`` on. Returns the new end of the log, or -1 once it has no room."""
    for t in range(codes.shape[0]):
        changed = np.flatnonzero(fresh[t] != codes[t, sel])
        rows = sel[changed]
        if 0 <= at and at + len(changed) <= log.shape[1]:
            end = at + len(changed)
            log[0, at:end], log[1, at:end] = t, rows
            log[2, at:end], log[3, at:end] = codes[t, rows], fresh[t, changed]
            at = end
        elif len(changed):
            at = -1
        codes[t, rows] = fresh[t, changed]
    return at


def move_rows(keys: np.ndarray, rows: np.ndarray, log: np.ndarray) -> None:
    """Each logged change (table, row, old, new) takes effect, every table kept ordered by
    (key, row): a sort of the changed tables."""
    for t in np.unique(log[0]):
        mine = log[:, log[0] == t]
        kt, rt = keys[t], rows[t]
        place = np.empty(len(rt), dtype=np.int64)
        place[rt] = np.arange(len(rt))
        kt[place[mine[1]]] = mine[3]
        order = np.lexsort((rt, kt))
        keys[t], rows[t] = kt[order], rt[order]


def warm_up() -> None:
    """Nothing to compile."""
