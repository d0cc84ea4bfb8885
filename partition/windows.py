"""Plans for networks larger than memory: the hypergraph built and partitioned a window of
consecutive layers at a time (docs/partitioner.md, "Networks larger than memory").

Each window's layers are read from the file when the window starts and dropped when it ends.
Its input layer belongs to the window before: those neurons keep the blocks chosen there
(the sweep's placement starts from them; KaHyPar's fixed vertices; no refinement moves them),
so the volume of the nets that cross
a window's boundary is counted and optimised once, in the later window. The plan is compared
with the block plan layer by layer as the windows advance, and the block plan is written
instead when it is smaller, as the whole-hypergraph search guarantees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from spdnn.errors import SpdnnError
from spdnn.model.fingerprint import Fingerprint
from spdnn.model.memory import format_bytes
from spdnn.model.plan import (
    Pattern,
    Plan,
    PlanStats,
    combine_stats,
    imbalance_limits,
    plan_statistics,
)

from .methods import BASELINES, baseline_owners, search_hypergraph
from .options import SEARCHES
from .sweep import search_sweep
from .time_budget import Deadline, Log

# Bytes the hypergraph method holds per pin of what it partitions: the window's patterns, the
# hypergraph and its vertex-to-net index, the groups' coarse copy, the starts' part vectors and
# the refiner's work arrays. Measured as peak memory over pins, less the process's own and the
# plan's: the largest windows held more a pin than a whole hypergraph of tens of millions of
# pins, and a lower figure let one run exceed its limit; 34 keeps the largest measured within
# it (docs/BENCHMARKS.md "Partitioning": the windowed runs' peaks under their limits).
BYTES_PER_PIN = 34
# Each worker process of --jobs N builds its own refiner (its vertex-to-net index and work
# arrays) beside the pages it shares with the parent.
WORKER_BYTES_PER_PIN = 8
# The refiner's table of pins per net and block (one byte each on RadiX-Net) exists once for
# each refinement running at a time: one per job, and the search's own.
PHI_BYTES = 1
# The sweep (partition/sweep.py) holds the window's patterns (4 bytes a nonzero) and, where
# groups of identical rows shrink it, the groups' hypergraph and its levels; else the neurons'
# hypergraph, its vertex-to-net index, the per-net block lists and the statistics' transpose.
# The measured peaks above the process's own (docs/BENCHMARKS.md, "Partitioning"), with a
# margin on each.
SWEEP_BYTES_PER_PIN = {True: 17, False: 42}
# A process's own: the interpreter, numpy, scipy, KaHyPar (measured for a small network's
# block plan; docs/memory.md, "Plans for networks larger than memory").
PROCESS_BYTES = 150 * 10**6


class LayerSource(Protocol):
    """What the windows read: a network bundle (spdnn.io.bundle.NetworkBundle) or
    ``PatternList``."""

    shapes: tuple[tuple[int, int], ...]

    def pattern(self, k: int) -> tuple[np.ndarray, np.ndarray]: ...

    def nnz(self, k: int) -> int: ...


class PatternList:
    """Patterns already in memory as a LayerSource."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self._patterns = list(patterns)
        self.shapes = tuple(tuple(p[2]) for p in self._patterns)

    def pattern(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._patterns[k - 1][0], self._patterns[k - 1][1]

    def nnz(self, k: int) -> int:
        return len(self._patterns[k - 1][1])


@dataclass(frozen=True, kw_only=True)
class Window:
    """Weight layers ``first`` .. ``last`` (1-based, inclusive), their pins and the bytes
    predicted for partitioning them."""

    first: int
    last: int
    pins: int
    predicted: int


def search_bytes(pins: int, nets: int, nparts: int, jobs: int, method: str = "hypergraph",
                 grouped: bool = False) -> int:
    """Predicted peak bytes of ``method`` on ``pins`` pins and ``nets`` nets (``grouped``:
    the sweep works on groups of identical rows)."""
    if method == "sweep":  # in this process: --jobs does not change it
        return SWEEP_BYTES_PER_PIN[grouped] * pins
    workers = jobs if jobs > 1 else 0
    return int((BYTES_PER_PIN + WORKER_BYTES_PER_PIN * workers) * pins
               + PHI_BYTES * nets * nparts * (1 + workers))


def plan_bytes(shapes: Sequence[tuple[int, int]]) -> int:
    """The plan itself, held whole until written: one int32 owner per neuron, twice (the
    plan and the block plan it is compared with)."""
    return 8 * (shapes[0][1] + sum(s[0] for s in shapes))


def whole_bytes(source: LayerSource, nparts: int, jobs: int, method: str = "hypergraph",
                grouped: bool = False) -> int:
    """Predicted peak of partitioning the whole hypergraph at once."""
    pins = sum(source.nnz(k) + source.shapes[k - 1][1] for k in range(1, len(source.shapes) + 1))
    nets = sum(s[1] for s in source.shapes)
    return PROCESS_BYTES + plan_bytes(source.shapes) + search_bytes(pins, nets, nparts, jobs,
                                                                    method, grouped)


def choose_windows(source: LayerSource, nparts: int, *, limit: int, jobs: int = 1,
                   max_layers: int | None = None, name: str = "the network",
                   method: str = "hypergraph", grouped: bool = False) -> list[Window]:
    """Consecutive layers, as many per window as fit ``limit`` bytes (and at most
    ``max_layers``); refuses with one line when a single layer does not fit."""
    shapes = source.shapes
    room = limit - PROCESS_BYTES - plan_bytes(shapes)
    if room <= 0:
        raise SpdnnError(f"--memory-limit {format_bytes(limit)} is below what {name}'s plan "
                         f"alone needs ({format_bytes(PROCESS_BYTES + plan_bytes(shapes))} with "
                         "the process)")
    pins = [source.nnz(k) + shapes[k - 1][1] for k in range(1, len(shapes) + 1)]
    nets = [s[1] for s in shapes]
    for k, (p, n) in enumerate(zip(pins, nets), start=1):
        need = search_bytes(p, n, nparts, jobs, method, grouped)
        if need > room:
            raise SpdnnError(
                f"--memory-limit {format_bytes(limit)}: layer {k} of {name} alone needs "
                f"{format_bytes(need)} to partition, {format_bytes(room)} is left beside the "
                f"plan; the smallest limit that fits is "
                f"--memory-limit {math.ceil((limit - room + need) / 2**20)}M")
    windows: list[Window] = []
    first = 1
    while True:
        last = first
        while last < len(shapes) and (max_layers is None or last - first + 1 < max_layers) \
                and search_bytes(sum(pins[first - 1:last + 1]), sum(nets[first - 1:last + 1]),
                                 nparts, jobs, method, grouped) <= room:
            last += 1
        window_pins, window_nets = sum(pins[first - 1:last]), sum(nets[first - 1:last])
        windows.append(Window(first=first, last=last, pins=window_pins,
                              predicted=search_bytes(window_pins, window_nets, nparts, jobs,
                                                        method, grouped)))
        if last == len(shapes):
            return windows
        # Overlap by one layer: the last layer's neurons were placed without the nets that
        # leave them; the next window places them again, with those nets in view.
        first = last if last > first else last + 1


@dataclass(frozen=True, kw_only=True)
class Windowed:
    """``partition_windows``'s answer: the plan, its statistics and the baselines'."""

    plan: Plan
    stats: PlanStats
    baselines: dict[str, PlanStats]
    limits: tuple[float, ...]  # each layer's imbalance limit (spdnn.model.plan)


def _volume(stats: PlanStats, objective: str) -> int:
    return stats.forward_total if objective == "infer" else stats.volume


def partition_windows(source: LayerSource, nparts: int, windows: Sequence[Window], *,
                      method: str = "sweep", epsilon: float = 0.03, seed: int = 0,
                      backend: str = "auto", objective: str = "train", threads: int = 1,
                      time_limit: float | None = None, jobs: int = 1, shortcuts: bool = True,
                      group_starts: int = 3, fingerprint: str | None = None,
                      log: Log | None = None) -> Windowed:
    """A plan of ``nparts`` built window by window (``method`` hypergraph, or a baseline read
    a window at a time). The time limit is shared among the windows by their pins. Without
    ``fingerprint``, the network's is computed from the layers as the windows read them
    (a file of 4e9 nonzeros is then read once, not twice)."""
    deadline = Deadline(time_limit)
    sizes = (source.shapes[0][1], *(s[0] for s in source.shapes))
    hashing = Fingerprint(sizes) if fingerprint is None else None
    owners: list[np.ndarray] = []
    block_owners: list[np.ndarray] = []  # kept: the plan falls back to it
    stats: list[PlanStats] = []
    limits: list[float] = []
    base_stats: dict[str, list[PlanStats]] = {b: [] for b in BASELINES}
    chosen: list[str] = []
    unfinished: list[str] = []
    taken: list[str] = []
    pins_left = sum(w.pins for w in windows)
    last_random = np.zeros(0, np.int32)
    for i, w in enumerate(windows, start=1):
        where = f"window {i}/{len(windows)} (layers {w.first}-{w.last})"
        if log:
            log(f"{where}: {w.pins:,} pins, predicted {format_bytes(w.predicted)}")
        patterns = [(*source.pattern(k), source.shapes[k - 1]) for k in range(w.first, w.last + 1)]
        if hashing is not None:  # each layer once, in order (windows overlap by one)
            for k, (indptr, indices, _) in enumerate(patterns, start=w.first):
                if k > (windows[i - 2].last if i > 1 else 0):
                    hashing.add(indptr, indices)
        fixed = owners[w.first - 1] if w.first > 1 else None
        # The layers this window settles: all but its last when the next window overlaps it.
        keep = len(patterns) - (i < len(windows) and windows[i].first == w.last)
        kept = patterns[:keep]
        limits += imbalance_limits(kept, nparts, epsilon)
        window_base = {}
        for b in BASELINES:  # per layer, so a window of them is the network's own
            bo = baseline_owners(b, patterns, parts=nparts, seed=seed + w.first - 1)[: keep + 1]
            if b == "random" and fixed is not None:  # the rest are the same on every window
                bo[0] = last_random
            last_random = bo[-1] if b == "random" else last_random
            window_base[b] = bo
            base_stats[b].append(plan_statistics(kept, bo, parts=nparts, first_layer=w.first))
        block_owners.extend(window_base["block"][1:] if fixed is not None
                            else window_base["block"])
        if method in BASELINES:
            found_owners = window_base[method]
            chosen.append(method)
        elif nparts == 1:
            found_owners = [np.zeros(n, np.int32) for n in
                            (kept[0][2][1], *(p[2][0] for p in kept))]
            chosen.append(method)
        elif method == "sweep":
            left = deadline.left()
            share = None if left is None else left * w.pins / max(pins_left, 1)
            # The baselines are compared once, for the whole network, below.
            swept = search_sweep(patterns, nparts, epsilon=epsilon, seed=seed + w.first - 1,
                                 objective=objective, deadline=Deadline(share), log=log,
                                 first_layer=w.first, fixed_inputs=fixed, compare=False)
            found_owners = swept.owners[: keep + 1]
            chosen.append(swept.chosen)
            unfinished += [f"{where}: {u}" for u in swept.unfinished]
            del swept
        else:
            left = deadline.left()
            share = None if left is None else left * w.pins / max(pins_left, 1)
            # Under a time limit a window runs one start on the groups: three cut each other
            # short, until only the baselines were left.
            found = search_hypergraph(
                patterns, nparts, epsilon=epsilon, seed=seed + w.first - 1, backend=backend,
                objective=objective, threads=threads, deadline=Deadline(share), jobs=jobs,
                shortcuts=shortcuts, group_starts=group_starts if share is None else 1, log=log,
                first_layer=w.first, fixed_inputs=fixed)
            found_owners = found.owners[: keep + 1]
            chosen.append(found.chosen)
            unfinished += [f"{where}: {u}" for u in found.unfinished]
            taken += [f"{where}: {t}" for t in found.shortcuts]
        owners.extend(found_owners[1:] if fixed is not None else found_owners)
        stats.append(plan_statistics(kept, found_owners, parts=nparts, first_layer=w.first))
        pins_left -= w.pins
        if log:
            log(f"{where}: volume {_volume(stats[-1], objective):,} rows "
                f"(block {_volume(base_stats['block'][-1], objective):,})")
        del patterns, kept
    total = combine_stats(stats)
    baselines = {b: combine_stats(s) for b, s in base_stats.items()}
    method_used = method
    fallback = min(("block", "cyclic"), key=lambda b: _volume(baselines[b], objective))
    if method in SEARCHES and _volume(baselines[fallback], objective) < _volume(total,
                                                                                     objective):
        owners = block_owners if fallback == "block" else [
            (np.arange(n) % nparts).astype(np.int32) for n in
            (source.shapes[0][1], *(s[0] for s in source.shapes))]
        total, method_used, chosen = baselines[fallback], fallback, [fallback]
        if log:
            log(f"the {fallback} plan has less volume than the windows' plan: it is kept")
    meta: dict[str, Any] = {
        "method": method, "objective": objective, "chosen_start": method_used,
        "epsilon": epsilon, "seed": seed, "backend": backend if method == "hypergraph" else None,
        "exact_sweeps": 0, "threads": threads,
        "fingerprint": fingerprint if hashing is None else hashing.hexdigest(),
        "time_limit": time_limit, "unfinished": unfinished, "shortcuts": taken,
        "windows": [[w.first, w.last] for w in windows], "window_starts": chosen,
        "baseline_volumes": {b: _volume(st, objective) for b, st in baselines.items()},
        "predicted_bytes": PROCESS_BYTES + plan_bytes(source.shapes)
        + max(w.predicted for w in windows),
        "stats": total.summary(),
    }
    return Windowed(plan=Plan(nparts, tuple(owners), meta), stats=total, baselines=baselines,
                    limits=tuple(limits))
