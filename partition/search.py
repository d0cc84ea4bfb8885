"""The hypergraph method's search over starts, under a time budget and on ``jobs`` processes.

Starts: the baselines; one layer-by-layer run of the backend on the neurons (the "fine" start);
where groups of identical rows shrink the hypergraph, ``n_runs`` layer-by-layer runs on the
groups and the cyclic and fine starts projected onto them, each refined on the groups. Every
start is then refined on the neurons and the least volume wins (ties: the first in
``order``), so without a time limit the plan does not depend on the order the work is done in
nor on ``jobs``. The work runs cheapest first, so a time limit cuts the expensive starts; what
did not finish is reported, and the plan is never worse than the best balanced baseline.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spdnn.comm.processes import die_with_parent, fork_is_safe
from spdnn.errors import SpdnnError

from ._kernels import connectivity
from .backends import layer_backends
from .hypergraph import Hypergraph, balanced, km1, layer_limits
from .layerwise import Skipped, layer_by_layer, majority
from .refine import BalanceError, Refiner
from .time_budget import Deadline, Log, OutOfTime


@dataclass(kw_only=True)
class Search:
    hg: Hypergraph
    coarse: Hypergraph | None  # the groups of identical rows, where they shrink the hypergraph
    coarse_of: np.ndarray | None
    nparts: int
    epsilon: float
    seed: int
    backend: str
    threads: int
    deadline: Deadline
    log: Log | None
    grouped: np.ndarray | None = None  # per weight layer: do its rows form groups?
    probe_base: int | None = None  # the best baseline's layer-1 volume, for the shortcut
    # A window of a larger network (partition/windows.py): its input layer's blocks, chosen
    # by the window before and never moved here.
    fixed_inputs: np.ndarray | None = None
    limits: np.ndarray = field(init=False)
    fine_backends: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.limits = layer_limits(self.hg, self.nparts, self.epsilon)
        grouped = np.zeros(self.hg.n_layers, bool) if self.grouped is None else self.grouped
        self.fine_backends = layer_backends(self.backend, grouped)

    @property
    def fine_name(self) -> str:
        """The layer-by-layer start's name: its backend(s)."""
        return "+".join(dict.fromkeys(self.fine_backends))

    @property
    def group_backend(self) -> str:
        return "kahypar" if self.backend == "auto" else self.backend


# The unstructured-network shortcut: the layer-by-layer run stops after layer 1 when it gains
# less than this share over the best baseline there. Layer 1's inputs are free, so later layers,
# with theirs fixed, gain less still (on random fan-in networks the finished run gained less
# than layer 1 alone).
PROBE_GAIN = 0.01


def layer1_volume(hg: Hypergraph, parts: np.ndarray, nparts: int) -> int:
    """The volume of the nets of layer 0's neurons (all that layer 1's blocks decide)."""
    nets = np.flatnonzero(hg.net_layer == 0)
    last = int(hg.net_indptr[nets[-1] + 1]) if len(nets) else 0
    lam = connectivity(hg.net_indptr[: len(nets) + 1], hg.net_pins[:last],
                       np.ascontiguousarray(np.maximum(parts, 0), np.int64), nparts)
    return int(np.sum((lam.astype(np.int64) - 1).clip(min=0) * hg.net_weights[nets]))


def _probe(parts: np.ndarray) -> str | None:
    s = _SEARCH["s"]
    mine = layer1_volume(s.hg, parts, s.nparts)
    if s.probe_base is None or mine < (1 - PROBE_GAIN) * s.probe_base:
        return None
    return (f"unstructured: layer 1 gains {100 * (1 - mine / max(s.probe_base, 1)):.2f}% over "
            f"the best baseline there, less than {100 * PROBE_GAIN:g}%")


# A start whose volume is more than this many times the best start's is not refined: the
# refinement has cut a start by at most about 4x (the block start on RadiX-Net at P = 64, which
# still ended several times above the best start), and it costs the most on exactly those
# starts (most of that run's time).
REFINE_RATIO = 8.0

_SEARCH: dict[str, Search] = {}  # this process's search; forked workers inherit it


def _fine_start() -> np.ndarray:
    s = _SEARCH["s"]
    return layer_by_layer(s.hg, s.nparts, s.epsilon, s.seed, s.fine_backends, s.log,
                          s.threads, s.deadline, name=f"{s.fine_name} start",
                          probe=_probe if s.probe_base is not None else None,
                          fixed_inputs=s.fixed_inputs)


def _on_groups(cparts: np.ndarray) -> np.ndarray:
    """A coarse start refined on the groups under the neurons' limits, projected back."""
    s = _SEARCH["s"]
    refiner = Refiner(s.coarse, cparts, s.nparts, s.epsilon, limits=s.limits,
                      max_swap_layer=2048, frozen_inputs=s.fixed_inputs is not None)
    return refiner.run(deadline=s.deadline)[s.coarse_of]


def _group_run(r: int) -> np.ndarray:
    s = _SEARCH["s"]
    cparts = layer_by_layer(s.coarse, s.nparts, s.epsilon, s.seed + 7919 * r,
                            s.group_backend, s.log, s.threads, s.deadline,
                            name=f"{s.group_backend}-groups-{r} start",
                            fixed_inputs=s.fixed_inputs)
    return _on_groups(cparts)


def _projected(parts: np.ndarray) -> np.ndarray:
    s = _SEARCH["s"]
    return _on_groups(majority(s.coarse_of, parts, s.coarse.n_vertices, s.nparts))


def _refined(name: str, parts: np.ndarray) -> tuple[np.ndarray, int, bool]:
    s = _SEARCH["s"]
    s.deadline.check("refinement not started")
    refiner = Refiner(s.hg, parts, s.nparts, s.epsilon, frozen_inputs=s.fixed_inputs is not None)

    def progress(sweep: int, gained: int) -> None:
        if s.log:
            s.log(f"refining {name}: pass {sweep}, {gained:,} rows less")

    out = refiner.run(progress=progress, deadline=s.deadline)
    return out, refiner.objective(), refiner.finished


class Runner:
    """Runs tasks in this process (jobs = 1) or on forked worker processes; a task's
    OutOfTime or BalanceError is its result, any other exception propagates."""

    def __init__(self, jobs: int, log: Log | None = None) -> None:
        # Workers inherit the search by fork; inside an MPI job of several ranks, or beside
        # other threads, fork is unsafe, and the tasks run here instead (the plan does not
        # depend on jobs).
        if jobs > 1 and not fork_is_safe():
            if log:
                log(f"--jobs {jobs}: the tasks run in this process (forking is unsafe inside "
                    "an MPI job of several ranks, or beside other threads)")
            jobs = 1
        self.pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"),
                                        initializer=die_with_parent) \
            if jobs > 1 else None

    def run(self, tasks: Sequence[tuple[Callable[..., Any], tuple]]) -> list[Any]:
        if self.pool is None:
            return [_call(fn, args) for fn, args in tasks]
        futures: list[Future] = [self.pool.submit(_call, fn, args) for fn, args in tasks]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool:
            raise SpdnnError("a worker process of --jobs ended without its result (killed, "
                             "or out of memory? try fewer --jobs)") from None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _call(fn: Callable[..., Any], args: tuple) -> Any:
    try:
        return fn(*args)
    except (OutOfTime, BalanceError, Skipped) as exc:
        return exc


def search(s: Search, baselines: dict[str, np.ndarray], n_runs: int, jobs: int,
           shortcuts: bool = True) -> tuple[str, np.ndarray, int, dict, list[str], list[str]]:
    """Best plan of the search: (its start's name, parts, volume, candidates, unfinished,
    shortcuts taken). ``shortcuts``: on a network without groups of identical rows, give up
    the layer-by-layer run after layer 1 if it gains too little there (PROBE_GAIN); do not
    refine a start more than REFINE_RATIO times the best start's volume."""
    _SEARCH["s"] = s
    log, backend, fine = s.log, s.group_backend, s.fine_name
    if shortcuts and s.coarse is None:
        s.probe_base = min(layer1_volume(s.hg, p, s.nparts) for p in baselines.values())
    runner = Runner(jobs, log)
    unfinished: list[str] = []
    taken: list[str] = []
    starts: dict[str, np.ndarray] = dict(baselines)

    def collect(names: Sequence[str], results: Sequence[Any]) -> None:
        for name, result in zip(names, results):
            if isinstance(result, Skipped):
                taken.append(f"{name} start skipped after layer 1: {result}")
                if log:
                    log(taken[-1])
            elif isinstance(result, OutOfTime):
                unfinished.append(f"{name}: {result}")
                if log:
                    log(f"time limit: {unfinished[-1]}")
            elif isinstance(result, BalanceError):  # groups too coarse to balance
                if log:
                    log(f"candidate {name} skipped ({result})")
            else:
                starts[name] = result

    try:
        # 1. Independent starts: with one job the cheap group runs first (a time limit then
        # cuts the fine run); with more, the long fine run first, beside them.
        tasks: list[tuple[str, Callable[..., Any], tuple]] = []
        if s.coarse is not None:
            tasks += [(f"{backend}-groups-{r}", _group_run, (r,)) for r in range(n_runs)]
            tasks.append(("cyclic-groups", _projected, (baselines["cyclic"],)))
        tasks.insert(0 if jobs > 1 else len(tasks), (fine, _fine_start, ()))
        collect([t[0] for t in tasks], runner.run([t[1:] for t in tasks]))
        if s.coarse is not None and fine in starts:
            collect([f"{fine}-groups"], runner.run([(_projected, (starts[fine],))]))
        elif s.coarse is not None and not taken:
            unfinished.append(f"{fine}-groups: not started (needs the {fine} start)")
        # 2. Refinement on the neurons, the most promising starts first.
        order = list(baselines) + [fine] + \
            [f"{backend}-groups-{r}" for r in range(n_runs)] + \
            ["cyclic-groups", f"{fine}-groups"] * (s.coarse is not None)
        order = [name for name in order if name in starts]
        before = {name: km1(s.hg, starts[name]) for name in order}
        queue = sorted(order, key=lambda name: before[name])
        if shortcuts:  # starts too far behind for the refinement to close the gap
            best = before[queue[0]]
            far = [n for n in queue if before[n] > REFINE_RATIO * max(best, 1)]
            for name in far:
                taken.append(f"{name} not refined: its {before[name]:,} rows are "
                             f"{before[name] / max(best, 1):.0f}x those of {queue[0]}")
                order.remove(name)
            queue = [n for n in queue if n not in far]
        results = dict(zip(queue, runner.run([(_refined, (n, starts[n])) for n in queue])))
    finally:
        runner.close()
    candidates, best = {}, None
    for name in order:
        result = results[name]
        if isinstance(result, BalanceError):
            if log:
                log(f"candidate {name} skipped ({result})")
            continue
        if isinstance(result, OutOfTime):
            unfinished.append(f"{name}: {result}")
            if not balanced(s.hg, starts[name], s.nparts, s.limits):
                continue
            parts, cost = starts[name], before[name]
        else:
            parts, cost, finished = result
            if not finished:
                unfinished.append(f"{name}: refinement cut short")
        candidates[name] = {"start": before[name], "refined": cost}
        if log:
            log(f"candidate {name}: volume {before[name]:,} -> {cost:,} rows after refinement")
        if best is None or cost < best[2]:
            best = (name, parts, cost)
    assert best is not None, "the block start is always balanced"
    return (*best, candidates, unfinished, taken)
