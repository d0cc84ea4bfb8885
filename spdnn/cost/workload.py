"""What each rank computes and sends under a plan, counted exactly as the runtime does it: per
layer and rank, the nonzeros that read owned and ghost rows, and the expand messages (source,
destination, rows; the fold sends the same rows back for layers k >= 2). No MPI, no timing:
``spdnn.cost.costmodel`` turns this into time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.backends import active
from spdnn.errors import SpdnnError
from spdnn.model.plan import Pattern, Plan, cut_pairs


@dataclass(frozen=True, kw_only=True)
class LayerWork:
    """Layer k of one replica, per part p (arrays of length ``parts``)."""

    rows: np.ndarray  # owned rows of layer k
    prev_rows: np.ndarray  # owned rows of layer k-1
    nnz_owned: np.ndarray  # nonzeros reading owned rows of layer k-1
    nnz_ghost: np.ndarray  # nonzeros reading ghost rows
    ghosts: np.ndarray  # ghost rows received in the expand
    sent: np.ndarray  # rows sent in the expand
    src: np.ndarray  # expand messages, in the order the runtime posts them (by source, then
    dst: np.ndarray  # destination): rows of layer k-1 from src to dst
    count: np.ndarray

    @property
    def nnz(self) -> np.ndarray:
        return self.nnz_owned + self.nnz_ghost

    @property
    def buffer_rows(self) -> np.ndarray:
        return self.prev_rows + self.ghosts


@dataclass(frozen=True, kw_only=True)
class Workload:
    parts: int
    sizes: tuple[int, ...]
    method: str
    layers: tuple[LayerWork, ...]
    locality: np.ndarray | None = None  # (layers, 2): ``locality`` of the network

    def layer(self, i: int) -> LayerWork:
        """Layer i+1's work with its messages."""
        return self.layers[i]

    def counts(self, batch: int, replicas: int, itemsize: int) -> dict[str, list[int]]:
        """Messages, rows and bytes one training step moves per layer (index k-1), summed
        over all ranks, as the runtime counts them (``Traffic``): the expand (forward) and
        fold (backward; none into the inputs) on the model axis, and the values and bytes
        put into the gradient sums on the replica axis (none with one replica)."""
        out: dict[str, list[int]] = {k: [] for k in (
            "forward_messages", "forward_rows", "forward_bytes", "backward_messages",
            "backward_rows", "backward_bytes", "gradient_values", "gradient_bytes")}
        for k in range(1, len(self.layers) + 1):
            lw = self.layer(k - 1)
            msgs, rows = len(lw.count), int(lw.count.sum())
            fold = k > 1
            out["forward_messages"].append(replicas * msgs)
            out["forward_rows"].append(replicas * rows)
            out["forward_bytes"].append(rows * batch * itemsize)
            out["backward_messages"].append(replicas * msgs if fold else 0)
            out["backward_rows"].append(replicas * rows if fold else 0)
            out["backward_bytes"].append(rows * batch * itemsize if fold else 0)
            values = replicas * int(lw.nnz.sum() + lw.rows.sum()) if replicas > 1 else 0
            out["gradient_values"].append(values)
            out["gradient_bytes"].append(values * itemsize)
        return out

    def summary(self) -> dict[str, Any]:
        return {"parts": self.parts, "method": self.method,
                "messages_per_layer": [len(self.layer(i).count)
                                       for i in range(len(self.layers))],
                "rows_per_layer": [int(lw.sent.sum()) for lw in self.layers]}


@dataclass(frozen=True, kw_only=True)
class StreamedWorkload(Workload):
    """A ``Workload`` whose message lists are counted again from the patterns whenever
    ``layer`` is asked, for networks where they do not fit in memory (RadiX-Net 65536 x 1920
    under the block plan at P = 1,024: 1.7e9 messages). ``layers`` keep each rank's counts,
    their message lists empty: read messages through ``layer``."""

    patterns: Sequence[Pattern]
    plan: Plan

    def layer(self, i: int) -> LayerWork:
        return layer_work(self.patterns[i], self.plan.owners[i + 1], self.plan.owners[i],
                          self.parts)


BLOCK = 16  # rows (columns) per block in ``locality``


def locality(patterns: list[Pattern]) -> np.ndarray:
    """Per layer, how much fewer distinct rows the products gather than random columns would:
    over blocks of 16 consecutive rows (the forward product, the weight gradient) and of 16
    consecutive columns (the transposed product), the expected share of distinct among the
    read rows for uniformly random columns with the same counts, minus the layer's own. 0 for
    a random layer; about 0.44 forward and backward for RadiX-Net 16384 (its neighbouring rows
    share columns), whose products run up to 2x faster than random ones of the same shape."""
    out = np.zeros((len(patterns), 2))
    for k, pattern in enumerate(patterns):
        out[k] = layer_locality(pattern)
    return out


def layer_locality(pattern: Pattern) -> np.ndarray:
    """One layer's row of ``locality``."""
    indptr, indices, (n_out, n_in) = pattern
    out = np.zeros(2)
    nnz = len(indices)
    if nnz == 0:
        return out
    w = sp.csr_matrix((np.ones(nnz, np.float32), indices, indptr), shape=(n_out, n_in))
    # Distinct (block, row read) pairs: the nonzeros of block-summing products (sparse
    # products run in C; a sort of the pairs took 25x longer).
    row_blocks = _blocks(n_out)
    col_blocks = _blocks(n_in)
    for side, (distinct, n_other, counts) in enumerate((
            ((row_blocks @ w).nnz, n_in, np.diff(indptr)),
            ((w @ col_blocks.T).nnz, n_out, np.bincount(indices, minlength=n_in)))):
        # E[distinct] of random columns: n (1 - prod over the block's lines (1 - k / n)).
        logs = np.log1p(-np.minimum(counts, n_other - 0.5) / n_other)
        sums = np.add.reduceat(logs, np.arange(0, len(counts), BLOCK))
        expected = float(np.sum(n_other * -np.expm1(sums)))
        out[side] = max(expected - distinct, 0.0) / nnz
    return out


def _blocks(n: int) -> sp.csr_matrix:
    """The (n / BLOCK) x n matrix that sums consecutive blocks of BLOCK lines."""
    return sp.csr_matrix((np.ones(n, np.float32), (np.arange(n) // BLOCK, np.arange(n))),
                         shape=(-(-n // BLOCK), n))


PAIR_TABLE_PARTS = 4096  # up to here a layer's rank pairs are counted in a P x P table


def layer_work(pattern: Pattern, own_out: np.ndarray, own_in: np.ndarray, parts: int
               ) -> LayerWork:
    """One layer's ``LayerWork`` under the owners of its rows and of its inputs."""
    indptr, indices, _ = pattern
    compiled = active().compiled("spdnn.cost._workload_kernels")
    if parts <= PAIR_TABLE_PARTS and compiled is not None:
        arrays = compiled.layer_work(indptr, indices, own_out, own_in, parts,
                                     np.zeros(parts * parts, dtype=np.int32))
        return LayerWork(**dict(zip(_FIELDS, arrays)))
    # numpy's form (the scipy backend, and too many ranks for the pair table): the pairs sorted
    row_rank = np.repeat(own_out.astype(np.int64), np.diff(indptr))
    local = own_in[indices] == row_rank
    j, p = cut_pairs(indptr, indices, own_out, own_in, parts)
    src = own_in[j].astype(np.int64)
    key, count = np.unique(src * parts + p, return_counts=True)
    return LayerWork(
        rows=np.bincount(own_out, minlength=parts),
        prev_rows=np.bincount(own_in, minlength=parts),
        nnz_owned=np.bincount(row_rank[local], minlength=parts),
        nnz_ghost=np.bincount(row_rank[~local], minlength=parts),
        ghosts=np.bincount(p, minlength=parts), sent=np.bincount(src, minlength=parts),
        src=key // parts, dst=key % parts, count=count)


_FIELDS = ("rows", "prev_rows", "nnz_owned", "nnz_ghost", "ghosts", "sent", "src", "dst",
           "count")


def _check_sizes(k: int, shape: tuple[int, int], plan: Plan) -> None:
    own_out, own_in = plan.owners[k], plan.owners[k - 1]
    if shape != (len(own_out), len(own_in)):
        raise SpdnnError(f"layer {k}: the plan's sizes ({len(own_out)} x {len(own_in)}) "
                         f"are not the network's ({shape[0]} x {shape[1]})")


def workload(patterns: Sequence[Pattern], plan: Plan,
             pattern_locality: np.ndarray | None = None) -> Workload:
    """Per-rank work and messages of ``plan`` on a network given by its patterns
    (``pattern_locality``: their ``locality``, computed when not given)."""
    n = plan.parts
    if len(patterns) != len(plan.owners) - 1:
        raise SpdnnError(f"the plan has {len(plan.owners) - 1} layers, the network "
                         f"{len(patterns)}")
    layers = []
    for k, pattern in enumerate(patterns, start=1):
        _check_sizes(k, pattern[2], plan)
        layers.append(layer_work(pattern, plan.owners[k], plan.owners[k - 1], n))
    return Workload(parts=n, sizes=plan.sizes, method=str(plan.meta.get("method", "plan")),
                    layers=tuple(layers),
                    locality=locality(patterns) if pattern_locality is None else pattern_locality)


def streamed_workloads(patterns: Sequence[Pattern], plans: Sequence[Plan],
                       pattern_locality: np.ndarray | None = None) -> list[StreamedWorkload]:
    """``workload`` of each plan, holding per layer only each rank's counts
    (``StreamedWorkload``): one pass over ``patterns``, which may read each layer from a file
    when asked (``pattern_locality``, when not given, computed in the same pass)."""
    for plan in plans:
        if len(patterns) != len(plan.owners) - 1:
            raise SpdnnError(f"the plan has {len(plan.owners) - 1} layers, the network "
                             f"{len(patterns)}")
    none = np.zeros(0, dtype=np.int64)
    layers: list[list[LayerWork]] = [[] for _ in plans]
    local = np.zeros((len(patterns), 2)) if pattern_locality is None else pattern_locality
    for k in range(1, len(patterns) + 1):
        pattern = patterns[k - 1]
        if pattern_locality is None:
            local[k - 1] = layer_locality(pattern)
        for plan, out in zip(plans, layers):
            _check_sizes(k, pattern[2], plan)
            lw = layer_work(pattern, plan.owners[k], plan.owners[k - 1], plan.parts)
            out.append(replace(lw, src=none, dst=none, count=none))
    return [StreamedWorkload(parts=plan.parts, sizes=plan.sizes,
                             method=str(plan.meta.get("method", "plan")), layers=tuple(out),
                             locality=local, patterns=patterns, plan=plan)
            for plan, out in zip(plans, layers)]
