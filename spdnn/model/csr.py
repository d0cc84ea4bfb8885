"""What the arrays of a sparse layer must be, checked as they enter, before anything is sized by
them: the value type (float32 or float64), finite values in its range, row pointers, and a
sorted, duplicate-free pattern in range."""

from __future__ import annotations

from typing import Any

import numpy as np

from spdnn.errors import InputError
from spdnn.model.choices import DTYPE_NAMES

DTYPES = dict(zip(DTYPE_NAMES, (np.float32, np.float64)))


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise a dtype name or object to float32/float64, refusing anything else. A
    bfloat16 run holds what it reads (data, master weights) in float32 and rounds it where
    it is gathered (spdnn.kernels.bfloat16)."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        dtype = "float32"
    dt = np.dtype(DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, not {dt}")
    return dt


def stored_itemsize(dtype: Any) -> int:
    """Bytes of a value the products gather and the forward exchange sends: 2 under bfloat16,
    else the type's own (sums, master weights and state keep ``as_dtype``'s)."""
    return 2 if isinstance(dtype, str) and dtype == "bfloat16" else as_dtype(dtype).itemsize


def cast_values(values: np.ndarray, dtype: Any, source: str, what: str) -> np.ndarray:
    """Values as ``dtype`` (float32 or float64), refused in one line naming ``source`` and
    ``what`` when they are not finite real numbers or pass the type's range (1e39 in float32
    is inf): the one cast of every array of values spdnn reads (layers, data, images)."""
    dt = as_dtype(dtype)
    if values.dtype.kind not in "biuf":
        raise InputError(source, f"{what} must hold real numbers, not {values.dtype}")
    if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        raise InputError(source, f"{what}: non-finite value (NaN or Inf)")
    with np.errstate(over="ignore"):
        cast = values.astype(dt, copy=False)
    if cast is not values and not np.all(np.isfinite(cast)):
        raise InputError(source, f"{what}: values beyond the {dt} range (use float64)")
    return cast


# Entries checked per block (bounds the int64 temporaries of a check to 8 MB).
CHECK_BLOCK = 1 << 20


def check_indptr(indptr: np.ndarray, n_rows: int, nnz: int, source: str, what: str
                 ) -> np.ndarray:
    """Row pointers of a CSR matrix: 1-D integers, n_rows + 1 of them, from 0 to nnz, never
    decreasing (checked before anything is sized or sliced by them). Returns them as int64:
    differences of unsigned or narrow integers wrap (a decreasing uint64 pointer has a huge
    positive difference), so they are compared only after the cast."""
    if indptr.ndim != 1 or not np.issubdtype(indptr.dtype, np.integer):
        raise InputError(source, f"{what}: indptr must be a 1-D integer array")
    if len(indptr) != n_rows + 1:
        raise InputError(source, f"{what}: indptr has length {len(indptr)}, expected {n_rows + 1}")
    if indptr.dtype.kind == "u" and len(indptr) and int(indptr.max()) >= 2**63:
        raise InputError(source, f"{what}: indptr holds values beyond 2**63")
    indptr = indptr.astype(np.int64, copy=False)
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise InputError(source, f"{what}: indptr, indices and data lengths do not agree")
    if np.any(np.diff(indptr) < 0):
        raise InputError(source, f"{what}: indptr is not non-decreasing")
    return indptr


def check_pattern(
    indptr: np.ndarray,
    indices: np.ndarray,
    shape: tuple[int, int],
    source: str,
    what: str,
    min_rows: int = 1,
) -> np.ndarray:
    """Validate a CSR sparsity pattern: chained pointers, sorted unique in-range indices.
    ``min_rows=0`` accepts the empty slice a rank may own of a layer. Returns the pointers as
    int64 (``check_indptr``)."""
    n_rows, n_cols = shape
    if n_rows < min_rows or n_cols < 1:
        raise InputError(source, f"{what}: shape {shape} must be positive")
    if indices.ndim != 1:
        raise InputError(source, f"{what}: indices must be a 1-D array, not {indices.shape}")
    if not np.issubdtype(indices.dtype, np.integer):
        raise InputError(source, f"{what}: indptr and indices must be integer arrays")
    nnz = len(indices)
    indptr = check_indptr(indptr, n_rows, nnz, source, what)
    if nnz:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n_cols:
            bad = lo if lo < 0 else hi
            raise InputError(source, f"{what}: column index {bad} out of range [0, {n_cols})")
        # Within a row, indices must strictly increase (sorted, no duplicate entries). In
        # blocks of entries: the int64 steps of a whole layer would be 8 bytes an entry.
        starts = indptr[:-1][np.diff(indptr) > 0]
        for lo in range(0, nnz - 1, CHECK_BLOCK):
            hi = min(nnz, lo + CHECK_BLOCK + 1)
            step = np.diff(indices[lo:hi].astype(np.int64))  # entry e + 1 against e
            row_start = np.zeros(hi - lo, dtype=bool)  # entries lo..hi-1
            row_start[starts[np.searchsorted(starts, lo):np.searchsorted(starts, hi)] - lo] = True
            bad = (step <= 0) & ~row_start[1:]
            if np.any(bad):
                pos = lo + int(np.argmax(bad)) + 1
                row = int(np.searchsorted(indptr, pos, side="right")) - 1
                kind = "duplicate" if step[pos - lo - 1] == 0 else "unsorted"
                raise InputError(source, f"{what}: {kind} column index in row {row}")
    return indptr


def check_csr(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    shape: tuple[int, int],
    source: str,
    what: str,
    min_rows: int = 1,
) -> None:
    """Validate raw CSR arrays: a valid pattern (``check_pattern``) and finite values."""
    if data.ndim != 1 or len(data) != len(indices):
        raise InputError(source, f"{what}: indptr, indices and data lengths do not agree")
    check_pattern(indptr, indices, shape, source, what, min_rows)
    if not np.issubdtype(data.dtype, np.floating):
        raise InputError(source, f"{what}: values must be floating point, not {data.dtype}")
    if not np.all(np.isfinite(data)):
        raise InputError(source, f"{what}: non-finite value (NaN or Inf)")
