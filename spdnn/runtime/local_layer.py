"""One rank's rows of one layer, renumbered for the local products, with its exchange schedule.

Rank p owns rows R_p^k of layer k (the plan). Its local W_k holds those rows with columns
renumbered into its X_{k-1} buffer: owned rows of layer k-1 first (ascending global index), then
ghost rows grouped by owner, so each peer's rows arrive into one contiguous block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.comm.mpi import Communicator
from spdnn.kernels import bfloat16, rounding
from spdnn.kernels import products as kernels
from spdnn.model.network import Layer
from spdnn.model.plan import Plan
from spdnn.runtime.halo import Exchange

# Entries per block of the renumbering and of ``_split`` (bounds their int64 temporaries to 8 MB).
BLOCK = 1 << 20


@dataclass(kw_only=True)
class LocalLayer:
    index: int  # k
    rows: np.ndarray  # global ids of the owned rows of layer k, ascending
    buffer_rows: np.ndarray  # global id of each row of the X_{k-1} buffer (owned, then ghosts)
    weight: sp.csr_matrix  # owned rows x buffer rows, sorted indices
    bias: np.ndarray
    exchange: Exchange
    # Row i's entries [indptr[i], mid[i]) read owned rows of X_{k-1}, [mid[i], indptr[i+1])
    # ghost rows (sorted indices, owned buffer rows first): the two products of the forward
    # pass read W in place, no column block is copied.
    mid: np.ndarray
    _transposed: kernels.Transposed | None = None
    # Under bfloat16: W's values rounded to 16 bits, what the products read; ``weight.data``
    # stays the float32 master copy the optimizer updates (``round_values`` after each step).
    _rounded: sp.csr_matrix | None = None

    @property
    def n_owned_prev(self) -> int:
        return self.exchange.n_owned

    @property
    def n_buffer_rows(self) -> int:
        """Rows of the X_{k-1} buffer: owned, then ghosts."""
        return self.exchange.n_owned + self.exchange.n_ghost

    @property
    def owned_span(self) -> kernels.Span:
        return self.weight.indptr[:-1], self.mid

    @property
    def ghost_span(self) -> kernels.Span:
        return self.mid, self.weight.indptr[1:]

    @property
    def product_weight(self) -> sp.csr_matrix:
        """W as the products read it: ``weight`` itself, or its bfloat16 copy (same pattern
        arrays)."""
        return self.weight if self._rounded is None else self._rounded

    @property
    def values(self) -> np.ndarray:
        """W's values as the products read them (``data[order[e]]`` of the transpose)."""
        return self.product_weight.data

    def store_bfloat16(self) -> None:
        """Keep a bfloat16 copy of W's values for the products (made once, then rounded from
        the master weights by ``round_values``)."""
        w = self.weight
        self._rounded = sp.csr_matrix((bfloat16.narrow(w.data), w.indices, w.indptr),
                                      shape=w.shape, copy=False)
        self._rounded.has_sorted_indices = True

    def round_values(self) -> None:
        """The bfloat16 copy from the master weights (after an update)."""
        if self._rounded is not None:
            rounding.round_weights(self.weight.data, self._rounded.data)

    @property
    def transposed(self) -> kernels.Transposed:
        """W^T's pattern and map into ``weight.data`` (rows = buffer rows: owned first, then
        ghosts), for the backward products as gathers, built on first use: inference never
        needs it."""
        if self._transposed is None:
            self._transposed = kernels.transpose(self.weight)
        return self._transposed

    @property
    def has_transpose(self) -> bool:
        return self._transposed is not None

    def nbytes(self) -> dict[str, int]:
        """Bytes this layer holds: the weights with their indices and maps (the transpose is
        training state: ``transposed.nbytes``)."""
        w = self.weight
        rounded = 0 if self._rounded is None else self._rounded.data.nbytes
        held = rounded + w.data.nbytes + w.indices.nbytes + w.indptr.nbytes + self.bias.nbytes + \
            self.mid.nbytes + self.rows.nbytes + self.buffer_rows.nbytes
        return {"weights": int(held + self.exchange.index_nbytes()["weights"])}

    def global_columns(self) -> np.ndarray:
        """Global column index of every stored entry."""
        return self.buffer_rows[self.weight.indices]

    @staticmethod
    def build(comm: Communicator, plan: Plan, k: int, mine: Layer) -> LocalLayer:
        """From this rank's rows ``mine`` of layer k (global columns, renumbered in place:
        ``mine`` is consumed); collective (the schedule is agreed by request lists)."""
        rank = comm.rank
        rows = plan.rows_of(rank, k)
        owner_prev = plan.owners[k - 1]
        owned_prev = plan.rows_of(rank, k - 1)
        w = mine.weight
        used_mask = np.zeros(len(owner_prev), dtype=bool)  # no sort of nnz indices
        used_mask[w.indices] = True
        used = np.flatnonzero(used_mask)
        del used_mask
        ghosts = used[owner_prev[used] != rank]
        ghosts = ghosts[np.lexsort((ghosts, owner_prev[ghosts]))]
        buffer_rows = np.concatenate([owned_prev, ghosts]).astype(np.int64)
        index_dtype = w.indices.dtype if len(buffer_rows) >= 2**31 else np.int32
        local = np.full(len(owner_prev), -1, dtype=index_dtype)
        local[buffer_rows] = np.arange(len(buffer_rows), dtype=index_dtype)
        indices = w.indices if w.indices.dtype == index_dtype else \
            w.indices.astype(index_dtype)
        # Global -> buffer numbering, in place, in blocks: numpy turns an index array into
        # intp (8 bytes an entry) before it takes, and "raise" buffers the whole output.
        for lo in range(0, len(indices), BLOCK):
            part = indices[lo:lo + BLOCK]
            np.take(local, part, out=part, mode="clip")  # in range: checked on reading
        del local
        w = sp.csr_matrix((w.data, indices, w.indptr), shape=(len(rows), len(buffer_rows)),
                          copy=False)
        w.sort_indices()
        exchange = Exchange.build(comm, k, owned_prev, owner_prev, ghosts)
        return LocalLayer(index=k, rows=rows, buffer_rows=buffer_rows, weight=w,
                          bias=mine.bias.copy(), exchange=exchange,
                          mid=_split(w, len(owned_prev)))


def _split(w: sp.csr_matrix, n_owned: int) -> np.ndarray:
    """Per row, the position of its first entry in a column >= n_owned (sorted indices),
    counted over blocks of rows of at most BLOCK entries (a longer row alone): the
    temporaries are bounded by the block, not by the layer."""
    indptr = w.indptr
    mid = indptr[:-1].copy()
    r0, n = 0, len(indptr) - 1
    while r0 < n:
        r1 = min(n, max(r0 + 1, int(np.searchsorted(indptr, indptr[r0] + BLOCK,
                                                        side="right")) - 1))
        lo, hi = int(indptr[r0]), int(indptr[r1])
        low = np.zeros(hi - lo + 1, dtype=np.int64)  # a zero after the last entry
        low[:-1] = w.indices[lo:hi] < n_owned
        starts = indptr[r0:r1] - lo
        below = np.add.reduceat(low, starts)  # an empty row sums one element: zeroed
        below[starts == indptr[r0 + 1:r1 + 1] - lo] = 0
        mid[r0:r1] += below.astype(mid.dtype)
        r0 = r1
    return mid
