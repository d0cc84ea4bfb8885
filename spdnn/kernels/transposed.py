"""A layer's transpose for the backward products: W^T's pattern and its map into W's values
(no values of its own: the products read W's in place)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True, kw_only=True)
class Transposed:
    """The pattern of W^T (CSR, sorted indices) and the position in W.data of each of its
    entries: its values are ``W.data[order]``, read in place by the backward products, so a
    layer holds its transpose as indices and order only (8 bytes an entry with int32)."""

    indptr: np.ndarray
    indices: np.ndarray
    order: np.ndarray
    shape: tuple[int, int]  # W's shape reversed
    dense: bool  # W stores every entry, row-major (a dense head: BLAS)

    def matrix(self, data: np.ndarray) -> sp.csr_matrix:
        """W^T with W's values ``data`` (a new matrix: tests and the scipy backend)."""
        m = sp.csr_matrix((data[self.order], self.indices, self.indptr), shape=self.shape)
        m.has_sorted_indices = True
        return m

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.indices.nbytes + self.order.nbytes


def transpose(w: sp.csr_matrix) -> Transposed:
    """W^T's pattern and its map into ``w.data``. A stable sort by column of W's entries
    (stored row by row) orders them by column, then row: one int64 sort key of temporary
    memory, no lexsort."""
    index_dtype = np.int32 if max(w.shape) < 2**31 and w.nnz < 2**31 else np.int64
    by_column = np.argsort(w.indices, kind="stable")
    rows = (np.searchsorted(w.indptr, by_column, side="right") - 1).astype(index_dtype)
    order = by_column.astype(index_dtype)
    del by_column
    counts = np.bincount(w.indices, minlength=w.shape[1])
    indptr = np.zeros(w.shape[1] + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Transposed(indptr=indptr.astype(index_dtype), indices=rows, order=order,
                      shape=(w.shape[1], w.shape[0]), dense=w.nnz == w.shape[0] * w.shape[1] > 0 and
                      bool(w.has_sorted_indices))
