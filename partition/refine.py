"""Local search on connectivity-1 under a per-layer balance constraint.

KaHyPar and Mt-KaHyPar balance the total weight only; here every layer k has its own limit
(1 + epsilon) * avg_k + max row weight_k (layer 0 carries no work and has none). The search moves
one layer's vertices at a time to the block with the best km1 gain, and swaps pairs of vertices
where a block is full. Moves applied in one batch never share a net, so every applied gain is
exact and the objective never increases.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from ._kernels import block_counts, vertex_nets
from .hypergraph import Hypergraph, layer_limits
from .time_budget import NO_DEADLINE, Deadline


class BalanceError(RuntimeError):
    """A layer cannot be balanced by single moves (e.g. clusters too coarse)."""


class Refiner:
    """Per-layer-balanced km1 local search; ``max_swap_layer`` > 0 enables the all-pairs swap
    search (quadratic in the layer size: meant for coarse hypergraphs) on layers up to that
    many vertices."""

    def __init__(self, hg: Hypergraph, parts: np.ndarray, nparts: int, epsilon: float,
                 limits: np.ndarray | None = None, max_swap_layer: int = 0,
                 frozen_inputs: bool = False) -> None:
        self.max_swap_layer = max_swap_layer
        # A window of a larger network (partition/windows.py): its input layer belongs to the
        # window before and is never moved.
        self.first_free = 1 if frozen_inputs else 0
        self.hg, self.nparts = hg, nparts
        self.parts = parts.astype(np.int64).copy()
        # The nets of every vertex (CSR, int32 ids); a layer's rows become a weighted matrix
        # only when needed (layer_incidence), not the whole incidence at once.
        self.vertex_indptr, self.vertex_nets = vertex_nets(hg.net_indptr, hg.net_pins,
                                                           hg.n_vertices)
        # phi[e, b]: net e's pins in block b; the narrowest type that holds the largest net
        # (uint8 for RadiX-Net: 64 parts x 2 M nets in 126 MB instead of 504).
        largest = int(np.diff(hg.net_indptr).max(initial=0))
        dtype = np.uint8 if largest < 2**8 else np.uint16 if largest < 2**16 else np.int32
        self.phi = np.zeros((hg.n_nets, nparts), dtype=dtype)
        block_counts(hg.net_indptr, hg.net_pins, self.parts, self.phi)
        n_layers = len(hg.offsets) - 1
        self.loads = np.zeros((n_layers, nparts), dtype=np.int64)
        self.limits = layer_limits(hg, nparts, epsilon)
        for k in range(n_layers):
            lo, hi = hg.offsets[k], hg.offsets[k + 1]
            self.loads[k] = np.bincount(self.parts[lo:hi], weights=hg.vertex_weights[lo:hi],
                                        minlength=nparts)
        self.finished = False  # run() completed (not cut short by its deadline)
        if limits is not None:  # a coarse hypergraph must respect the fine graph's limits
            self.limits = np.minimum(self.limits, limits)

    # ------------------------------------------------------------------ primitives

    def _nets(self, v: int) -> np.ndarray:
        return self.vertex_nets[self.vertex_indptr[v]:self.vertex_indptr[v + 1]]

    def layer_incidence(self, lo: int, hi: int) -> sp.csr_matrix:
        """Vertices lo..hi-1 x nets, each entry the net's weight."""
        a, b = self.vertex_indptr[lo], self.vertex_indptr[hi]
        nets = self.vertex_nets[a:b]
        return sp.csr_matrix((self.hg.net_weights[nets].astype(np.float64), nets,
                              self.vertex_indptr[lo:hi + 1] - a),
                             shape=(hi - lo, self.hg.n_nets))

    def gains(self, lo: int, hi: int) -> np.ndarray:
        """gain[v - lo, b]: km1 decrease if vertex v moves to block b (-inf for its own block)."""
        sub = self.layer_incidence(lo, hi)
        own = self.parts[lo:hi]
        entry_owner = np.repeat(own, np.diff(sub.indptr))
        alone = self.phi[sub.indices, entry_owner] == 1
        removed = np.bincount(np.repeat(np.arange(hi - lo), np.diff(sub.indptr)),
                              weights=sub.data * alone, minlength=hi - lo)
        cols, inverse = np.unique(sub.indices, return_inverse=True)
        compact = sp.csr_matrix((sub.data, inverse, sub.indptr), shape=(hi - lo, len(cols)))
        added = compact @ (self.phi[cols] == 0).astype(np.float64)
        gain = removed[:, None] - added
        gain[np.arange(hi - lo), own] = -np.inf
        return gain

    def move(self, v: int, b: int, layer: int) -> None:
        a = int(self.parts[v])
        nets = self._nets(v)
        self.phi[nets, a] -= 1
        self.phi[nets, b] += 1
        w = self.hg.vertex_weights[v]
        self.loads[layer, a] -= w
        self.loads[layer, b] += w
        self.parts[v] = b

    def fits(self, layer: int, block: int, extra: float) -> bool:
        return self.loads[layer, block] + extra <= self.limits[layer] + 1e-9

    # ------------------------------------------------------------------ balance repair

    def rebalance(self, layer: int) -> None:
        """Move the cheapest vertices out of over-full blocks of one layer."""
        lo, hi = int(self.hg.offsets[layer]), int(self.hg.offsets[layer + 1])
        w = self.hg.vertex_weights[lo:hi]
        while True:
            over = np.flatnonzero(self.loads[layer] > self.limits[layer] + 1e-9)
            if len(over) == 0:
                return
            gain = self.gains(lo, hi)
            room = self.limits[layer] - self.loads[layer]
            for a in over:
                members = np.flatnonzero(self.parts[lo:hi] == a)
                g = gain[members].copy()
                g[w[members][:, None] > room[None, :]] = -np.inf
                flat = int(np.argmax(g))
                i, b = divmod(flat, self.nparts)
                if not np.isfinite(g[i, b]):
                    raise BalanceError(f"cannot balance layer {layer}: no block has room")
                self.move(lo + int(members[i]), b, layer)
                break  # gains changed: recompute

    # ------------------------------------------------------------------ local search

    def improve_layer(self, layer: int) -> int:
        """One batch of exact-gain moves and swaps on one layer; returns the km1 decrease."""
        lo, hi = int(self.hg.offsets[layer]), int(self.hg.offsets[layer + 1])
        gain = self.gains(lo, hi)
        best = gain.max(axis=1)
        cand = np.flatnonzero(best > 0)
        if len(cand) == 0:
            return 0
        cand = cand[np.argsort(-best[cand], kind="stable")]
        locked = np.zeros(self.hg.n_nets, dtype=bool)
        w = self.hg.vertex_weights
        total = 0
        blocked: list[tuple[int, int, float]] = []
        for i in cand:
            v = lo + int(i)
            nets = self._nets(v)
            if locked[nets].any():
                continue
            row = gain[i]
            order = np.argsort(-row, kind="stable")
            moved = False
            for b in order:
                if row[b] <= 0:
                    break
                if self.fits(layer, int(b), w[v]):
                    self.move(v, int(b), layer)
                    locked[nets] = True
                    total += int(row[b])
                    moved = True
                    break
            if not moved:
                blocked.append((int(i), int(order[0]), float(row[order[0]])))
        total += self._swaps(layer, lo, hi, gain, blocked, locked)
        return total

    def _swaps(self, layer: int, lo: int, hi: int, gain: np.ndarray,
               blocked: list[tuple[int, int, float]], locked: np.ndarray) -> int:
        """Pair a blocked move a -> b with the best move b -> a whose nets are untouched."""
        w = self.hg.vertex_weights
        total = 0
        for i, b, g in blocked:
            v = lo + i
            nets_v = self._nets(v)
            if locked[nets_v].any():
                continue
            a = int(self.parts[v])
            members = np.flatnonzero(self.parts[lo:hi] == b)
            if len(members) == 0:
                continue
            partner_gain = gain[members, a]
            for j in members[np.argsort(-partner_gain, kind="stable")][:16]:
                if g + gain[j, a] <= 0:
                    break
                u = lo + int(j)
                nets_u = self._nets(u)
                if locked[nets_u].any() or np.intersect1d(nets_u, nets_v).size:
                    continue
                if not (self.fits(layer, a, w[u] - w[v]) and self.fits(layer, b, w[v] - w[u])):
                    continue
                self.move(v, b, layer)
                self.move(u, a, layer)
                locked[nets_v] = True
                locked[nets_u] = True
                total += int(g + gain[j, a])
                break
        return total

    def swap_layer(self, layer: int) -> int:
        """Best-first exact pair swaps between blocks of one layer (all pairs evaluated).

        Swap gain = G[v, b] + G[u, a] - (for every net e holding both v in a and u in b:
        w_e ([phi(e,a) = 1] + [phi(e,b) = 1])), since a swap leaves such a net's counts
        unchanged while the single-move gains assumed each vertex moved alone.
        """
        lo, hi = int(self.hg.offsets[layer]), int(self.hg.offsets[layer + 1])
        n = hi - lo
        gain = self.gains(lo, hi)
        own = self.parts[lo:hi]
        sub = self.layer_incidence(lo, hi)
        binary = sub.copy()
        binary.data = np.ones_like(binary.data)
        entry_owner = np.repeat(own, np.diff(sub.indptr))
        alone = sub.copy()
        alone.data = sub.data * (self.phi[sub.indices, entry_owner] == 1)
        alone.eliminate_zeros()
        correction = (alone @ binary.T + binary @ alone.T).toarray()
        swap = gain[:, own]  # swap[v, u] = G[v, part u]
        swap = swap + swap.T - correction
        swap[own[:, None] == own[None, :]] = -np.inf
        np.fill_diagonal(swap, -np.inf)
        w = self.hg.vertex_weights[lo:hi]
        locked = np.zeros(self.hg.n_nets, dtype=bool)
        used = np.zeros(n, dtype=bool)
        total = 0
        # The best 4n positive swaps, ties in index order (what a stable sort of all n^2
        # would list first; the loop stops at the first gain <= 0 anyway).
        positive = np.flatnonzero(swap > 0)
        flat = positive[np.argsort(-swap.flat[positive], kind="stable")]
        for f in flat[: 4 * n]:
            v, u = divmod(int(f), n)
            g = swap[v, u]
            if g <= 0:
                break
            if v > u or used[v] or used[u]:
                continue
            nets_v, nets_u = self._nets(lo + v), self._nets(lo + u)
            if locked[nets_v].any() or locked[nets_u].any():
                continue
            a, b = int(own[v]), int(own[u])
            if not (self.fits(layer, a, w[u] - w[v]) and self.fits(layer, b, w[v] - w[u])):
                continue
            self.move(lo + v, b, layer)
            self.move(lo + u, a, layer)
            locked[nets_v] = True
            locked[nets_u] = True
            used[v] = used[u] = True
            total += int(g)
        return total

    def assign_layer(self, layer: int) -> int:
        """Re-assign a whole layer at once by a linear assignment (vertices -> rank slots),
        each vertex's cost taken with every other vertex fixed. Only for layers whose vertices
        weigh the same (RadiX-Net groups); kept only if the exact objective decreases."""
        from scipy.optimize import linear_sum_assignment

        lo, hi = int(self.hg.offsets[layer]), int(self.hg.offsets[layer + 1])
        w = self.hg.vertex_weights[lo:hi]
        if hi - lo < 2 or w.min() != w.max() or not np.isfinite(self.limits[layer]):
            return 0
        slots = int((self.limits[layer] + 1e-9) // w[0])
        if slots * self.nparts < hi - lo:
            return 0
        gain = self.gains(lo, hi)
        own = self.parts[lo:hi].copy()
        gain[np.arange(hi - lo), own] = 0
        cost = -gain  # + removed(v), a constant per row
        rows, cols = linear_sum_assignment(np.repeat(cost, slots, axis=1))
        target = cols // slots
        # Only these nets' connectivity changes.
        nets = np.unique(self.vertex_nets[self.vertex_indptr[lo]:self.vertex_indptr[hi]])
        before = self.objective(nets)
        changed = np.flatnonzero(target[rows] != own[rows])
        for i in changed:
            self.move(lo + int(rows[i]), int(target[rows[i]]), layer)
        after = self.objective(nets)
        if after < before:
            return before - after
        for i in changed:  # worse: undo
            self.move(lo + int(rows[i]), int(own[rows[i]]), layer)
        return 0

    def run(self, max_passes: int = 8, min_gain: float = 0.001,
            progress: Callable[[int, int], None] | None = None,
            deadline: Deadline = NO_DEADLINE) -> np.ndarray:
        """Sweep all layers until a pass gains less than ``min_gain`` of the objective.
        When ``deadline`` passes, stops between two layers (``self.finished`` is then False):
        the partition is balanced and no worse than the start; raises OutOfTime if it passes
        before the balance is repaired."""
        n_layers = len(self.hg.offsets) - 1
        self.finished = False
        for k in range(self.first_free, n_layers):
            deadline.check(f"refinement stopped in its balance repair, layer {k}/{n_layers - 1}")
            self.rebalance(k)
        for sweep in range(max_passes):
            gained = 0
            for k in range(self.first_free, n_layers):
                if deadline.passed():
                    return self.parts
                while True:
                    g = self.improve_layer(k)
                    n = self.hg.offsets[k + 1] - self.hg.offsets[k]
                    if n <= self.max_swap_layer and np.isfinite(self.limits[k]):
                        g += self.assign_layer(k)
                        g += self.swap_layer(k)
                    gained += g
                    if g == 0:
                        break
            if progress:
                progress(sweep + 1, gained)
            if gained <= min_gain * max(self.objective(), 1):
                break
        self.finished = True
        return self.parts

    def objective(self, nets: np.ndarray | None = None) -> int:
        """km1 of the current partition (of ``nets`` only, if given)."""
        phi, weights = (self.phi, self.hg.net_weights) if nets is None else \
            (self.phi[nets], self.hg.net_weights[nets])
        lam = (phi > 0).sum(axis=1)
        return int(np.sum((lam - 1).clip(min=0) * weights))

