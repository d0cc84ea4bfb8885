"""The ``sweep`` method: a plan in time and memory linear in the pins (docs/partitioner.md).

Groups of identical rows become one vertex each where they shrink the network
(partition/groups.py builds their hypergraph from one row a group, and the neurons' hypergraph
is then never built); the multilevel engine (partition/multilevel.py) places and refines
them; the neurons' level is refined only where groups could not be balanced whole. The plan
is compared with the baselines, volumes counted as the runtime counts them, and a winning
baseline is refined in turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spdnn.model.plan import Pattern, balance_limit

from .hypergraph import Hypergraph
from .multilevel import Swept, multilevel, refine
from .time_budget import NO_DEADLINE, Deadline, Log, OutOfTime

# Counting the volume of the plan and of the three baselines (plan_statistics: about 15 ns a
# pin each, measured), and the plan's statistics once more, kept back from a time limit.
COMPARE_SECONDS_PER_PIN = 5 * 20e-9


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """The sweep method's answer: the owners of every layer's neurons, the candidate that won
    (``sweep`` or a baseline), every candidate's volume (the runtime's count), and what a
    time limit cut. ``volume`` is None when the baselines were not compared."""

    owners: list[np.ndarray]
    chosen: str
    volume: int | None
    candidates: dict[str, int]
    unfinished: list[str]


def _fits(parts: np.ndarray, patterns: Sequence[Pattern], limits: np.ndarray) -> list[bool]:
    """Per layer with work, whether its blocks are within its limit."""
    at = patterns[0][2][1]
    out = []
    for (indptr, _, shape), limit in zip(patterns, limits[1:]):
        loads = np.bincount(parts[at:at + shape[0]], weights=np.diff(indptr))
        out.append(loads.max(initial=0) <= limit + 1e-9)
        at += shape[0]
    return out


def pattern_limits(patterns: Sequence[Pattern], nparts: int, epsilon: float) -> np.ndarray:
    """Each vertex layer's most work per block, from the layers (layer 0 has none)."""
    return np.array([np.inf] + [balance_limit(p[0], nparts, epsilon) for p in patterns])


def sweep_start(hg: Hypergraph, patterns: Sequence[Pattern], nparts: int, limits: np.ndarray,
                seed: int, *, fixed_inputs: np.ndarray | None = None,
                deadline: Deadline = NO_DEADLINE, log: Log | None = None) -> Swept:
    """The sweep's plan of the neurons' hypergraph ``hg`` (the hypergraph method's start):
    multilevel from the groups of identical rows where they shrink it, then refined on the
    neurons."""
    from .groups import identical_row_clusters, layer_groups, shrinks
    from .hypergraph import contract

    groups = layer_groups(patterns, nparts)
    if not shrinks(patterns, groups):
        return multilevel(hg, nparts, limits, seed, fixed_inputs=fixed_inputs,
                          deadline=deadline, log=log)
    coarse, coarse_of = contract(hg, identical_row_clusters(patterns, nparts, groups))
    swept = multilevel(coarse, nparts, limits, seed, fixed_inputs=fixed_inputs,
                       deadline=deadline, log=log)
    return refine(hg, swept.parts[coarse_of], nparts, limits, seed,
                  frozen_inputs=fixed_inputs is not None, deadline=deadline, log=log,
                  what="neurons")


def search_sweep(patterns: Sequence[Pattern], nparts: int, *, epsilon: float, seed: int,
                 objective: str, deadline: Deadline = NO_DEADLINE, log: Log | None = None,
                 first_layer: int = 1, fixed_inputs: np.ndarray | None = None,
                 compare: bool = True) -> SweepResult:
    """The sweep method on ``patterns`` (the whole network, or a window whose inputs are fixed
    to ``fixed_inputs``). Where groups of identical rows shrink the network, only their
    hypergraph is built (partition/groups.py). ``compare``: the baselines are candidates too
    (the least volume wins; a winning baseline is refined in turn)."""
    from spdnn.model.plan import plan_statistics

    from .baselines import baseline_owners
    from .hypergraph import build_hypergraph
    from .options import BASELINES

    limits = pattern_limits(patterns, nparts, epsilon)
    frozen = fixed_inputs is not None
    left = deadline.left()
    if compare and left is not None:  # keep back what counting the candidates will take
        pins = sum(len(p[1]) + p[2][1] for p in patterns)
        deadline = Deadline(max(left - COMPARE_SECONDS_PER_PIN * pins, 0.0))
    try:
        parts, hg = _sweep(patterns, nparts, epsilon, limits, seed, objective, first_layer,
                           fixed_inputs, deadline, log)
        unfinished = ["sweep: refinement cut short"] if deadline.passed() else []
    except OutOfTime as exc:  # no plan of the sweep's: the baselines are left
        parts, hg, unfinished = None, None, [f"{exc} (the time limit passed)"]
    sizes = [patterns[0][2][1]] + [p[2][0] for p in patterns]
    bounds = np.concatenate([[0], np.cumsum(sizes)])

    def split(p: np.ndarray) -> list[np.ndarray]:
        return [p[bounds[k]:bounds[k + 1]].astype(np.int32) for k in range(len(sizes))]

    def baseline(b: str) -> list[np.ndarray]:
        owners = baseline_owners(b, patterns, parts=nparts, seed=seed)
        if frozen:
            owners[0] = fixed_inputs.astype(np.int32)
        return owners

    if not compare:
        owners, chosen = (split(parts), "sweep") if parts is not None else \
            (baseline("block"), "block")
        return SweepResult(owners=owners, chosen=chosen, volume=None, candidates={},
                           unfinished=unfinished)

    def volume(owners: list[np.ndarray]) -> int:
        st = plan_statistics(patterns, owners, parts=nparts, first_layer=first_layer)
        return st.forward_total if objective == "infer" else st.volume

    candidates: dict[str, int] = {}
    best_name, best_owners, best_volume = "sweep", None, None
    if parts is not None and all(_fits(parts, patterns, limits)):
        best_owners = split(parts)
        best_volume = candidates["sweep"] = volume(best_owners)
    for b in BASELINES:
        owners = baseline(b)
        candidates[b] = volume(owners)
        if best_volume is None or candidates[b] < best_volume:
            best_name, best_owners, best_volume = b, owners, candidates[b]
    if best_name != "sweep" and not deadline.passed():
        # A baseline won (a banded network): the local search starts from it.
        if hg is None:
            hg = build_hypergraph(patterns, objective=objective, first_layer=first_layer)
        polished = split(refine(hg, np.concatenate(best_owners), nparts, limits, seed,
                                frozen_inputs=frozen, deadline=deadline, log=log,
                                what=f"{best_name} refined").parts)
        v = candidates[f"{best_name}+sweep"] = volume(polished)
        if v < best_volume:
            best_name, best_owners, best_volume = f"{best_name}+sweep", polished, v
    if log:
        log("candidates: " + ", ".join(f"{n} {v:,}" for n, v in candidates.items())
            + f"; {best_name} kept")
    return SweepResult(owners=best_owners, chosen=best_name, volume=best_volume,
                       candidates=candidates, unfinished=unfinished)


def _sweep(patterns: Sequence[Pattern], nparts: int, epsilon: float, limits: np.ndarray,
           seed: int, objective: str, first_layer: int, fixed_inputs: np.ndarray | None,
           deadline: Deadline, log: Log | None) -> tuple[np.ndarray, Hypergraph | None]:
    """The sweep's block of every neuron (OutOfTime if the deadline passes before it is
    placed), and the neurons' hypergraph where it was built."""
    from .groups import grouped_hypergraph, layer_groups, shrinks
    from .hypergraph import build_hypergraph

    groups = layer_groups(patterns, nparts, epsilon)
    if not shrinks(patterns, groups):
        hg = build_hypergraph(patterns, objective=objective, first_layer=first_layer)
        if log:
            log(f"hypergraph: {hg.n_vertices:,} vertices, {len(hg.net_pins):,} pins")
        return multilevel(hg, nparts, limits, seed, fixed_inputs=fixed_inputs,
                          deadline=deadline, log=log).parts, hg
    coarse, coarse_of = grouped_hypergraph(patterns, groups, objective=objective,
                                           first_layer=first_layer)
    if log:
        log(f"groups of identical rows: {coarse.n_vertices:,} vertices, "
            f"{len(coarse.net_pins):,} pins")
    parts = multilevel(coarse, nparts, limits, seed, fixed_inputs=fixed_inputs,
                       deadline=deadline, log=log).parts[coarse_of]
    del coarse, coarse_of
    if all(_fits(parts, patterns, limits)):
        return parts, None
    # Chunks of unequal weights too coarse to balance: repaired on the neurons.
    hg = build_hypergraph(patterns, objective=objective, first_layer=first_layer)
    return refine(hg, parts, nparts, limits, seed, frozen_inputs=fixed_inputs is not None,
                  deadline=deadline, log=log, what="neurons").parts, hg
