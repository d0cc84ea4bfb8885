"""What each rank computes and sends under a plan, counted exactly as the runtime does it: per
layer and rank, the nonzeros that read owned and ghost rows, and the expand messages (source,
destination, rows; the fold sends the same rows back for layers k >= 2). No MPI, no timing:
``spdnn.cost.costmodel`` turns this into time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

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

    def counts(self, batch: int, replicas: int, itemsize: int) -> dict[str, list[int]]:
        """Messages, rows and bytes one training step moves per layer (index k-1), summed
        over all ranks, as the runtime counts them (``Traffic``): the expand (forward) and
        fold (backward; none into the inputs) on the model axis, and the values and bytes
        put into the gradient sums on the replica axis (none with one replica)."""
        out: dict[str, list[int]] = {k: [] for k in (
            "forward_messages", "forward_rows", "forward_bytes", "backward_messages",
            "backward_rows", "backward_bytes", "gradient_values", "gradient_bytes")}
        for k, lw in enumerate(self.layers, start=1):
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
                "messages_per_layer": [len(lw.count) for lw in self.layers],
                "rows_per_layer": [int(lw.count.sum()) for lw in self.layers]}


BLOCK = 16  # rows (columns) per block in ``locality``


def locality(patterns: list[Pattern]) -> np.ndarray:
    """Per layer, how much fewer distinct rows the products gather than random columns would:
    over blocks of 16 consecutive rows (the forward product, the weight gradient) and of 16
    consecutive columns (the transposed product), the expected share of distinct among the
    read rows for uniformly random columns with the same counts, minus the layer's own. 0 for
    a random layer; about 0.44 forward and backward for RadiX-Net 16384 (its neighbouring rows
    share columns), whose products run up to 2x faster than random ones of the same shape."""
    out = np.zeros((len(patterns), 2))
    for k, (indptr, indices, (n_out, n_in)) in enumerate(patterns):
        nnz = len(indices)
        if nnz == 0:
            continue
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
            out[k, side] = max(expected - distinct, 0.0) / nnz
    return out


def _blocks(n: int) -> sp.csr_matrix:
    """The (n / BLOCK) x n matrix that sums consecutive blocks of BLOCK lines."""
    return sp.csr_matrix((np.ones(n, np.float32), (np.arange(n) // BLOCK, np.arange(n))),
                         shape=(-(-n // BLOCK), n))


def workload(patterns: list[Pattern], plan: Plan, pattern_locality: np.ndarray | None = None
             ) -> Workload:
    """Per-rank work and messages of ``plan`` on a network given by its patterns
    (``pattern_locality``: their ``locality``, computed when not given)."""
    n = plan.parts
    if len(patterns) != len(plan.owners) - 1:
        raise SpdnnError(f"the plan has {len(plan.owners) - 1} layers, the network "
                         f"{len(patterns)}")
    layers = []
    for k, (indptr, indices, shape) in enumerate(patterns, start=1):
        own_out, own_in = plan.owners[k], plan.owners[k - 1]
        if shape != (len(own_out), len(own_in)):
            raise SpdnnError(f"layer {k}: the plan's sizes ({len(own_out)} x {len(own_in)}) "
                             f"are not the network's ({shape[0]} x {shape[1]})")
        row_rank = np.repeat(own_out.astype(np.int64), np.diff(indptr))
        local = own_in[indices] == row_rank
        j, p = cut_pairs(indptr, indices, own_out, own_in, n)
        src = own_in[j].astype(np.int64)
        key, count = np.unique(src * n + p, return_counts=True)
        layers.append(LayerWork(
            rows=np.bincount(own_out, minlength=n), prev_rows=np.bincount(own_in, minlength=n),
            nnz_owned=np.bincount(row_rank[local], minlength=n),
            nnz_ghost=np.bincount(row_rank[~local], minlength=n),
            ghosts=np.bincount(p, minlength=n), sent=np.bincount(src, minlength=n),
            src=key // n, dst=key % n, count=count))
    return Workload(parts=n, sizes=plan.sizes, method=str(plan.meta.get("method", "plan")),
                    layers=tuple(layers),
                    locality=locality(patterns) if pattern_locality is None else pattern_locality)
