"""Training samples held by shares. With R data-parallel replicas, each replica keeps one
contiguous share of the training samples (of its model part's feature columns; spdnn.io.
datasets reads only those) instead of all of them. The batches stay the serial ones: before a
segment of consecutive batches, one all-to-all among the replicas of a model part brings each
replica the samples that its slices of those batches need, from the replicas that hold them.
Every step then reads the same rows in the same order as with every sample at hand, so the
arithmetic is unchanged; a replica holds its share and one segment."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp

from spdnn.model import batching
from spdnn.model.batching import batches, sample_block, share_of
from spdnn.runtime.grid import Grid
from spdnn.runtime.memory_report import data_nbytes

Matrix = np.ndarray | sp.csr_matrix


class SampleFeed:
    """Each step's block of samples (features x its slice of the batch) for a replica that
    holds ``rows`` of the ``n`` training samples in ``x`` (its feature columns); ``rows``
    None: it holds every sample and nothing is fetched."""

    def __init__(self, x: Matrix, rows: slice | None, n: int, grid: Grid, *,
                 n_features: int) -> None:
        self.x, self.rows, self.n, self.grid = x, rows, n, grid
        self.n_features = n_features
        self.fetched_bytes = 0  # the largest segment, for the memory report

    def steps(self, order: np.ndarray, batch_size: int, first: int
              ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(batch number, the serial batch, this replica's slice of it, its block) for the
        batches of ``order`` from number ``first`` on. Collective over the replicas of a model
        part when samples are held by shares (every one takes the same segments)."""
        grid = self.grid
        todo = [(b, idx) for b, idx in enumerate(batches(order, batch_size)) if b >= first]
        if self.rows is None:
            for b, idx in todo:
                mine = idx[grid.share(len(idx))]
                yield b, idx, mine, sample_block(self.x, mine)
            return
        # the same count on every rank: it depends on the data set, not on the rank's part
        per = max(1, batching.SEGMENT_BYTES //
                  max(1, batch_size * self.n_features * self.x.dtype.itemsize))
        for s in range(0, len(todo), per):
            segment = todo[s:s + per]
            fetched = self._fetch([idx for _, idx in segment])
            self.fetched_bytes = max(self.fetched_bytes, data_nbytes([fetched]))
            at = 0
            for b, idx in segment:
                mine = idx[grid.share(len(idx))]
                yield b, idx, mine, sample_block(fetched, slice(at, at + len(mine)))
                at += len(mine)

    def _fetch(self, serial: list[np.ndarray]) -> Matrix:
        """The rows of this replica's slices of the ``serial`` batches, in order, brought
        from the replicas that hold them (one all-to-all among the replicas)."""
        grid, replicas = self.grid, self.grid.replicas
        starts = np.array([share_of(self.n, h, replicas).start for h in range(replicas)])

        def needs(q: int) -> np.ndarray:
            return np.concatenate([idx[share_of(len(idx), q, replicas)] for idx in serial])

        mine = self.rows
        outgoing = []
        for q in range(replicas):
            ids = needs(q)
            outgoing.append(ids[(ids >= mine.start) & (ids < mine.stop)] - mine.start)
        wanted = needs(grid.replica)
        holder = np.searchsorted(starts, wanted, side="right") - 1
        # rows arrive holder by holder, each holder's in the order of ``wanted``
        by_holder = np.argsort(holder, kind="stable")
        back = np.empty_like(by_holder)
        back[by_holder] = np.arange(len(by_holder))
        if sp.issparse(self.x):
            return _exchange_csr(grid, self.x, outgoing)[back]
        width = self.x.shape[1]
        parts = grid.data.alltoall_lists([self.x[ids].ravel() for ids in outgoing], self.x.dtype)
        # (a part may read no input feature: width 0)
        return np.concatenate(parts).reshape(len(wanted), width)[back]


def _exchange_csr(grid: Grid, x: sp.csr_matrix, outgoing: list[np.ndarray]) -> sp.csr_matrix:
    """Rows ``outgoing[q]`` of ``x`` sent to replica q; the rows received, holder by holder."""
    picked = [x[ids] for ids in outgoing]
    counts = grid.data.alltoall_lists([np.diff(p.indptr) for p in picked])
    indices = grid.data.alltoall_lists([p.indices for p in picked])
    values = grid.data.alltoall_lists([p.data for p in picked], x.dtype)
    lengths = np.concatenate(counts)
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return sp.csr_matrix((np.concatenate(values), np.concatenate(indices), indptr),
                         shape=(len(lengths), x.shape[1]))
