"""Matrix Market coordinate files through scipy's C++ reader (fast_matrix_market), where a
check of the bytes shows it will read what the file says: it reads ``0x10`` as 0 and ``2x`` as 2
and skips a fourth field, so the check admits only the characters of numbers and white space
after the size line, and exactly ``entries x fields`` numbers (which also bounds what it
allocates by the file's own claim). spdnn.io.formats.read_mtx takes anything else to its line
parser, which names the line at fault."""

from __future__ import annotations

import io
import re

import numpy as np

MM_HEADER = re.compile(r"%%MatrixMarket\s+matrix\s+(\w+)\s+(\w+)\s+(\w+)", re.IGNORECASE)

# The bytes a coordinate file's entries may hold: numbers, signs, exponents, white space.
_NUMBER_BYTES = b"0123456789+-.eE \t\r\n"


def read_coordinates(raw: bytes, max_dimension: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]] | None:
    """A coordinate file's 0-based rows, columns (int64), values (float64) and shape, read by
    scipy's reader after the checks above; None where the line parser must decide."""
    head_end, lines = 0, []
    while len(lines) < 64 and head_end < len(raw):  # the header, comments and the size line
        nl = raw.find(b"\n", head_end)
        nl = len(raw) if nl < 0 else nl + 1
        line = raw[head_end:nl].decode("ascii", "replace").strip()
        head_end = nl
        lines.append(line)
        if line and not line.startswith("%"):
            break
    if not lines or not MM_HEADER.match(lines[0]) or not lines[-1] or \
            lines[-1].startswith("%"):
        return None
    layout, field, symmetry = (g.lower() for g in MM_HEADER.match(lines[0]).groups())
    size = lines[-1].split()
    if layout != "coordinate" or field not in ("real", "integer", "pattern", "double") or \
            symmetry != "general" or len(size) != 3 or not all(x.isdigit() for x in size):
        return None
    n_rows, n_cols, nnz = (int(x) for x in size)
    width = 2 if field == "pattern" else 3
    body = raw[head_end:]
    if max(n_rows, n_cols) > max_dimension or body.translate(None, _NUMBER_BYTES):
        return None
    chars = np.frombuffer(body, dtype=np.uint8)
    space = (chars == 32) | (chars == 9) | (chars == 10) | (chars == 13)
    numbers = int(np.count_nonzero(~space[1:] & space[:-1])) + int(len(chars) > 0
                                                                   and not space[0])
    if numbers != nnz * width:  # also bounds what the reader allocates by the file's claim
        return None
    from scipy.io import _fast_matrix_market as fmm

    threads, fmm.PARALLELISM = fmm.PARALLELISM, 1  # one thread per rank
    try:
        coo = fmm.mmread(io.BytesIO(raw), spmatrix=True)
    except Exception:  # noqa: BLE001 (any refusal: the line parser says what is wrong)
        return None
    finally:
        fmm.PARALLELISM = threads
    if coo.shape != (n_rows, n_cols) or coo.nnz != nnz or not np.all(np.isfinite(coo.data)):
        return None
    vals = np.ones(nnz) if field == "pattern" else np.asarray(coo.data, dtype=np.float64)
    return coo.row.astype(np.int64), coo.col.astype(np.int64), vals, (n_rows, n_cols)
