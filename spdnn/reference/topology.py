"""The reference's topology updates (SET, RigL): drop and grow on whole layers, as the runtime does
on each rank's rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.model.network import Network
from spdnn.model.sparsity import (
    SparseUpdate,
    changeable,
    drop_counts,
    grow_draws,
    grown_values,
    layer_draws,
)
from spdnn.reference.passes import layer_gradients


def update_topology(net: Network, opt: Any, update: SparseUpdate, step: int,  # noqa: ANN401
                    x0: np.ndarray, y: np.ndarray, loss: str, masks: list | None = None,
                    owners: tuple[np.ndarray, ...] | None = None) -> list[dict[str, int]]:
    """The topology update after optimizer step ``step`` (spdnn.model.sparsity), row by row
    or over the whole layer: ``net``'s layers and ``opt``'s parameters and state replaced.
    RigL scores on the batch ``x0``, ``y`` (with its dropout ``masks``) at the weights after
    the step. ``owners`` (a plan's, per layer of neurons) with ``update.locality``: the
    columns the row's rank holds before the update weigh W times (``near_columns``). Returns
    per layer the connections dropped and grown (entries that left, entries that came)."""
    fraction = update.fraction(step)
    scores = layer_gradients(net, x0, y, loss, masks) if update.mode == "rigl" else None
    layers, counts = list(net.layers), []
    for k, layer in enumerate(net.layers, start=1):
        w = layer.weight
        n_out, n_in = w.shape
        if not changeable(n_out, n_in, w.nnz):
            counts.append({"dropped": 0, "grown": 0})
            continue
        g = None if scores is None else scores[k - 1]
        near = near_columns(w, owners[k - 1], owners[k]) \
            if owners is not None and update.locality != 1 else None
        if g is not None and near is not None and update.scope == "row":
            # RigL's scores W times higher near (layer scope: _layer_choice), in float64 and
            # at most the largest finite float64
            g = np.abs(g).astype(np.float64)
            for i in range(n_out):
                g[i, near[i]] *= update.locality
            g = np.minimum(g, np.finfo(np.float64).max)
        kept, grown = (_layer_choice if update.scope == "layer" else _row_choice)(
            w, g, fraction, update, step, k, near)
        cols_out, vals_out, src_out, ptr = [], [], [], [0]
        left = came = 0
        for i in range(n_out):
            lo, hi = int(w.indptr[i]), int(w.indptr[i + 1])
            old = {int(w.indices[e]): e for e in range(lo, hi)}
            new = sorted(kept[i] | set(grown[i]))
            fresh = [j for j in new if j not in old]
            start = grown_values(update.seed, update.index(step), k, np.full(len(fresh), i),
                                 np.array(fresh, dtype=np.int64), n_in, n_out, update.mode,
                                 w.dtype)
            values = dict(zip(fresh, start))
            for j in new:
                cols_out.append(j)
                src_out.append(old.get(j, -1))
                vals_out.append(w.data[old[j]] if j in old else values[j])
            ptr.append(len(cols_out))
            left += len(set(old) - set(new))
            came += len(fresh)
        weight = sp.csr_matrix((np.array(vals_out, dtype=w.dtype),
                                np.array(cols_out, dtype=w.indices.dtype),
                                np.array(ptr, dtype=w.indptr.dtype)), shape=w.shape)
        layers[k - 1] = replace(layer, weight=weight)
        opt.resize(2 * (k - 1), weight.data, np.array(src_out, dtype=np.int64))
        counts.append({"dropped": left, "grown": came})
    object.__setattr__(net, "layers", tuple(layers))
    return counts


def near_columns(w: sp.csr_matrix, owner_in: np.ndarray, owner_out: np.ndarray
                 ) -> list[np.ndarray]:
    """Per row, the columns its rank holds: the inputs it owns and those its rows read."""
    held: dict[int, np.ndarray] = {}
    for r in np.unique(owner_out):
        mine = np.flatnonzero(owner_out == r)
        read = np.unique(np.concatenate([w.indices[w.indptr[i]:w.indptr[i + 1]] for i in mine]))
        held[int(r)] = np.union1d(np.flatnonzero(owner_in == r), read).astype(np.int64)
    return [held[int(owner_out[i])] for i in range(w.shape[0])]


def _row_choice(w: sp.csr_matrix, g: np.ndarray | None, fraction: float,
                update: SparseUpdate, step: int, k: int, near: list | None
                ) -> tuple[list[set], list[list]]:
    """Row scope: per row, the columns it keeps and the columns it grows."""
    kept_rows, grown_rows = [], []
    for i in range(w.shape[0]):
        lo, hi = int(w.indptr[i]), int(w.indptr[i + 1])
        cols, vals = w.indices[lo:hi].tolist(), w.data[lo:hi]
        c = int(drop_counts(np.array([hi - lo]), fraction)[0])
        order = sorted(range(hi - lo), key=lambda e: (abs(float(vals[e])), cols[e]))
        kept = {cols[e] for e in order[c:]}
        if g is not None:
            free = [j for j in range(w.shape[1]) if j not in kept]
            grown = sorted(free, key=lambda j: (-abs(float(g[i, j])), j))[:c]
        else:
            grown, attempt = [], 0
            while len(grown) < c:
                j = int(grow_draws(update.seed, update.index(step), k, np.array([i]), attempt,
                                   w.shape[1], None if near is None else near[i],
                                   update.locality)[0])
                attempt += 1
                if j not in kept and j not in grown:
                    grown.append(j)
        kept_rows.append(kept)
        grown_rows.append(grown)
    return kept_rows, grown_rows


def _layer_choice(w: sp.csr_matrix, g: np.ndarray | None, fraction: float,
                  update: SparseUpdate, step: int, k: int, near: list | None
                  ) -> tuple[list[set], list[list]]:
    """Layer scope: the whole layer's smallest |w| go (ties: row, then column), as many grow
    anywhere it holds no connection; per row, the columns it keeps and grows."""
    n_out, n_in = w.shape
    coo = w.tocoo()
    c = int(drop_counts(np.array([w.nnz]), fraction)[0])
    order = sorted(range(w.nnz), key=lambda e: (abs(float(coo.data[e])), int(coo.row[e]),
                                                int(coo.col[e])))
    held = {(int(coo.row[e]), int(coo.col[e])) for e in order[c:]}
    if g is not None:
        weight = np.ones((n_out, n_in))
        for i, cols in enumerate(near or []):
            weight[i, cols] = update.locality
        free = [(i, j) for i in range(n_out) for j in range(n_in) if (i, j) not in held]
        grown = sorted(free, key=lambda p: (-abs(float(g[p])) * weight[p], p[0], p[1]))[:c]
    else:
        grown, taken, attempt = [], set(), 0
        while len(grown) < c:
            pos = int(layer_draws(update.seed, update.index(step), k, attempt, 1, n_out,
                                  n_in)[0])
            attempt += 1
            p = divmod(pos, n_in)
            if p not in held and p not in taken:
                grown.append(p)
                taken.add(p)
    kept_rows: list[set] = [set() for _ in range(n_out)]
    grown_rows: list[list] = [[] for _ in range(n_out)]
    for i, j in held:
        kept_rows[i].add(j)
    for i, j in grown:
        grown_rows[i].append(j)
    return kept_rows, grown_rows
