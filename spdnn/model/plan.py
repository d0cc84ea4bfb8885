"""Plans: which rank owns which neuron of every layer, and what that assignment costs.

A plan is a record in memory; ``spdnn.io.planfile`` reads and writes it.

``plan_statistics`` is the one function that computes communication volume and balance; the
partitioner, the plan metadata, the runtime's accounting and the tests all use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from spdnn.errors import InputError, SpdnnError

# (indptr, indices, shape) of one layer's W_k: all the statistics need.
Pattern = tuple[np.ndarray, np.ndarray, tuple[int, int]]


@dataclass(frozen=True)
class Plan:
    parts: int  # P: the model parts (one rank each, per replica)
    owners: tuple[np.ndarray, ...]  # owners[k]: rank of each neuron of layer k = 0..L
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(o) for o in self.owners)

    @property
    def fingerprint(self) -> str | None:
        return self.meta.get("fingerprint")

    def check_for(self, sizes: Sequence[int], fingerprint: str | None,
                  source: str = "plan") -> None:
        """Refuse a plan made for another network (sizes, or fingerprint when given, differ)."""
        if tuple(sizes) != self.sizes:
            raise InputError(source, f"plan is for layer sizes {_sizes(self.sizes)}, the network "
                                     f"has {_sizes(sizes)}")
        if None not in (fingerprint, self.fingerprint) and self.fingerprint != fingerprint:
            raise InputError(source, f"plan was made for network {self.fingerprint}, not for "
                                     f"this network ({fingerprint})")

    def rows_of(self, rank: int, layer: int) -> np.ndarray:
        """Global indices of the neurons of ``layer`` that ``rank`` owns, ascending."""
        return np.flatnonzero(self.owners[layer] == rank)


def _sizes(sizes: Sequence[int]) -> str:
    s = list(sizes)
    return str(s) if len(s) <= 8 else f"[{s[0]}, ..., {s[-1]}] ({len(s)} layers incl. input)"


def check_owners(owners: Sequence[np.ndarray], parts: int, source: str = "plan") -> None:
    if parts < 1:
        raise InputError(source, f"nparts must be at least 1, not {parts}")
    for k, o in enumerate(owners):
        if o.ndim != 1 or not np.issubdtype(o.dtype, np.integer):
            raise InputError(source, f"owner{k} must be a 1-D integer array")
        if len(o) and (int(o.min()) < 0 or int(o.max()) >= parts):
            raise InputError(source, f"owner{k} has ranks outside [0, {parts})")


# --------------------------------------------------------------------------- statistics


# Largest (input rows x ranks) table ``cut_pairs`` marks in (bytes); beyond it, it sorts.
CUT_TABLE_CELLS = 1 << 26
# plan_statistics counts the rank pairs in a table of P x P stamps up to this many ranks.
PAIR_TABLE_PARTS = 4096


def cut_pairs(indptr: np.ndarray, indices: np.ndarray, owner_out: np.ndarray,
              owner_in: np.ndarray, nparts: int) -> tuple[np.ndarray, np.ndarray]:
    """The (input row j, rank p) pairs where p owns a row of W using j but does not own j.

    Each pair is one row sent forward (owner_in[j] -> p) and one partial row folded back
    (p -> owner_in[j]). Returned sorted by (j, p), unique.
    """
    row_rank = np.repeat(owner_out.astype(np.intp), np.diff(indptr))
    n_in = len(owner_in)
    if n_in * nparts <= CUT_TABLE_CELLS:
        # A table of (input row, rank) marks: O(nnz), where sorting the pairs is
        # O(nnz log nnz) (several times faster on RadiX-Net layers at P = 64).
        used = np.zeros((n_in, nparts), dtype=bool)
        used[indices, row_rank] = True
        used[np.arange(n_in), owner_in] = False
        j, p = np.nonzero(used)
        return j.astype(np.int64), p.astype(np.int64)
    key = np.unique(indices.astype(np.int64) * nparts + row_rank)
    j, p = key // nparts, key % nparts
    keep = owner_in[j] != p
    return j[keep], p[keep]


@dataclass(frozen=True, kw_only=True)
class PlanStats:
    """Communication and balance of a plan; volumes in rows of B values.

    Per layer k = 1..L (index k-1): forward rows (expand into layer k), backward rows (fold out of
    layer k; 0 for k = 1), communicating rank pairs, imbalance max_p load/avg - 1 with load = row
    nonzeros. Per rank: rows sent and received over one minibatch (forward + backward).
    """

    parts: int
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    pairs: tuple[int, ...]
    imbalance: tuple[float, ...]
    sent: tuple[int, ...]
    received: tuple[int, ...]

    @property
    def forward_total(self) -> int:
        return sum(self.forward)

    @property
    def backward_total(self) -> int:
        return sum(self.backward)

    @property
    def volume(self) -> int:
        return self.forward_total + self.backward_total

    @property
    def max_imbalance(self) -> float:
        return max(self.imbalance, default=0.0)

    @property
    def messages(self) -> int:
        """Point-to-point messages of one training step: a rank pair that exchanges rows in a
        layer sends once forward and, where that layer folds, once back."""
        return sum(self.pairs) + sum(p for p, b in zip(self.pairs, self.backward) if b)

    @classmethod
    def from_summary(cls, d: dict[str, Any]) -> PlanStats:
        """The statistics that ``summary`` wrote (a plan's ``meta["stats"]``)."""
        return cls(parts=int(d["parts"]), **{f: tuple(d[f]) for f in (
            "forward", "backward", "pairs", "imbalance", "sent", "received")})

    def summary(self) -> dict[str, Any]:
        """JSON-able: totals plus the per-layer and per-rank lists."""
        d = asdict(self)
        d.update(forward_total=self.forward_total, backward_total=self.backward_total,
                 volume=self.volume, max_imbalance=self.max_imbalance, messages=self.messages,
                 max_sent=max(self.sent), mean_sent=float(np.mean(self.sent)),
                 max_received=max(self.received), mean_received=float(np.mean(self.received)))
        return d


def layer_loads(indptr: np.ndarray, owner: np.ndarray, nparts: int) -> np.ndarray:
    return np.bincount(owner, weights=np.diff(indptr), minlength=nparts)


def imbalance_of(loads: np.ndarray) -> float:
    avg = loads.mean()
    return float(loads.max() / avg - 1) if avg > 0 else 0.0


def imbalance_limits(patterns: Iterable[Pattern], parts: int, epsilon: float
                     ) -> tuple[float, ...]:
    """Per layer, the imbalance the partitioner allows (as ``imbalance``: max load / average
    - 1): a part may hold (1 + epsilon) x the average load plus one row, so a layer of few,
    heavy rows (a classifier head) may be far from even and still within its limit."""
    limits = []
    for indptr, _, _ in patterns:
        w = np.diff(indptr)
        total = float(w.sum())
        limits.append(epsilon + float(w.max()) * parts / total if total > 0 else 0.0)
    return tuple(limits)


def balance_report(stats: PlanStats, limits: Sequence[float] | None) -> str:
    """One phrase: the worst layer against its limit, or the layers over it."""
    if not stats.imbalance:
        return "no layers"
    worst = int(np.argmax(stats.imbalance))
    if limits is None:
        return f"max imbalance {100 * stats.imbalance[worst]:.2f}% (layer {worst + 1})"
    over = [k for k, (i, lim) in enumerate(zip(stats.imbalance, limits)) if i > lim + 1e-9]
    if over:
        return "OVER the balance limit on layer(s) " + ", ".join(
            f"{k + 1} ({100 * stats.imbalance[k]:.2f}% > {100 * limits[k]:.2f}%)" for k in over)
    return (f"every layer within its balance limit (max imbalance "
            f"{100 * stats.imbalance[worst]:.2f}% on layer {worst + 1}, whose limit is "
            f"{100 * limits[worst]:.2f}%)")


def plan_statistics(patterns: Iterable[Pattern], owners: Sequence[np.ndarray], *,
                    parts: int, first_layer: int = 1) -> PlanStats:
    """Statistics of ``owners`` on a network given as per-layer sparsity patterns.
    ``first_layer``: the network's number of ``patterns[0]`` when they are a window of its
    layers (``owners`` then starts at that layer's inputs); ``combine_stats`` joins windows."""
    from spdnn.backends import active

    compiled = active().compiled("spdnn.model._plan_counts")
    fwd, bwd, pairs, imb = [], [], [], []
    sent = np.zeros(parts, dtype=np.int64)
    recv = np.zeros(parts, dtype=np.int64)
    # The rank pairs seen, by layer: one table for the whole network (4 bytes a pair).
    pair_stamp = np.full(parts * parts, -1, dtype=np.int32) \
        if parts <= PAIR_TABLE_PARTS and compiled is not None else None
    for i, (indptr, indices, shape) in enumerate(patterns, start=1):
        k = i + first_layer - 1
        if shape != (len(owners[i]), len(owners[i - 1])):
            raise SpdnnError(f"layer {k}: plan sizes do not match the network")
        if pair_stamp is not None:
            cut, n_pairs = compiled.layer_cuts(indptr, indices, owners[i], owners[i - 1], parts,
                                               k > 1, sent, recv, pair_stamp, i)
        else:  # numpy's form (scipy backend; too many ranks for the table): the pairs sorted
            j, p = cut_pairs(indptr, indices, owners[i], owners[i - 1], parts)
            src = owners[i - 1][j]
            cut, n_pairs = len(j), len(np.unique(src.astype(np.int64) * parts + p))
            fs, fr = np.bincount(src, minlength=parts), np.bincount(p, minlength=parts)
            sent += fs
            recv += fr
            if k > 1:  # the fold goes the other way
                sent += fr
                recv += fs
        fwd.append(cut)
        bwd.append(cut if k > 1 else 0)
        pairs.append(n_pairs)
        imb.append(imbalance_of(layer_loads(indptr, owners[i], parts)))
    return PlanStats(parts=parts, forward=tuple(fwd), backward=tuple(bwd), pairs=tuple(pairs),
                     imbalance=tuple(imb),
                     sent=tuple(int(s) for s in sent), received=tuple(int(r) for r in recv))


def combine_stats(windows: Sequence[PlanStats]) -> PlanStats:
    """The statistics of consecutive windows of layers as one network's."""
    def joined(name: str) -> tuple:
        return tuple(v for w in windows for v in getattr(w, name))

    return PlanStats(parts=windows[0].parts, forward=joined("forward"),
                     backward=joined("backward"), pairs=joined("pairs"),
                     imbalance=joined("imbalance"),
                     sent=tuple(int(sum(v)) for v in zip(*(w.sent for w in windows))),
                     received=tuple(int(sum(v)) for v in zip(*(w.received for w in windows))))


def network_patterns(network: Any) -> list[Pattern]:
    """Patterns of a Network or NetworkBundle (read layer by layer from a bundle)."""
    if hasattr(network, "layers") and not callable(network.layers):
        return [(lay.weight.indptr, lay.weight.indices, lay.weight.shape)
                for lay in network.layers]
    return [(*network.pattern(k), network.shapes[k - 1]) for k in range(1, network.n_layers + 1)]


def balance_limit(indptr: np.ndarray, nparts: int, epsilon: float) -> float:
    """Largest load a rank may carry in this layer: (1 + eps) * avg + the heaviest row."""
    weights = np.diff(indptr)
    return (1 + epsilon) * weights.sum() / nparts + (int(weights.max()) if len(weights) else 0)


@dataclass(frozen=True, kw_only=True)
class StepValues:
    """Values one training step moves per layer (index k-1), over all ranks, for a minibatch
    of B samples on R replicas of a plan: ``expand`` (forward rows x B: the replicas' slices
    add up to B), ``fold`` (backward rows x B), ``gradient_in`` (the values the ranks put into
    the gradient sums over replicas: R x (nnz_k + n_k), none for R = 1) and ``gradient_sent``
    (what those sums send, assuming MPI's ring all-reduce: 2 (R - 1) / R of each rank's
    values)."""

    replicas: int
    batch: int
    expand: tuple[int, ...]
    fold: tuple[int, ...]
    gradient_in: tuple[int, ...]
    gradient_sent: tuple[float, ...]

    ALGORITHM = "ring all-reduce: each rank sends 2 (R - 1) / R of the values it sums"


def step_values(stats: PlanStats, nnz: Sequence[int], rows: Sequence[int], replicas: int,
                batch: int) -> StepValues:
    """Predict ``StepValues`` from a plan's statistics and each layer's nnz and row count."""
    owned = [int(a) + int(b) for a, b in zip(nnz, rows)] if replicas > 1 else [0] * len(nnz)
    return StepValues(replicas=replicas, batch=batch,
                      expand=tuple(v * batch for v in stats.forward),
                      fold=tuple(v * batch for v in stats.backward),
                      gradient_in=tuple(replicas * v for v in owned),
                      gradient_sent=tuple(2.0 * (replicas - 1) * v for v in owned))
