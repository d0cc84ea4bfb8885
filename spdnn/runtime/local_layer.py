"""One rank's rows of one layer, renumbered for the local products, with its exchange schedule.

Rank p owns rows R_p^k of layer k (the plan). Its local W_k holds those rows with columns
renumbered into its X_{k-1} buffer: owned rows of layer k-1 first (ascending global index), then
ghost rows grouped by owner, so each peer's rows arrive into one contiguous block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.comm import Communicator
from spdnn.kernels import products as kernels
from spdnn.kernels.ranges import concat_ranges
from spdnn.kernels.update import take
from spdnn.model.network import Layer
from spdnn.model.plan import Plan
from spdnn.runtime.halo import Exchange


@dataclass(kw_only=True)
class LocalLayer:
    index: int  # k
    rows: np.ndarray  # global ids of the owned rows of layer k, ascending
    buffer_rows: np.ndarray  # global id of each row of the X_{k-1} buffer (owned, then ghosts)
    weight: sp.csr_matrix  # owned rows x buffer rows
    bias: np.ndarray
    exchange: Exchange
    _views: dict[str, tuple[sp.csr_matrix, np.ndarray | None]]  # derived matrices + gather maps
    _entry_rows: np.ndarray | None = None

    @property
    def n_owned_prev(self) -> int:
        return self.exchange.n_owned

    @property
    def n_buffer_rows(self) -> int:
        """Rows of the X_{k-1} buffer: owned, then ghosts."""
        return self.exchange.n_owned + self.exchange.n_ghost

    def view(self, name: str) -> sp.csr_matrix:
        """``owned_cols`` or ``ghost_cols``: the entries that read owned or ghost rows;
        ``transposed``: W^T (rows = buffer rows: owned first, then ghosts), for the backward
        products as gathers, built on first use: inference never needs it (it and the gather
        map would double the memory of the weights)."""
        if name == "transposed" and name not in self._views:
            self._views[name] = kernels.transpose(self.weight)
        return self._views[name][0]

    @property
    def transpose_order(self) -> np.ndarray:
        """Position in ``weight.data`` of each entry of ``view("transposed")``."""
        self.view("transposed")
        order = self._views["transposed"][1]
        assert order is not None
        return order

    @property
    def entry_rows(self) -> np.ndarray:
        """The row of every stored entry (for the SDDMM; built on first use, as the
        transpose)."""
        if self._entry_rows is None:
            self._entry_rows = kernels.row_of_entries(self.weight)
        return self._entry_rows

    def sync_views(self) -> None:
        """Refresh the derived matrices' values after the weights changed (no allocation)."""
        for m, gather in self._views.values():
            if gather is not None:  # None: the view shares the weight's values
                take(self.weight.data, gather, m.data)

    def global_columns(self) -> np.ndarray:
        """Global column index of every stored entry."""
        return self.buffer_rows[self.weight.indices]

    @staticmethod
    def build(comm: Communicator, plan: Plan, k: int, mine: Layer) -> LocalLayer:
        """From this rank's rows ``mine`` of layer k (global columns); collective (the
        schedule is agreed by request lists)."""
        rank = comm.rank
        rows = plan.rows_of(rank, k)
        owner_prev = plan.owners[k - 1]
        owned_prev = plan.rows_of(rank, k - 1)
        w_global = mine.weight
        used = np.unique(w_global.indices)
        ghosts = used[owner_prev[used] != rank]
        ghosts = ghosts[np.lexsort((ghosts, owner_prev[ghosts]))]
        buffer_rows = np.concatenate([owned_prev, ghosts]).astype(np.int64)
        local = np.full(len(owner_prev), -1, dtype=np.int64)
        local[buffer_rows] = np.arange(len(buffer_rows))
        w = sp.csr_matrix((w_global.data, local[w_global.indices].astype(np.int32),
                           w_global.indptr), shape=(len(rows), len(buffer_rows)))
        w.sort_indices()
        exchange = Exchange.build(comm, k, owned_prev, owner_prev, ghosts)
        n_own = len(owned_prev)
        views = {"owned_cols": _column_block(w, 0, n_own),
                 "ghost_cols": _column_block(w, n_own, len(buffer_rows))}
        return LocalLayer(index=k, rows=rows, buffer_rows=buffer_rows, weight=w,
                          bias=mine.bias.copy(), exchange=exchange, _views=views)


def _column_block(w: sp.csr_matrix, col_lo: int, col_hi: int
                  ) -> tuple[sp.csr_matrix, np.ndarray | None]:
    """Columns [col_lo, col_hi) of w (renumbered from 0), with the position in w.data of each
    kept entry; w itself (and None) when that is every column."""
    if col_lo == 0 and col_hi == w.shape[1]:
        return w, None
    rows = np.arange(w.shape[0])
    counts = np.diff(w.indptr)
    picked = concat_ranges(w.indptr[:-1], counts)
    cols = w.indices[picked]
    keep = (cols >= col_lo) & (cols < col_hi)
    row_of = np.repeat(rows, counts)[keep]
    gather = picked[keep]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row_of, minlength=len(rows)))])
    m = sp.csr_matrix((w.data[gather], cols[keep] - col_lo, indptr),
                      shape=(len(rows), col_hi - col_lo))
    return m, gather
