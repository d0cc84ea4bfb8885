"""Multilevel placement and refinement of a layered hypergraph under a per-layer balance limit,
in time and memory linear in the pins (the sweep method's engine: partition/sweep.py).

Coarsening: rounds of heavy-edge matching inside each layer (never across layers: every layer
keeps its own limit), while they shrink it. Placement: a forward sweep over the layers puts
each vertex of the coarsest level on the block that its already placed nets touch most, under
the layer's limit (FREIGHT's streaming rule); the input layer, which carries no work, then
joins the block most of its net's pins are on. Refinement, level by level back: rounds of label
propagation in which every vertex sees the nets of both neighbouring layers and moves with its
exact gain where the layer's limit allows, and pairs of vertices that want each other's blocks
swap. The per-net block lists (partition/_multilevel_kernels.py) take 8 bytes a pin, whatever
P. Each phase looks at the deadline every CHUNK vertices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _multilevel_kernels as kern
from ._kernels import vertex_nets
from .hypergraph import Hypergraph
from .time_budget import NO_DEADLINE, Deadline, Log

# A refinement ends when a round gains less than this share of the volume.
MIN_GAIN = 0.002
MAX_ROUNDS = 12
# Swap partners looked at per blocked move (partition/_multilevel_kernels.swap_partners).
PARTNERS = 64


class Lists:
    """A partition of ``hg`` with the blocks of every net and the load of every layer, and the
    moves that keep them current."""

    def __init__(self, hg: Hypergraph, parts: np.ndarray, nparts: int,
                 limits: np.ndarray) -> None:
        self.hg, self.nparts, self.limits = hg, nparts, limits
        self.parts = np.array(parts, dtype=np.int32)  # a copy: the caller keeps its own
        self.vptr, self.vnets = vertex_nets(hg.net_indptr, hg.net_pins, hg.n_vertices)
        self.net_w = np.ascontiguousarray(hg.net_weights, dtype=np.int64)
        self.nblk = np.zeros(hg.n_nets, dtype=np.int32)
        self.blk = np.empty(len(hg.net_pins), dtype=np.int32)
        self.cnt = np.empty(len(hg.net_pins), dtype=np.int32)
        kern.build_lists(hg.net_indptr, hg.net_pins, self.parts, self.nblk, self.blk, self.cnt)
        self.weights = np.ascontiguousarray(hg.vertex_weights, dtype=np.int64)
        n_layers = len(hg.offsets) - 1
        self.loads = np.zeros((n_layers, nparts), dtype=np.int64)
        for k in range(n_layers):
            lo, hi = hg.offsets[k], hg.offsets[k + 1]
            placed = self.parts[lo:hi] >= 0
            self.loads[k] = np.bincount(self.parts[lo:hi][placed],
                                        weights=self.weights[lo:hi][placed], minlength=nparts)
        self.conn = np.zeros(nparts, dtype=np.int64)
        self.stamp = np.full(nparts, -1, dtype=np.int64)
        self.touched = np.empty(nparts, dtype=np.int64)
        largest = int(np.diff(hg.offsets).max(initial=0))
        self.want_v = np.empty(largest, dtype=np.int64)
        self.want_b = np.empty(largest, dtype=np.int64)
        self.want_g = np.empty(largest, dtype=np.int64)

    def span(self, k: int) -> tuple[int, int]:
        return int(self.hg.offsets[k]), int(self.hg.offsets[k + 1])

    def limit(self, k: int) -> float:
        return float(self.limits[k])

    def objective(self) -> int:
        return int(kern.objective(self.net_w, self.nblk))

    def place(self, k: int, order: np.ndarray, deadline: Deadline = NO_DEADLINE) -> None:
        lo, hi = self.span(k)
        for chunk in _chunks(order):
            deadline.check(f"sweep: placement stopped in layer {k}")
            kern.place_layer(lo, hi, k, chunk, self.parts, self.weights, self.loads,
                             self.limit(k), self.nparts, self.vptr, self.vnets, self.net_w,
                             self.hg.net_indptr, self.nblk, self.blk, self.cnt, self.conn,
                             self.stamp, self.touched)

    def follow(self, k: int) -> None:
        lo, hi = self.span(k)
        kern.follow_users(lo, hi, self.parts, self.vptr, self.vnets, self.hg.net_indptr,
                          self.nblk, self.blk, self.cnt, self.nparts)

    def rebalance(self, k: int) -> bool:
        lo, hi = self.span(k)
        return bool(kern.rebalance_layer(
            lo, hi, k, self.parts, self.weights, self.loads, self.limit(k), self.nparts,
            self.vptr, self.vnets, self.net_w, self.hg.net_indptr, self.nblk, self.blk, self.cnt,
            self.conn, self.stamp, self.touched))

    def improve(self, k: int, order: np.ndarray, deadline: Deadline = NO_DEADLINE) -> int:
        """One round of moves and swaps on layer k (cut short, between two chunks of its
        vertices, when ``deadline`` passes); the objective's decrease."""
        lo, hi = self.span(k)
        g = listed = 0
        for chunk in _chunks(order):
            if deadline.passed():
                break
            gained, _, n = kern.lp_layer(
                lo, hi, k, chunk, self.parts, self.weights, self.loads, self.limit(k),
                self.vptr, self.vnets, self.net_w, self.hg.net_indptr, self.nblk, self.blk,
                self.cnt, self.conn, self.stamp, self.touched, self.want_v[listed:],
                self.want_b[listed:], self.want_g[listed:])
            g += gained
            listed += n
        if deadline.passed():
            return int(g)
        g += kern.swap_pairs(k, self.want_v, self.want_b, self.want_g, listed, self.parts,
                             self.weights, self.loads, self.limit(k), self.nparts, self.vptr,
                             self.vnets, self.net_w, self.hg.net_indptr, self.nblk, self.blk,
                             self.cnt)
        g += kern.swap_partners(lo, hi, k, self.want_v, self.want_b, self.want_g, listed,
                                self.parts, self.weights, self.loads, self.limit(k),
                                self.nparts, self.vptr, self.vnets, self.net_w,
                                self.hg.net_indptr, self.nblk, self.blk, self.cnt, PARTNERS)
        return int(g)


@dataclass(frozen=True, kw_only=True)
class Swept:
    parts: np.ndarray
    volume: int


# Vertices a kernel call handles between two looks at the clock (--time-limit).
CHUNK = 4096


def _chunks(order: np.ndarray) -> list[np.ndarray]:
    return [order[i:i + CHUNK] for i in range(0, len(order), CHUNK)]


def _orders(hg: Hypergraph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.permutation(int(n)).astype(np.int64) for n in np.diff(hg.offsets)]


def place(hg: Hypergraph, nparts: int, limits: np.ndarray, seed: int,
          fixed_inputs: np.ndarray | None = None,
          deadline: Deadline = NO_DEADLINE) -> np.ndarray:
    """The forward sweep: every layer placed with the one before it in place (OutOfTime if
    ``deadline`` passes first: no plan)."""
    parts = np.full(hg.n_vertices, -1, dtype=np.int32)
    if fixed_inputs is not None:
        parts[: hg.offsets[1]] = fixed_inputs
    lists = Lists(hg, parts, nparts, limits)
    orders = _orders(hg, seed)
    for k in range(1, hg.n_layers + 1):
        lists.place(k, orders[k], deadline)
        if k == 1 and fixed_inputs is None:
            lists.follow(0)
    return lists.parts


def refine(hg: Hypergraph, parts: np.ndarray, nparts: int, limits: np.ndarray, seed: int, *,
           frozen_inputs: bool = False, deadline: Deadline = NO_DEADLINE,
           log: Log | None = None, what: str = "sweep") -> Swept:
    """Rounds of label propagation and pair swaps over every layer until a round gains less
    than MIN_GAIN of the volume (or the deadline passes, between two layers)."""
    lists = Lists(hg, parts, nparts, limits)
    orders = _orders(hg, seed + 1)
    for k in range(1 if frozen_inputs else 0, hg.n_layers + 1):
        lists.rebalance(k)
    volume = lists.objective()
    rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):
        gained = 0
        for k in range(1 if frozen_inputs else 0, hg.n_layers + 1):
            if deadline.passed():
                return Swept(parts=lists.parts, volume=lists.objective())
            gained += lists.improve(k, orders[k], deadline)
        volume -= gained
        if log:
            log(f"{what}: round {rounds}, {gained:,} rows less, {volume:,}")
        if gained <= MIN_GAIN * max(volume, 1):
            break
    return Swept(parts=lists.parts, volume=volume)


# Coarsening stops when a level keeps more than this share of the vertices, or a layer has
# fewer than COARSE_PER_PART vertices per block.
SHRINK = 0.85
PIN_SHRINK = 0.97
COARSE_PER_PART = 1
MAX_NET = 1000


def match(hg: Hypergraph, nparts: int, limits: np.ndarray, seed: int,
          deadline: Deadline = NO_DEADLINE) -> np.ndarray | None:
    """One level of heavy-edge matching inside every layer; a cluster weighs at most a
    ``COARSE_PER_PART``-th of the layer's average block (so that its blocks can still be
    balanced). None when ``deadline`` passes first."""
    cluster = np.full(hg.n_vertices, -1, dtype=np.int64)
    largest = int(np.diff(hg.offsets).max(initial=0))
    rating = np.zeros(largest, dtype=np.float64)
    stamp = np.full(largest, -1, dtype=np.int64)
    touched = np.empty(largest, dtype=np.int64)
    vptr, vnets = vertex_nets(hg.net_indptr, hg.net_pins, hg.n_vertices)
    net_w = np.ascontiguousarray(hg.net_weights, dtype=np.int64)
    rng = np.random.default_rng(seed)
    for k in range(hg.n_layers + 1):
        if deadline.passed():
            return None
        lo, hi = int(hg.offsets[k]), int(hg.offsets[k + 1])
        w = hg.vertex_weights[lo:hi]
        cap = w.sum() / nparts / COARSE_PER_PART if k > 0 else np.inf
        if hi - lo < COARSE_PER_PART * nparts:
            cluster[lo:hi] = np.arange(lo, hi)
            continue
        for chunk in _chunks(rng.permutation(hi - lo).astype(np.int64)):
            if deadline.passed():
                return None
            kern.match_layer(lo, hi, chunk, cluster, hg.vertex_weights, cap, vptr, vnets,
                             net_w, hg.net_indptr, hg.net_pins, MAX_NET, rating, stamp, touched)
    return cluster


def multilevel(hg: Hypergraph, nparts: int, limits: np.ndarray, seed: int, *,
               fixed_inputs: np.ndarray | None = None, deadline: Deadline = NO_DEADLINE,
               log: Log | None = None) -> Swept:
    """Coarsen by matchings until a level stops shrinking, place and refine the coarsest,
    then project and refine level by level back to ``hg``."""
    from .hypergraph import contract

    levels: list[tuple[Hypergraph, np.ndarray]] = []  # (finer hypergraph, coarse_of)
    current = hg
    while True:  # past the deadline: placed as it stands, then repaired
        cluster = match(current, nparts, limits, seed + len(levels), deadline)
        if cluster is None:
            break
        if fixed_inputs is not None:  # the fixed inputs stay single
            cluster[: current.offsets[1]] = np.arange(current.offsets[1])
        coarse, coarse_of = contract(current, cluster)
        # Layer 0's neurons never share a net: only the layers with work can shrink. Where the
        # first level's nets keep nearly all their pins (unstructured layers: large nets,
        # few shared), every level costs as much to refine as the neurons and gains nothing.
        if coarse.n_vertices - coarse.offsets[1] > SHRINK * (current.n_vertices
                                                             - current.offsets[1]) \
                or not levels and len(coarse.net_pins) > PIN_SHRINK * len(current.net_pins):
            break
        levels.append((current, coarse_of))
        current = coarse
        if log:
            log(f"level {len(levels)}: {current.n_vertices:,} vertices, "
                f"{len(current.net_pins):,} pins")
    parts = place(current, nparts, limits, seed, fixed_inputs, deadline)
    swept = refine(current, parts, nparts, limits, seed, frozen_inputs=fixed_inputs is not None,
                   deadline=deadline, log=log, what=f"level {len(levels)}")
    for depth in range(len(levels) - 1, -1, -1):
        finer, coarse_of = levels[depth]
        swept = refine(finer, swept.parts[coarse_of], nparts, limits, seed,
                       frozen_inputs=fixed_inputs is not None, deadline=deadline, log=log,
                       what=f"level {depth}")
    return swept
