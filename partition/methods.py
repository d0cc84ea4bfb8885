"""Partitioning methods: the baselines (block, cyclic, random), ``sweep`` (linear in the pins:
partition/sweep.py) and ``hypergraph``.

``hypergraph`` builds candidates — layer-by-layer KaHyPar runs with the previous layer's vertices
fixed, the same on groups of identical rows where they shrink the hypergraph, and the three
baselines — refines each under the per-layer balance constraint
(partition/refine.py) and keeps the one with the least volume under the objective (``train``:
forward + backward rows; ``infer``: forward rows only), so it is never worse than any baseline by
that measure.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from spdnn.model.plan import Pattern, Plan, plan_statistics

from .baselines import baseline_owners, neuron_weights
from .exact import sweep_exact
from .groups import GROUP_SHRINK, identical_row_clusters
from .hypergraph import Hypergraph, build_hypergraph, contract, km1, layer_limits
from .layerwise import majority
from .options import BASELINES, PartitionOptions
from .refine import BalanceError, Refiner
from .search import Search, search
from .time_budget import Deadline, Log, OutOfTime

# A layer "forms groups" (for --backend auto) when its groups of identical rows are at most half
# as many as its neurons (RadiX-Net, Graph Challenge: 1/16; unstructured layers: 1).
GROUP_LAYER = 0.5



def polish_exact(hg: Hypergraph, coarse: Hypergraph, coarse_of: np.ndarray, parts: np.ndarray,
                 nparts: int, epsilon: float, sweeps: int, log: Log | None) -> np.ndarray:
    """``parts`` after exact one-layer sweeps on the groups of identical rows (majority ranks,
    rebalanced), then the local search on single neurons; ``parts`` itself when that is not
    better or the groups cannot be balanced."""
    limits = Refiner(hg, parts, nparts, epsilon).limits
    try:
        cparts = Refiner(coarse, majority(coarse_of, parts, coarse.n_vertices, nparts), nparts,
                         epsilon, limits=limits).run()
    except BalanceError as exc:
        if log:
            log(f"exact sweeps skipped ({exc})")
        return parts
    cparts = sweep_exact(coarse, cparts, nparts, limits, sweeps, log=log)
    refiner = Refiner(hg, cparts[coarse_of], nparts, epsilon)
    out = refiner.run()
    return out if refiner.objective() < km1(hg, parts) else parts


@dataclass(frozen=True, kw_only=True)
class Found:
    """The hypergraph method's answer: the owners of every vertex layer, the start that won,
    its volume, every candidate's volume before and after refinement, what the time limit
    cut and the shortcuts taken."""

    owners: list[np.ndarray]
    chosen: str
    volume: int
    candidates: dict[str, Any]
    unfinished: list[str]
    shortcuts: list[str]


def search_hypergraph(patterns: Sequence[Pattern], nparts: int, *, epsilon: float, seed: int,
                      backend: str, objective: str, threads: int, deadline: Deadline,
                      jobs: int, shortcuts: bool, group_starts: int, exact_sweeps: int = 0,
                      log: Log | None = None, first_layer: int = 1,
                      fixed_inputs: np.ndarray | None = None) -> Found:
    """The hypergraph method on ``patterns``: the whole network, or a window of it whose
    first layer is the network's ``first_layer`` and whose inputs are fixed to
    ``fixed_inputs`` (partition/windows.py)."""
    hg = build_hypergraph(patterns, objective=objective, first_layer=first_layer)
    if log:
        log(f"hypergraph: {hg.n_vertices:,} vertices, {hg.n_nets:,} nets, "
            f"{len(hg.net_pins):,} pins")
    baselines = {}
    for b in BASELINES:
        owners = baseline_owners(b, patterns, parts=nparts, seed=seed)
        if fixed_inputs is not None:
            owners[0] = fixed_inputs.astype(np.int32)
        baselines[b] = np.concatenate(owners)
    from .sweep import sweep_start

    # The sweep's plan is a start too: the search is never worse than the default method.
    try:
        baselines["sweep"] = sweep_start(hg, patterns, nparts, layer_limits(hg, nparts, epsilon),
                                         seed, fixed_inputs=fixed_inputs, deadline=deadline,
                                         log=log).parts
    except OutOfTime:
        if log:
            log("time limit: the sweep's start was not placed in time")
    coarse, coarse_of = contract(hg, identical_row_clusters(patterns, nparts))
    grouped = np.diff(coarse.offsets)[1:] <= GROUP_LAYER * np.diff(hg.offsets)[1:]
    if coarse.n_vertices <= GROUP_SHRINK * hg.n_vertices:
        if log:
            log(f"groups of identical rows: {coarse.n_vertices:,} coarse vertices")
    else:
        if log:
            log(f"groups of identical rows: {coarse.n_vertices:,} coarse vertices of "
                f"{hg.n_vertices:,}, too few to try group starts")
        coarse = coarse_of = None
    s = Search(hg=hg, coarse=coarse, coarse_of=coarse_of, nparts=nparts, epsilon=epsilon,
               seed=seed, backend=backend, threads=threads, deadline=deadline, log=log,
               grouped=grouped, fixed_inputs=fixed_inputs)
    chosen, best_parts, best_cost, candidates, unfinished, taken = search(
        s, baselines, group_starts, jobs, shortcuts)
    if exact_sweeps and deadline.passed():
        unfinished.append("exact sweeps: not started")
    elif exact_sweeps:
        if coarse is None:
            coarse, coarse_of = contract(hg, identical_row_clusters(patterns, nparts))
        parts = polish_exact(hg, coarse, coarse_of, best_parts, nparts, epsilon,
                             exact_sweeps, log)
        cost = km1(hg, parts)
        candidates["exact"] = {"start": best_cost, "refined": cost}
        if cost < best_cost:
            best_parts, best_cost, chosen = parts, cost, f"{chosen}+exact"
    return Found(owners=hg.split(best_parts), chosen=chosen, volume=best_cost,
                 candidates=candidates, unfinished=unfinished, shortcuts=taken)


def partition_network(
    patterns: Sequence[Pattern],
    parts: int,
    *,
    method: Literal["sweep", "hypergraph", "block", "cyclic", "random"] = "sweep",
    epsilon: float = 0.03,
    seed: int | None = 0,
    backend: Literal["auto", "kahypar", "mtkahypar"] | str = "auto",
    fingerprint: str | None = None,
    log: Log | None = None,
    group_starts: int = 3,
    objective: Literal["train", "infer"] = "train",
    exact_sweeps: int = 0,
    threads: int = 1,
    time_limit: float | None = None,
    jobs: int = 1,
    shortcuts: bool = True,
) -> Plan:
    """Assign every neuron of every layer to a rank; the Plan carries its statistics.
    ``method``: ``sweep`` (default: time and memory linear in the pins, partition/sweep.py),
    ``hypergraph`` (KaHyPar-family starts refined, with the sweep's plan among them) or a
    baseline.

    ``objective`` is the volume minimised: ``train`` (a training step, forward + backward rows)
    or ``infer`` (inference, forward rows only). ``exact_sweeps`` > 0 polishes the best plan
    by that many sweeps of exact one-layer re-assignment of its groups (partition/exact.py).
    ``threads`` is Mt-KaHyPar's thread count (its plans do not depend on it). ``time_limit``
    (seconds) cuts the search short: the best plan so far is kept and ``meta["unfinished"]``
    says what did not finish. ``jobs`` worker processes run independent starts and
    refinements side by side; the plan does not depend on it. ``shortcuts`` lets the search
    skip starts that cannot win (partition/search.py); ``meta["shortcuts"]`` lists those taken."""
    nparts = parts  # the partitioner's modules call it nparts; callers say parts
    seed = PartitionOptions(method=method, epsilon=epsilon, seed=seed, objective=objective,
                            backend=backend, threads=threads, jobs=jobs, time_limit=time_limit,
                            exact_sweeps=exact_sweeps, shortcuts=shortcuts).checked(parts).seed
    deadline = Deadline(time_limit)
    t0 = time.perf_counter()
    candidates: dict[str, Any] = {}
    unfinished: list[str] = []
    shortcuts_taken: list[str] = []
    owners: Sequence[np.ndarray]
    if nparts == 1:
        owners = [np.zeros(len(w), dtype=np.int32) for w in neuron_weights(patterns)]
        chosen = method
    elif method in BASELINES:
        owners = baseline_owners(method, patterns, parts=nparts, seed=seed)
        chosen = method
    elif method == "sweep":
        from .sweep import search_sweep

        swept = search_sweep(patterns, nparts, epsilon=epsilon, seed=seed, objective=objective,
                             deadline=deadline, log=log)
        chosen, unfinished, owners = swept.chosen, swept.unfinished, swept.owners
        candidates = {name: {"start": v, "refined": v} for name, v in swept.candidates.items()}
        if exact_sweeps and deadline.passed():
            unfinished.append("exact sweeps: not started")
        elif exact_sweeps:
            hg = build_hypergraph(patterns, objective=objective)
            coarse, coarse_of = contract(hg, identical_row_clusters(patterns, nparts))
            polished = polish_exact(hg, coarse, coarse_of, np.concatenate(owners), nparts,
                                    epsilon, exact_sweeps, log)
            cost = km1(hg, polished)
            candidates["exact"] = {"start": swept.volume, "refined": cost}
            if cost < swept.volume:
                owners, chosen = hg.split(polished), f"{chosen}+exact"
    else:
        found = search_hypergraph(patterns, nparts, epsilon=epsilon, seed=seed, backend=backend,
                                  objective=objective, threads=threads, deadline=deadline,
                                  jobs=jobs, shortcuts=shortcuts, group_starts=group_starts,
                                  exact_sweeps=exact_sweeps, log=log)
        chosen, candidates = found.chosen, found.candidates
        unfinished, shortcuts_taken = found.unfinished, found.shortcuts
        owners = found.owners
    stats = plan_statistics(patterns, owners, parts=nparts)
    meta = {
        "method": method,
        "objective": objective,
        "chosen_start": chosen,
        "epsilon": epsilon,
        "seed": seed,
        "backend": backend if method == "hypergraph" else None,
        "exact_sweeps": exact_sweeps,
        "threads": threads,
        "fingerprint": fingerprint,
        "partition_seconds": time.perf_counter() - t0,
        "candidates": candidates,
        "time_limit": time_limit,
        "unfinished": unfinished,
        "shortcuts": shortcuts_taken,
        "stats": stats.summary(),
    }
    return Plan(nparts, tuple(owners), meta)
