"""The hash functions of ``--lsh`` and the tables built from them (SLIDE: Chen et al., MLSys
2020). No MPI.

A neuron is hashed by its weight row, a sample by the layer's input vector, both in the
global input coordinates, so a neuron lands in the same buckets on every grid. The functions
come from (seed, layer) alone:

- ``dwta`` (densified winner-take-all, SLIDE's choice for Amazon-670K): K x L bins of
  ``BIN`` coordinates cut from seeded permutations of the inputs; a function's code is the
  position of the bin's largest nonzero value, an empty bin borrows another function's code;
  a table's bucket packs its K codes (BIN^K buckets).
- ``simhash`` (signed random projections): each function sums the coordinates with seeded
  signs, each coordinate taking part with probability 1/3; a table's bucket is its K sign bits
  (2^K buckets).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spdnn.kernels.lsh import LshSpec

BIN = 8  # coordinates per DWTA bin (SLIDE's)
SIMHASH_DENSITY = 1 / 3
DIRECTORY_SPAN = 4  # Tables.starts: about 2**4 keys per prefix
REFRESH_SHARE = 100  # Tables.refresh: moves in place up to 1 code in 100, else rebuilds
REFRESH_ROWS = 8192  # rows hashed at a time for a refresh (their codes: 3.3 MB for L = 50)


# LSH's passes by concept: the numba half, and its numpy twin (the scipy backend's)
PASSES = {"hashing": ("spdnn.kernels._numba_hashing", "spdnn.kernels._numpy_hashing"),
          "tables": ("spdnn.kernels._numba_tables", "spdnn.kernels._numpy_tables"),
          "lsh": ("spdnn.kernels._numba_lsh", "spdnn.kernels._numpy_lsh")}


def passes_of(concept: str) -> Any:  # noqa: ANN401
    """The module of ``concept``'s passes (a key of PASSES) that the active backend runs."""
    from spdnn.backends import active

    return active().passes(*PASSES[concept])


def dwta_block(n_in: int, rows: int) -> int:
    """Rows that DWTA hashes side by side, a multiple of 8: as many as keep its two buffers
    of n_in values a row within 64K values (L2), from 8 to 128, and no more than the rows
    rounded up to 8 (a batch of samples)."""
    fit = max(8, min(128, (1 << 15) // max(n_in, 1)) // 8 * 8)
    return min(fit, -(-max(rows, 1) // 8) * 8)


@dataclass(frozen=True)
class HashFunctions:
    """The K x L functions of one layer over ``n_in`` input coordinates."""

    spec: LshSpec
    n_in: int
    base: int  # DWTA: the code range (BIN, or n_in when smaller)
    members: np.ndarray  # DWTA: (K L x base) the coordinates of each function's bin
    col_ptr: np.ndarray  # SimHash: coordinate c feeds col_fn[col_ptr[c]:col_ptr[c + 1]]
    col_fn: np.ndarray
    col_sign: np.ndarray

    @staticmethod
    def make(spec: LshSpec, n_in: int, seed: int) -> HashFunctions:
        rng = np.random.default_rng([seed, 0x51DE, spec.layer])
        n_fn = spec.k * spec.tables
        if spec.kind == "dwta":
            base = min(BIN, n_in)
            per = n_in // base  # bins per permutation
            bins = [rng.permutation(n_in)[: per * base].reshape(per, base)
                    for _ in range(math.ceil(n_fn / per))]
            members = np.ascontiguousarray(np.concatenate(bins)[:n_fn], dtype=np.int32)
            return HashFunctions(spec, n_in, base, members, np.zeros(1, np.int64),
                                 np.zeros(0, np.int32), np.zeros(0, np.int8))
        member = rng.random((n_in, n_fn)) < SIMHASH_DENSITY
        signs = np.where(rng.random((n_in, n_fn)) < 0.5, -1, 1).astype(np.int8)
        col_ptr = np.zeros(n_in + 1, dtype=np.int64)
        np.cumsum(member.sum(axis=1), out=col_ptr[1:])
        col_fn = np.nonzero(member)[1].astype(np.int32)
        return HashFunctions(spec, n_in, 2, np.zeros((0, 1), np.int32), col_ptr, col_fn,
                             signs[member])

    def codes(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
              columns: np.ndarray | None = None, out: np.ndarray | None = None, *,
              rows: np.ndarray | None = None, dense: bool = False) -> np.ndarray:
        """Bucket of every CSR row (or of ``rows`` alone, ascending) in every table:
        (rows x L) int64, each table's column contiguous (Fortran order). Column j of the rows
        is input coordinate ``columns[j]`` (default: j). ``out``: an earlier result of this
        shape to write into (its pages already mapped: 80 MB at 200,000 rows and 50 tables).
        ``dense``: every row holds every column in order (a full layer), read in place."""
        nbh = passes_of("hashing")

        if columns is None:
            columns = np.arange(self.n_in, dtype=np.int64)
        if indices.dtype != np.int32 and self.n_in < 2**31:  # one compiled form
            indices = indices.astype(np.int32)
        sel = np.arange(len(indptr) - 1, dtype=np.int64) if rows is None \
            else rows.astype(np.int64, copy=False)
        shape = (self.spec.tables, len(sel))
        out = out.T if out is not None and out.T.shape == shape else np.empty(shape, np.int64)
        if self.spec.kind == "dwta":
            nbh.dwta_codes(indptr, indices, columns, data, sel, dense, self.members,
                           self.spec.k, self.spec.tables, self.n_in,
                           dwta_block(self.n_in, len(sel)), out)
        else:
            nbh.simhash_codes(indptr, indices, columns, data, sel, self.col_ptr, self.col_fn,
                              self.col_sign, self.spec.k, self.spec.tables, out)
        return out.T

    def codes_of_columns(self, x: np.ndarray) -> np.ndarray:
        """Buckets of the columns of a dense (n_in x batch) block: (batch x L)."""
        xt = np.ascontiguousarray(x.T)
        nz = xt != 0
        indptr = np.zeros(xt.shape[0] + 1, dtype=np.int64)
        np.cumsum(nz.sum(axis=1), out=indptr[1:])
        cols = np.nonzero(nz)[1]
        return self.codes(indptr, cols, xt[nz])


@dataclass(frozen=True)
class Tables:
    """L tables over a set of neurons: table t lists the neurons (local ids) ``rows[t]``
    ordered by their bucket ``keys[t]`` (ties by id); int32 where the values fit (a rebuild
    moves half the bytes). ``starts[t, p]``: where table t's keys of prefix p (key >> shift)
    begin, so that a lookup searches about 16 keys, not all of them: a large head's keys do
    not fit the cache, and binary searches over all of them missed it at most of their
    steps."""

    keys: np.ndarray  # (L x n)
    rows: np.ndarray  # (L x n)
    starts: np.ndarray  # (L x 2**bits + 1)
    shift: int

    @staticmethod
    def build(codes: np.ndarray, old: Tables | None = None) -> Tables:
        """The tables of rows with these codes (rows x L); ``old`` tables of the same shape,
        no longer needed, lend their arrays (a rebuild then holds one set, not two)."""
        nbh = passes_of("hashing")

        n, tables = codes.shape
        top = int(codes.max(initial=0))
        key_type = np.int32 if top < 2**31 else np.int64
        row_type = np.int32 if n < 2**31 else np.int64
        if old is not None and old.keys.shape == (tables, n) and old.keys.dtype == key_type:
            keys, rows = old.keys, old.rows
        else:
            keys = np.empty((tables, n), dtype=key_type)
            rows = np.empty((tables, n), dtype=row_type)
        ids = np.arange(n, dtype=np.int64)
        for t in range(tables):
            column = np.ascontiguousarray(codes[:, t])
            if top < 2**33:  # a radix sort in at most 3 passes (K = 6 DWTA: 2 of 9 bits)
                nbh.bucket_order(column, int(column.max(initial=0)).bit_length(), keys[t],
                                 rows[t])
            # bucket and id as one key where it fits (a faster sort than a stable argsort)
            elif top < 2**62 // max(n, 1):
                packed = np.sort(column * n + ids)
                keys[t], rows[t] = packed // n, packed % n
            else:
                order = np.argsort(column, kind="stable")
                keys[t], rows[t] = column[order], order
        return Tables.indexed(keys, rows, old)

    @staticmethod
    def indexed(keys: np.ndarray, rows: np.ndarray, old: Tables | None = None) -> Tables:
        """Tables of these sorted keys and rows, with their directory (``old``'s array when
        it has the shape)."""
        nbt = passes_of("tables")

        tables, n = keys.shape
        bits = max(1, (n - 1).bit_length() - DIRECTORY_SPAN)
        top = int(keys[:, -1].max(initial=0)) if n else 0
        shift = max(0, top.bit_length() - bits)
        shape = (tables, (1 << bits) + 1)
        starts = old.starts if old is not None and old.starts.shape == shape else \
            np.empty(shape, dtype=np.int32 if n < 2**31 else np.int64)
        nbt.directory(keys, shift, starts)
        return Tables(keys, rows, starts, shift)

    def refresh(self, codes: np.ndarray,
                updates: Iterable[tuple[np.ndarray, np.ndarray]]) -> Tables:
        """The tables once the rows of each update (rows ascending, their new codes: rows x L
        from HashFunctions.codes; the updates' rows ascending too) have taken their codes:
        ``codes`` (every row's, as these tables were built from) updated in place, and the
        rows whose code changed moved in their tables. The same arrays as ``build(codes)``,
        at a fraction of its cost when few codes change; past 1% of them, a build."""
        nbt = passes_of("tables")

        log = np.empty((4, self.keys.size // REFRESH_SHARE), dtype=np.int64)
        at, top = 0, 0
        for rows, fresh in updates:
            assert codes.T.flags.c_contiguous and fresh.T.flags.c_contiguous  # as codes() gives
            at = nbt.log_changes(codes.T, rows.astype(np.int64, copy=False), fresh.T, log, at)
            top = max(top, int(fresh.max(initial=0)))
        if at < 0 or (self.keys.dtype == np.int32 and top >= 2**31):
            return Tables.build(codes, self)
        nbt.move_rows(self.keys, self.rows, np.ascontiguousarray(log[:, :at]))  # the layout
        # the warm-up compiled (a slice of the log is not contiguous)
        return Tables.indexed(self.keys, self.rows, self)

    def retrieve(self, sample_codes: np.ndarray, n_rows: int, label_ptr: np.ndarray,
                 label_rows: np.ndarray, label_weights: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Active pairs of a batch: CSR (ptr, rows) over the samples, ascending rows, each
        pair's target mass (label_ptr empty: no labels added, as in inference) and how many
        tables retrieved it (a row that joined as a label or filler: one more than there are
        tables, plus those)."""
        nbl = passes_of("lsh")

        return nbl.retrieve(np.ascontiguousarray(sample_codes), self.keys, self.rows,
                            self.starts, self.shift, label_ptr, label_rows, label_weights,
                            n_rows)
