"""The baseline plans every search is held against: block, cyclic and random."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spdnn.errors import SpdnnError
from spdnn.model.plan import Pattern


def neuron_weights(patterns: Sequence[Pattern]) -> list[np.ndarray]:
    """Every layer's neurons' work (the inputs count 1 each, to be spread evenly)."""
    n0 = patterns[0][2][1]
    return [np.ones(n0, dtype=np.int64)] + [np.diff(p[0]).astype(np.int64) for p in patterns]


def _split_by_weight(weights: np.ndarray, nparts: int) -> np.ndarray:
    """Contiguous ranges with balanced weight: item i goes to floor(P * prefix_mid / total)."""
    total = weights.sum()
    if total == 0:
        return (np.arange(len(weights)) * nparts // max(len(weights), 1)).astype(np.int32)
    mid = np.cumsum(weights) - weights / 2
    return np.minimum((mid * nparts / total).astype(np.int64), nparts - 1).astype(np.int32)


def baseline_owners(method: str, patterns: Sequence[Pattern], *, parts: int,
                    seed: int = 0, weights: list[np.ndarray] | None = None
                    ) -> list[np.ndarray]:
    """The owners of every layer's neurons among ``parts`` ranks. block: contiguous
    weight-balanced ranges; cyclic: neuron n to rank n mod P; random: a seeded permutation cut
    into weight-balanced ranges. ``weights``: ``neuron_weights(patterns)``, when known."""
    if weights is None:
        weights = neuron_weights(patterns)
    rng = np.random.default_rng(seed)
    owners = []
    for w in weights:
        if method == "block":
            owners.append(_split_by_weight(w, parts))
        elif method == "cyclic":
            owners.append((np.arange(len(w)) % parts).astype(np.int32))
        elif method == "random":
            perm = rng.permutation(len(w))
            o = np.empty(len(w), dtype=np.int32)
            o[perm] = _split_by_weight(w[perm], parts)
            owners.append(o)
        else:
            raise SpdnnError(f"unknown method '{method}'")
    return owners
