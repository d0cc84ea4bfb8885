"""Dynamic sparsity: when the topology of a network changes as it trains, by how much, and the
P-independent draws of its growth (SET, Mocanu et al. 2018; RigL, Evci et al. 2020).

An update follows optimizer step s (s = 1, 2, ... counted over the whole job) when
s % every == 0 and s < T_end; its fraction is F/2 (1 + cos(pi s / T_end)) (RigL's cosine).
In row scope each row of a layer that can change drops round(fraction x its entries) of its
smallest |w| (ties: the lower column first) and grows as many among the columns it no longer
holds (a just-dropped column may be grown again: it then keeps its weight and state), so every
neuron keeps its fan-in. SET grows at random (``grow_draws``); RigL grows the largest |dL/dw|
on the update's batch (ties: the lower column first). In layer scope the layer drops
round(fraction x its entries) of its smallest |w| (ties: the lower row, then column) and grows
as many anywhere it holds no connection (SET: ``layer_draws``; RigL: the largest |dL/dw|, ties
the lower row, then column); a row's fan-in may change. Grown weights start at zero (RigL) or
uniform in +-sqrt(6 / (n_in + n_out)) (SET, as the Truly Sparse code's ``SET_MLP``); their
optimizer state starts at zero. The serial reference and the runtime implement the rule each
on its own; they share these settings and draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from spdnn.errors import OptionError
from spdnn.model.counters import uniform

Mode = Literal["set", "rigl"]
Scope = Literal["row", "layer"]
MODES: tuple[str, ...] = get_args(Mode)
SCOPES: tuple[str, ...] = get_args(Scope)


@dataclass(frozen=True, kw_only=True)
class SparseUpdate:
    """The topology updates of a job: ``mode`` set or rigl, after every ``every`` steps, the
    fraction ``drop_fraction`` decayed to zero at ``until`` (a fraction of the job's planned
    steps ``total`` when a float in (0, 1], else a step), in ``scope`` row."""

    mode: str
    every: int = 100
    drop_fraction: float = 0.3
    until: float | int = 0.75
    scope: str = "row"
    locality: float = 1.0  # W: growth W times as likely (SET) or scored W times (RigL) near
    replan: str = "never"  # never | auto | every:K (updates between replans)
    seed: int = 0
    total: int = 0  # the job's planned steps (0: not known yet)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError("sparse_update", f"must be one of {', '.join(MODES)}, not "
                                               f"{self.mode!r}")
        if self.scope not in SCOPES:
            raise OptionError("update_scope", f"must be {' or '.join(SCOPES)}, not "
                                              f"{self.scope!r}")
        e = self.every
        if isinstance(e, bool) or not isinstance(e, int) or e < 1:
            raise OptionError("update_every", f"must be an integer >= 1, not {e!r}")
        f = self.drop_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1:
            raise OptionError("drop_fraction", f"must be a fraction in (0, 1), not {f!r}")
        w = self.locality
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf:
            raise OptionError("grow_locality", f"must be a finite number > 0, not {w!r}")
        if w != 1 and self.scope == "layer" and self.mode == "set":
            raise OptionError("grow_locality", "does not apply with set in layer scope yet: "
                                               "its draws span every rank's rows")
        self.replan_every()  # checks the form
        u = self.until
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not math.isfinite(u) \
                or u <= 0 or (isinstance(u, float) and u > 1):
            raise OptionError("update_until", f"must be a fraction in (0, 1] of the job's "
                                              f"steps or a step >= 1, not {u!r}")

    def replan_every(self) -> int | None:
        """K of ``every:K`` (0 for ``auto``, None for ``never``)."""
        r = self.replan
        if r == "never":
            return None
        if r == "auto":
            return 0
        head, _, count = str(r).partition(":")
        if head != "every" or not count.isdigit() or int(count) < 1:
            raise OptionError("replan", f"must be never, auto or every:K (K >= 1), not {r!r}")
        return int(count)

    def end(self) -> int:
        """T_end: the step at which the fraction reaches zero."""
        if isinstance(self.until, float):
            return max(1, int(self.until * self.total))
        return int(self.until)

    def due(self, step: int) -> bool:
        """Whether an update follows optimizer step ``step`` (1-based)."""
        return step % self.every == 0 and step < self.end()

    def fraction(self, step: int) -> float:
        return self.drop_fraction / 2 * (1 + math.cos(math.pi * step / self.end()))

    def index(self, step: int) -> int:
        """The update's number (1, 2, ...): a key of its draws."""
        return step // self.every

    def settings(self) -> dict[str, Any]:
        """What a checkpoint records to refuse a resume with other updates."""
        return {"sparse_update": self.mode, "update_every": self.every,
                "drop_fraction": self.drop_fraction, "update_until": self.until,
                "update_scope": self.scope, "update_end": self.end(),
                "grow_locality": self.locality, "replan": self.replan}

    def describe(self) -> str:
        near = f", growth near x{self.locality:g}" if self.locality != 1 else ""
        near += f", replan {self.replan}" if self.replan != "never" else ""
        return (f"; {self.mode} topology updates every {self.every} steps (fraction "
                f"{self.drop_fraction:g}, to zero at step {self.end()}, {self.scope} scope"
                f"{near})")


def drop_counts(entries: np.ndarray, fraction: float) -> np.ndarray:
    """Connections each row drops (and grows): round(fraction x its entries), halves up."""
    return np.floor(np.asarray(entries, np.float64) * fraction + 0.5).astype(np.int64)


def changeable(n_out: int, n_in: int, nnz: int) -> bool:
    """A layer whose rows read every input (a dense head) keeps its connections."""
    return nnz < n_out * n_in


def grow_draws(seed: int, update: int, layer: int, rows: np.ndarray, attempt: int,
               n_in: int, near: np.ndarray | None = None, locality: float = 1.0
               ) -> np.ndarray:
    """SET's candidate column of each row at its ``attempt``-th draw (0, 1, ...) of update
    ``update`` of ``layer``: whichever rank owns a row draws the same sequence. A row takes its
    candidates in order, skipping a column it holds or took already. ``near`` (sorted columns:
    those the row's rank holds) with ``locality`` W: a near column W times as likely as
    another."""
    u = uniform(seed, "grow", update, layer, rows, np.array([attempt]))[:, 0]
    if near is None or locality == 1:
        return np.minimum((u * n_in).astype(np.int64), n_in - 1)
    far = np.setdiff1d(np.arange(n_in), near)
    heavy = locality * len(near)
    x = u * (heavy + len(far))
    pick_near = x < heavy
    at_near = np.minimum((x / locality).astype(np.int64), max(len(near) - 1, 0))
    at_far = np.clip((x - heavy).astype(np.int64), 0, max(len(far) - 1, 0))
    return np.where(pick_near, near[at_near] if len(near) else 0,
                    far[at_far] if len(far) else 0).astype(np.int64)


def layer_draws(seed: int, update: int, layer: int, first: int, count: int, n_out: int,
                n_in: int) -> np.ndarray:
    """SET's candidates in layer scope: draws ``first`` .. ``first + count - 1`` of update
    ``update`` of ``layer``, each a position row x n_in + column of the whole layer. The layer
    takes them in order, skipping a position it holds or took already."""
    u = uniform(seed, "grow_layer", update, layer, np.arange(first, first + count),
                np.zeros(1, np.int64))[:, 0]
    return np.minimum((u * (n_out * n_in)).astype(np.int64), n_out * n_in - 1)


def grown_values(seed: int, update: int, layer: int, rows: np.ndarray, columns: np.ndarray,
                 n_in: int, n_out: int, mode: str, dtype: np.dtype) -> np.ndarray:
    """The starting weights of grown entries (``rows[e]``, ``columns[e]``): zero (RigL) or
    uniform in +-sqrt(6 / (n_in + n_out)) (SET), drawn by row and column."""
    if mode == "rigl" or not len(rows):
        return np.zeros(len(rows), dtype)
    limit = math.sqrt(6.0 / (n_in + n_out))
    u = uniform(seed, "grow_value", update, layer,
                np.asarray(rows, np.int64) * n_in + np.asarray(columns, np.int64),
                np.zeros(1, np.int64))[:, 0]
    return ((2 * u - 1) * limit).astype(dtype)
