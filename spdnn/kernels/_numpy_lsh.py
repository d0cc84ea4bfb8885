"""LSH-selected neurons in numpy (spdnn.kernels.hashing, spdnn.runtime.lsh_layer), for the
scipy backend: what spdnn.kernels._numba_lsh computes, with the same arguments and the same
results. Every sum is taken in the kernels' order (np.add.at adds in the order given), so the
values agree to the bit."""

from __future__ import annotations

import numpy as np

from spdnn.kernels.ranges import concat_ranges, segment_ids


def retrieve(codes: np.ndarray, keys: np.ndarray, rows: np.ndarray, starts: np.ndarray,
             shift: int, label_ptr: np.ndarray, label_rows: np.ndarray,
             label_weights: np.ndarray, n_rows: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per sample, the union of the rows in the buckets its codes hit and of its label rows
    (-1: not here), ascending: (ptr, rows, target mass, tables that hit it, plus one more than
    the tables for a row that joined as a label)."""
    batch, n_tables = codes.shape
    sample_parts, row_parts = [], []
    for t in range(n_tables):  # the whole bucket of each sample's code (no directory needed)
        lo = np.searchsorted(keys[t], codes[:, t], side="left")
        hi = np.searchsorted(keys[t], codes[:, t], side="right")
        sample_parts.append(np.repeat(np.arange(batch, dtype=np.int64), hi - lo))
        row_parts.append(rows[t][concat_ranges(lo, hi - lo)].astype(np.int64))
    hit = np.concatenate([np.zeros(0, np.int64), *sample_parts]) * n_rows + \
        np.concatenate([np.zeros(0, np.int64), *row_parts])
    labelled = len(label_ptr) > 0
    if labelled:
        owner = segment_ids(label_ptr)
        keep = label_rows >= 0
        label = owner[keep] * n_rows + label_rows[keep]
        weight = label_weights[keep]
    else:
        label, weight = np.zeros(0, np.int64), label_weights[:0]
    pairs, hits = np.unique(np.concatenate([hit, label]), return_counts=True)
    from_labels = np.searchsorted(pairs, label)
    joined = np.zeros(len(pairs), dtype=bool)
    joined[from_labels] = True
    hits = hits - np.bincount(from_labels, minlength=len(pairs))  # tables' hits alone
    mass = np.zeros(len(pairs), dtype=label_weights.dtype)
    np.maximum.at(mass, from_labels, weight)
    hits = hits + np.where(joined, n_tables + 1, 0)
    ptr = np.zeros(batch + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs // n_rows, minlength=batch), out=ptr[1:])
    return ptr, pairs % n_rows, mass, hits.astype(np.int64)


def _by_row(ptr: np.ndarray, act: np.ndarray, key: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ordered by key[row], samples ascending within a key: (pair, sample)."""
    pair = np.argsort(key[act], kind="stable")
    return pair, segment_ids(ptr)[pair]


def sampled_forward(ptr: np.ndarray, act: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                    data: np.ndarray, bias: np.ndarray, xt: np.ndarray, z: np.ndarray,
                    dense: bool) -> None:
    """z[a] = bias[r] + W[r] . xt[s] for every active pair a = (r, s), summed as the kernel's
    ``_dot``: eight partial sums over the entries j = l mod 8 below the last multiple of 8,
    added as a tree, then the entries past it one after the other."""
    n = indptr[act + 1] - indptr[act]
    entry = concat_ranges(indptr[act], n)
    pair = np.repeat(np.arange(len(act)), n)
    j = entry - np.repeat(indptr[act], n)  # the entry's place in its row
    col = j if dense else indices[entry]
    terms = data[entry] * xt[segment_ids(ptr)[pair], col]
    tail = j >= np.repeat(n - n % 8, n)
    lanes = np.zeros((len(act), 8), dtype=data.dtype)
    np.add.at(lanes, (pair[~tail], j[~tail] % 8), terms[~tail])
    a = lanes.T
    acc = bias[act] + (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])))
    np.add.at(acc, pair[tail], terms[tail])
    z[:] = acc


def sampled_backward(ptr: np.ndarray, act: np.ndarray, delta: np.ndarray, indptr: np.ndarray,
                     indices: np.ndarray, data: np.ndarray, xt: np.ndarray, slot: np.ndarray,
                     entry_start: np.ndarray, gw: np.ndarray, gb: np.ndarray,
                     part_t: np.ndarray, dense: bool) -> None:
    """For every active pair (r, s): gb[slot[r]] += delta, gw[entry_start[slot[r]] + j] +=
    delta x[s, col_j], part_t[s, col_j] += delta W[r, j]; a row's sums in sample order, a
    sample's in row order, as the kernel takes them."""
    pair, sample = _by_row(ptr, act, slot)
    rows = act[pair]
    d = delta[pair]
    np.add.at(gb, slot[rows], d)
    n = indptr[rows + 1] - indptr[rows]
    entry = concat_ranges(indptr[rows], n)
    j = entry - np.repeat(indptr[rows], n)
    col = j if dense else indices[entry]
    s = np.repeat(sample, n)
    dd = np.repeat(d, n)
    np.add.at(gw, np.repeat(entry_start[slot[rows]], n) + j, dd * xt[s, col])
    np.add.at(part_t, (s, col), dd * data[entry])


def warm_up(*, hashing: bool = True) -> None:
    """Nothing to compile."""
