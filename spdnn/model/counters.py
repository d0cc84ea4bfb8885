"""Random numbers that do not depend on P: a counter-based generator (splitmix64 of the key) is
evaluated at (seed, purpose, step, layer, neuron, sample's index in the data set), so whichever
rank owns a neuron draws the same value for it. A stream drawn in order (np.random.Generator)
would not: its values depend on how many draws came before on that rank.

Dropout is its first use: inverted dropout on the hidden layers' outputs in training, the
masks drawn here by both engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spdnn.errors import OptionError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
PURPOSES = {"dropout": 1, "grow": 2, "grow_value": 3, "grow_layer": 4}  # a key space per use


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping), in place."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _key(*parts: int) -> np.uint64:
    k = np.zeros(1, np.uint64)
    for p in parts:
        k += np.uint64(p % 2**64) + _GOLDEN
        _mix(k)
    return k[0]


def uniform(seed: int, purpose: str, step: int, layer: int, rows: np.ndarray,
            samples: np.ndarray) -> np.ndarray:
    """U[0, 1) draws, one per (row, sample): len(rows) x len(samples), float64 (53 bits)."""
    with np.errstate(over="ignore"):
        key = _key(seed, PURPOSES[purpose], step, layer)
        r = np.asarray(rows, np.uint64)[:, None] * _GOLDEN + key
        _mix(r)
        z = r + (np.asarray(samples, np.uint64)[None, :] + np.uint64(1)) * _M1
        _mix(z)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


@dataclass(frozen=True)
class Dropout:
    """Inverted dropout: hidden layer k's output x_k(i, b) kept with probability 1 - p_k and
    scaled by 1 / (1 - p_k), else an exact zero; ``rates`` holds p_k for k = 1..L-1."""

    rates: tuple[float, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        for p in self.rates:
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
                raise OptionError("dropout", f"must be a fraction in [0, 1), not {p!r}")

    @classmethod
    def of(cls, given: float | Sequence[float] | None, hidden: int, seed: int
           ) -> Dropout | None:
        """One rate for every hidden layer, or one per hidden layer; None without any."""
        if given is None:
            return None
        rates = (given,) * hidden if isinstance(given, (int, float)) else tuple(given)
        if len(rates) != hidden:
            raise OptionError("dropout", f"lists {len(rates)} rates for {hidden} hidden "
                                         "layers (give one, or one per hidden layer)")
        out = cls(tuple(float(p) for p in rates), seed)
        return out if any(out.rates) else None

    def mask(self, step: int, layer: int, rows: np.ndarray, samples: np.ndarray,
             dtype: np.dtype) -> np.ndarray | None:
        """Layer ``layer``'s (1..L-1) factors for ``rows`` x ``samples`` at ``step``: 0 where
        dropped, 1 / (1 - p) where kept; None where the layer keeps everything."""
        p = self.rates[layer - 1]
        if p == 0:
            return None
        kept = uniform(self.seed, "dropout", step, layer, rows, samples) >= p
        return np.where(kept, np.asarray(1 / (1 - p), dtype), np.asarray(0, dtype))

    def settings(self) -> dict[str, list[float]]:
        return {"dropout": list(self.rates)}

    def describe(self) -> str:
        return "; dropout " + ",".join(f"{p:g}" for p in self.rates)
