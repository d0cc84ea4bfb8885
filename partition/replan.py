"""Replanning for a topology that changed as it trained (``spdnn train --replan``): the plan
in force refined for the current patterns, not a new partition. The same hypergraph as a
partition (``build_hypergraph``), the sweep method's per-layer balanced refinement (label
propagation and pair swaps with exact gains, linear in the pins: partition/multilevel.py) started
from the current owners, the input layer kept where it is (its owners hold the data's
columns). Each move it makes lowers the volume; a move that would unbalance a layer is not
made, and a layer the update unbalanced is repaired first.

spdnn finds this function by its entry point (group ``spdnn.replanners``, name ``refine``):
spdnn never imports this package, which may import spdnn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spdnn.model.plan import Pattern

from .hypergraph import build_hypergraph
from .multilevel import refine
from .sweep import pattern_limits


def refine_plan(patterns: Sequence[Pattern], owners: Sequence[np.ndarray], parts: int,
                epsilon: float = 0.03) -> tuple[tuple[np.ndarray, ...], int]:
    """New owners of every layer's neurons (layer 0's unchanged) for the network of
    ``patterns``, refined from ``owners`` on ``parts`` parts under the per-layer balance
    ``epsilon``, and the rows a training step moves under them (forward and backward)."""
    hg = build_hypergraph(patterns)
    start = np.concatenate([np.asarray(o, dtype=np.int32) for o in owners])
    refined = refine(hg, start, parts, pattern_limits(patterns, parts, epsilon), seed=0,
                     frozen_inputs=True)
    return tuple(refined.parts[hg.offsets[k]:hg.offsets[k + 1]].astype(np.int32)
                 for k in range(len(owners))), int(refined.volume)
