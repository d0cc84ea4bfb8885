"""Readers and writers for the field's file formats (docs/formats.md).

- Text triples (1-based ``row<TAB>col<TAB>value``), as Graph Challenge input images; category
  files with one 1-based index per line (network directories: ``spdnn.io.graphchallenge``).
- Matrix Market coordinate files (real, integer or pattern; general).

Every reader reports a malformed file as InputError naming the file and line. (One concern:
the field's text formats, each reader beside its writer; MNIST's binary IDX files are in
``spdnn.io.idx``.)
"""

from __future__ import annotations

import gzip
import io
import os
import warnings
import zlib
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io._mtx_fast import MM_HEADER, read_coordinates
from spdnn.io.atomic import write_text
from spdnn.io.paths import check_input_file

# --------------------------------------------------------------------------- text tables

# The largest row or column count a text or Matrix Market file may declare or imply: it bounds
# the row pointers built for a file (1 GiB at this size) whatever the file claims.
MAX_DIMENSION = 2**27


def read_bytes(path: str | os.PathLike) -> bytes:
    """A file's bytes, gunzipped when it starts with the gzip magic."""
    p = check_input_file(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(p, f"cannot read ({exc})") from None


def _read_text(path: str | os.PathLike) -> str:
    try:
        return read_bytes(path).decode("ascii")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not a text file ({exc})") from None


def _parse_rows(
    path: str, lines: Sequence[str], first_line: int, ncols: Sequence[int]
) -> np.ndarray:
    """Parse whitespace-separated numeric rows; ``first_line`` is the 1-based number of lines[0].

    Blank lines are skipped. Errors name the first line with a wrong field count or a
    non-numeric field.
    """
    # numpy's C parser first (several times faster on the Graph Challenge's layers); on any
    # complaint, the line-by-line pass below finds the line and says what is wrong with it.
    try:
        with warnings.catch_warnings():  # "input contained no data": the pass below decides
            warnings.simplefilter("ignore")
            table = np.loadtxt(io.StringIO("\n".join(lines)), dtype=np.float64,
                               comments=None, ndmin=2)
    except ValueError:
        table = None
    if table is not None and table.size and table.shape[1] in ncols:
        return table
    return _parse_lines(path, lines, first_line, ncols)


def _parse_lines(
    path: str, lines: Sequence[str], first_line: int, ncols: Sequence[int]
) -> np.ndarray:
    """``_parse_rows`` line by line in Python: slower, and it names the line at fault."""
    fields = [ln.split() for ln in lines]
    widths = [len(f) for f in fields if f]
    if not widths:
        return np.zeros((0, ncols[0]))
    width = widths[0]
    for offset, f in enumerate(fields):
        if f and (len(f) != width or len(f) not in ncols):
            want = " or ".join(str(c) for c in ncols)
            raise InputError(path, f"expected {want} fields, found {len(f)}", first_line + offset)
    try:
        return np.array([x for f in fields for x in f], dtype=np.float64).reshape(-1, width)
    except ValueError:
        for offset, f in enumerate(fields):
            for x in f:
                try:
                    float(x)
                except ValueError:
                    raise InputError(path, f"non-numeric field '{x}'",
                                     first_line + offset) from None
        raise


def _locate(path: str, lines: Sequence[str], first_line: int, entry: int) -> int:
    """1-based line number of the ``entry``-th non-blank line."""
    seen = -1
    for offset, ln in enumerate(lines):
        if ln.strip():
            seen += 1
            if seen == entry:
                return first_line + offset
    return first_line + len(lines)


def _check_indices(
    path: str, lines: Sequence[str], first_line: int, values: np.ndarray, upper: int | None,
    what: str,
) -> np.ndarray:
    """Check 1-based integer indices in [1, upper]; return them 0-based as int64."""
    bad_int = values != np.floor(values)
    if np.any(bad_int):
        e = int(np.argmax(bad_int))
        raise InputError(path, f"{what} {values[e]:g} is not an integer",
                         _locate(path, lines, first_line, e))
    low = values < 1
    if np.any(low):
        e = int(np.argmax(low))
        raise InputError(path, f"{what} {int(values[e])} is not a 1-based index (must be >= 1)",
                         _locate(path, lines, first_line, e))
    upper = MAX_DIMENSION if upper is None else upper
    high = values > upper
    if np.any(high):
        e = int(np.argmax(high))
        raise InputError(path, f"{what} {int(values[e])} out of range [1, {upper}]",
                         _locate(path, lines, first_line, e))
    return values.astype(np.int64) - 1


# --------------------------------------------------------------------------- triples / TSV


def read_triples(
    path: str | os.PathLike, shape: tuple[int | None, int | None] = (None, None)
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """Read 1-based ``row col value`` lines; return 0-based rows, cols, values and the shape.

    A dimension given as None is taken from the largest index present.
    """
    p = os.fspath(path)
    lines = _read_text(p).splitlines()
    table = _parse_rows(p, lines, 1, (3,))
    rows = _check_indices(p, lines, 1, table[:, 0], shape[0], "row index")
    cols = _check_indices(p, lines, 1, table[:, 1], shape[1], "column index")
    vals = table[:, 2]
    if not np.all(np.isfinite(vals)):
        e = int(np.argmax(~np.isfinite(vals)))
        raise InputError(p, "non-finite value", _locate(p, lines, 1, e))
    n_rows = shape[0] if shape[0] is not None else int(rows.max(initial=-1)) + 1
    n_cols = shape[1] if shape[1] is not None else int(cols.max(initial=-1)) + 1
    return rows, cols, vals, (n_rows, n_cols)


def write_triples(path: str | os.PathLike, matrix: sp.spmatrix) -> None:
    coo = sp.coo_matrix(matrix)
    order = np.lexsort((coo.col, coo.row))
    lines = [f"{r + 1}\t{c + 1}\t{v:.17g}" for r, c, v in
             zip(coo.row[order], coo.col[order], coo.data[order])]
    write_text(path, "\n".join(lines) + ("\n" if lines else ""))


def coo_to_csr(path: str, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                shape: tuple[int, int]) -> sp.csr_matrix:
    key = np.sort(rows * shape[1] + cols)  # sorted neighbours: far faster than np.unique here
    if np.any(key[1:] == key[:-1]):
        raise InputError(path, "duplicate entry for the same (row, column)")
    m = sp.csr_matrix((vals, (rows, cols)), shape=shape)
    m.sort_indices()
    return m


# --------------------------------------------------------------------------- Matrix Market

_MM_HEADER = MM_HEADER


def read_mtx(path: str | os.PathLike) -> sp.csr_matrix:
    """Read a Matrix Market coordinate file (real/integer/pattern, general) as float64 CSR.

    scipy's C++ reader (fast_matrix_market, one thread) reads what passes a check of the bytes
    first: only characters of numbers and white space after the size line, and exactly
    ``entries x fields`` numbers (it would read ``0x10`` as 0, ``2x`` as 2 and skip a fourth
    field). Anything else, or anything it refuses, goes through the line parser below, which
    names the line at fault (an order of magnitude slower on a file of millions of entries)."""
    p = os.fspath(path)
    raw = read_bytes(p)
    fast = read_coordinates(raw, MAX_DIMENSION)
    if fast is not None:
        return coo_to_csr(p, *fast)
    try:
        lines = raw.decode("ascii").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(p, f"not a text file ({exc})") from None
    return _read_mtx_lines(p, lines)


def _read_mtx_lines(p: str, lines: list[str]) -> sp.csr_matrix:
    """The Matrix Market reader in Python: slower, and every error names its line."""
    if not lines:
        raise InputError(p, "empty file, expected a %%MatrixMarket header", 1)
    m = _MM_HEADER.match(lines[0])
    if not m:
        raise InputError(p, "missing '%%MatrixMarket matrix ...' header", 1)
    layout, field, symmetry = (g.lower() for g in m.groups())
    if layout != "coordinate" or field not in ("real", "integer", "pattern", "double"):
        raise InputError(p, f"unsupported Matrix Market type '{layout} {field}'", 1)
    if symmetry != "general":
        raise InputError(p, f"unsupported Matrix Market symmetry '{symmetry}'", 1)
    i = 1
    while i < len(lines) and (lines[i].startswith("%") or not lines[i].strip()):
        i += 1
    if i == len(lines):
        raise InputError(p, "truncated: no size line", i)
    size = lines[i].split()
    if len(size) != 3 or not all(s.isdigit() for s in size):
        raise InputError(p, "size line must be 'rows cols entries'", i + 1)
    n_rows, n_cols, nnz = (int(s) for s in size)
    for what, n in (("rows", n_rows), ("columns", n_cols)):
        if n > MAX_DIMENSION:
            raise InputError(p, f"size line declares {n:,} {what}; spdnn reads at most "
                                f"{MAX_DIMENSION:,}", i + 1)
    data_lines = [ln for ln in lines[i + 1:] if not ln.startswith("%")]
    width = 2 if field == "pattern" else 3
    table = _parse_rows(p, data_lines, i + 2, (width,))
    if len(table) != nnz:
        problem = "truncated" if len(table) < nnz else "too many entries"
        raise InputError(p, f"{problem}: size line says {nnz} entries, found {len(table)}")
    rows = _check_indices(p, data_lines, i + 2, table[:, 0], n_rows, "row index")
    cols = _check_indices(p, data_lines, i + 2, table[:, 1], n_cols, "column index")
    vals = np.ones(nnz) if field == "pattern" else table[:, 2]
    if not np.all(np.isfinite(vals)):
        e = int(np.argmax(~np.isfinite(vals)))
        raise InputError(p, "non-finite value", _locate(p, data_lines, i + 2, e))
    return coo_to_csr(p, rows, cols, vals, (n_rows, n_cols))


def write_mtx(path: str | os.PathLike, matrix: sp.spmatrix, comment: str = "") -> None:
    coo = sp.coo_matrix(matrix)
    order = np.lexsort((coo.col, coo.row))
    head = ["%%MatrixMarket matrix coordinate real general"]
    head += [f"% {c}" for c in comment.splitlines()]
    head.append(f"{coo.shape[0]} {coo.shape[1]} {coo.nnz}")
    body = [f"{r + 1} {c + 1} {v:.17g}" for r, c, v in
            zip(coo.row[order], coo.col[order], coo.data[order])]
    write_text(path, "\n".join(head + body) + "\n")


# --------------------------------------------------------------------------- inputs, categories


def read_sparse_matrix(path: str | os.PathLike,
                       n_cols: int | None = None) -> sp.csr_matrix:
    """Read TSV triples (``.tsv``/``.txt``) or Matrix Market (``.mtx``) as CSR."""
    p = os.fspath(path)
    if p.endswith((".mtx", ".mtx.gz")):
        m = read_mtx(p)
        if n_cols is not None and m.shape[1] != n_cols:
            raise InputError(p, f"has {m.shape[1]} columns, expected {n_cols}")
        return m
    rows, cols, vals, shape = read_triples(p, (None, n_cols))
    return coo_to_csr(p, rows, cols, vals, shape)


def read_inputs(path: str | os.PathLike, n_features: int) -> sp.csr_matrix:
    """Graph Challenge input images: samples x features (TSV triples or Matrix Market)."""
    images = read_sparse_matrix(path, n_features)
    if images.shape[0] == 0:
        raise InputError(path, "no inputs (the file holds no samples)")
    return images


def read_categories(path: str | os.PathLike) -> np.ndarray:
    """1-based category indices: one per line (TSV) or an n x 1 Matrix Market pattern."""
    p = os.fspath(path)
    if p.endswith((".mtx", ".mtx.gz")):
        m = read_mtx(p)
        if m.shape[1] != 1:
            raise InputError(p, f"a category file has one column, this one has {m.shape[1]}")
        return np.sort(m.tocoo().row.astype(np.int64) + 1)
    lines = _read_text(p).splitlines()
    table = _parse_rows(p, lines, 1, (1,))
    cats = _check_indices(p, lines, 1, table[:, 0], None, "category") + 1
    return np.sort(cats)


def write_categories(path: str | os.PathLike, categories: np.ndarray) -> None:
    write_text(path, "".join(f"{int(c)}\n" for c in categories))


# --------------------------------------------------------------------------- Graph Challenge
