"""Lossless encodings of the blocks the exchanges send (README, "Sparse exchange"); no MPI here.

Expand (forward): a block of activation rows (rows x B) travels as one byte message, either
dense (header -1, then the values) or sparse (header nnz, then a bitmap of the nonzero entries
in row-major order, padded to 8 bytes, then the nonzero values). The receiver cannot know which
or how long, so it receives into a buffer of ``expand_capacity`` bytes (the larger of the two
forms) and reads the header: one message per peer and pass, no size message and no probe, at the
cost of a bitmap's worth of spare buffer.

Fold (backward): the rank holding a ghost row knows, from the activations it received, where the
owner's activation slope is zero (x = 0, or x at the cap): the owner would multiply those partial
sums by zero. Both ranks compute the same mask from the same activations, so only the values
under it travel, with no index and a size both sides know.
"""

from __future__ import annotations

import numpy as np

from .errors import SpdnnError
from .ops import activation_slope

# Where h'(z) is 1, read from x = h(z) instead of z: 0 < x < cap holds exactly where 0 < z < cap.
slope_mask = activation_slope

MODES = ("auto", "dense", "sparse")
HEADER = 8  # bytes: an int64, -1 for dense, else the number of nonzero values


def _bitmap_bytes(n: int) -> int:
    return ((n + 7) // 8 + 7) // 8 * 8  # ceil(n / 8), padded to 8 to align the values


def expand_capacity(rows: int, batch: int, itemsize: int) -> int:
    """Bytes that hold either form of a rows x batch block."""
    n = rows * batch
    return HEADER + _bitmap_bytes(n) + n * itemsize


def encode_expand(block: np.ndarray, mode: str, out: np.ndarray) -> int:
    """Write ``block`` (C-contiguous) into the byte buffer ``out`` in the form ``mode`` asks for
    (``auto``: the smaller); returns the bytes used."""
    n, itemsize = block.size, block.itemsize
    flat = block.reshape(-1)
    nnz = int(np.count_nonzero(flat)) if mode != "dense" else n  # no temporary: one pass
    sparse_bytes = HEADER + _bitmap_bytes(n) + nnz * itemsize
    if mode == "sparse" or (mode == "auto" and sparse_bytes < HEADER + n * itemsize):
        out[:HEADER].view(np.int64)[0] = nnz
        bits = _bitmap_bytes(n)
        nonzero = flat != 0
        packed = np.packbits(nonzero)
        out[HEADER:HEADER + len(packed)] = packed
        out[HEADER + len(packed):HEADER + bits] = 0
        values = out[HEADER + bits:HEADER + bits + nnz * itemsize].view(block.dtype)
        np.compress(nonzero, flat, out=values)
        return sparse_bytes
    out[:HEADER].view(np.int64)[0] = -1
    out[HEADER:HEADER + n * itemsize].view(block.dtype)[:] = flat
    return HEADER + n * itemsize


def decode_expand(buf: np.ndarray, block: np.ndarray, source: str) -> None:
    """Rebuild ``block`` exactly from a message written by ``encode_expand``."""
    n, itemsize = block.size, block.itemsize
    header = int(buf[:HEADER].view(np.int64)[0])
    flat = block.reshape(-1)
    if header == -1:
        flat[:] = buf[HEADER:HEADER + n * itemsize].view(block.dtype)
        return
    bits = _bitmap_bytes(n)
    if not 0 <= header <= n:
        raise SpdnnError(f"{source}: corrupt sparse message (header {header} for {n} values)")
    nonzero = np.unpackbits(buf[HEADER:HEADER + bits], count=n).view(bool)
    if int(np.count_nonzero(nonzero)) != header:
        raise SpdnnError(f"{source}: corrupt sparse message (bitmap disagrees with its count)")
    flat[:] = 0
    flat[nonzero] = buf[HEADER + bits:HEADER + bits + header * itemsize].view(block.dtype)


def fold_packed(mask: np.ndarray, mode: str) -> bool:
    """Whether a fold message under ``mask`` travels packed: ``sparse`` always, ``auto`` when it
    is smaller (some entry has slope zero). Both ends decide alike from the same mask."""
    return mode == "sparse" or (mode == "auto" and not bool(mask.all()))
