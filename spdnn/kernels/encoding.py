"""Lossless encodings of the blocks the exchanges send (docs/sparse-exchange.md); no MPI here.

Expand (forward): a block of activation rows (rows x B) travels as one byte message:
- dense: header (-1, 0), then the values;
- sparse: header (nv, n_cap), the nv values that are neither zero nor at the activation cap, a
  bitmap of the entries that carry those values (row-major), and, when the network has a cap, a
  bitmap of the entries exactly at the cap. Saturated neurons are common in capped networks
  (a third of the Graph Challenge activations are exactly 32) and both ends know the cap, so
  they cost one bit. Bits are little-endian within a byte (``np.packbits(bitorder="little")``).
Values are compared as bit patterns: -0.0 is a value, not a zero, and every block comes back
bit-exact. The receiver cannot know which form or how long, so it receives into a slot of
``expand_capacity`` bytes (the larger form) and reads the header: one message per peer and pass,
no size message and no probe (a probe costs a round of latency per message), at the cost of two
bitmaps' worth of spare buffer. ``auto`` sends the smaller form.

Fold (backward): the rank holding a ghost row knows, from the activations it received, where the
owner's activation slope is zero (x = 0, or x at the cap): the owner would multiply those partial
sums by zero. Both ranks compute the same mask from the same activations, so only the values
under it travel, with no index and a size both sides know.

The numba kernels (spdnn.kernels._numba_encoding) encode or decode all messages of an exchange in
one call; the numpy fallback writes the same bytes one message at a time. The kernels backend
(spdnn.kernels) picks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from spdnn.errors import SpdnnError
from spdnn.kernels import bfloat16
from spdnn.kernels import products as kernels
from spdnn.model.choices import EXCHANGES
from spdnn.model.ops import activation_slope

# Where h'(z) is 1, read from x = h(z) instead of z: 0 < x < cap holds exactly where 0 < z < cap.
slope_mask = activation_slope

MODES = EXCHANGES
HEADER = 16  # bytes: two int64, (-1, 0) for dense, else (values sent, entries at the cap)


def _nbe():  # noqa: ANN202
    return kernels.active().compiled("encoding")


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Load (or compile) the encoding kernels for ``dtypes`` now, outside any timed loop."""
    if (nbe := _nbe()) is not None:
        nbe.warm_up(dtypes)


def _bits(n: int) -> int:
    return (n + 7) // 8


def _capped(cap: float | None) -> bool:
    return cap is not None and cap != 0  # cap 0 would be the pattern of +0.0


def _ints(a: np.ndarray) -> np.ndarray:
    """The bit patterns of a float (or bfloat16) array (a view)."""
    return a.view({2: np.int16, 4: np.int32, 8: np.int64}[a.itemsize])


@functools.lru_cache(maxsize=16)
def _cap_pattern(cap: float | None, dtype: np.dtype) -> np.integer:
    value = cap if _capped(cap) else 0
    return _ints(bfloat16.narrow(np.array([value], np.float32)) if bfloat16.is_bfloat16(dtype)
                 else np.array([value], dtype))[0]


def sparse_bytes(n: int, nv: int, itemsize: int, cap: float | None) -> int:
    """Size of the sparse form of n entries, nv of which carry a value."""
    return HEADER + nv * itemsize + _bits(n) * (2 if _capped(cap) else 1)


def dense_bytes(n: int, itemsize: int) -> int:
    return HEADER + n * itemsize


def expand_capacity(rows: Any, batch: int, itemsize: int) -> Any:
    """Bytes that hold either form of a rows x batch block, and the bitmaps while they are built
    (a multiple of 8, so blocks placed one after another keep their values aligned). ``rows``
    may be an array of row counts."""
    n = rows * batch
    return (HEADER + n * itemsize + 2 * _bits(n) + 7) // 8 * 8


def _classes(u: np.ndarray, capped: bool, capu: np.integer) -> tuple[np.ndarray, np.ndarray]:
    at_cap = u == capu if capped else np.zeros(len(u), bool)
    return (u != 0) & ~at_cap, at_cap


def _encode_one(x: np.ndarray, rows: np.ndarray, sparse_only: bool, cap: float | None,
                out: np.ndarray) -> int:
    """numpy: one message into ``out``; returns its bytes."""
    n, item = len(rows) * x.shape[1], x.itemsize
    u = _ints(out[HEADER:HEADER + n * item].view(x.dtype))
    np.take(_ints(x), rows, axis=0, out=u.reshape(len(rows), x.shape[1]), mode="clip")
    capped = _capped(cap)
    carry, at_cap = _classes(u, capped, _cap_pattern(cap, x.dtype))
    nv = int(np.count_nonzero(carry))
    size = sparse_bytes(n, nv, item, cap)
    head = out[:HEADER].view(np.int64)
    if not sparse_only and size >= dense_bytes(n, item):
        head[:] = (-1, 0)
        return dense_bytes(n, item)
    head[:] = (nv, int(np.count_nonzero(at_cap)))
    maps = [np.packbits(carry, bitorder="little")]
    if capped:
        maps.append(np.packbits(at_cap, bitorder="little"))
    u[:nv] = u[carry]
    out[HEADER + nv * item:size] = np.concatenate(maps) if n else []
    return size


def _decode_one(buf: np.ndarray, block: np.ndarray, cap: float | None) -> bool:
    """numpy: one message into ``block``; False when it is corrupt (nothing read out of
    bounds, ``block`` then undefined)."""
    n, item = block.size, block.itemsize
    flat = _ints(block.reshape(-1))
    nv, n_cap = (int(v) for v in buf[:HEADER].view(np.int64))
    if (nv, n_cap) == (-1, 0):
        flat[:] = _ints(buf[HEADER:HEADER + n * item].view(block.dtype))
        return True
    capped = _capped(cap)
    if not (0 <= nv and 0 <= n_cap and nv + n_cap <= n and (capped or n_cap == 0)
            and sparse_bytes(n, nv, item, cap) <= len(buf)):
        return False
    start = HEADER + nv * item
    carry = np.unpackbits(buf[start:start + _bits(n)], bitorder="little")
    at_cap = (np.unpackbits(buf[start + _bits(n):start + 2 * _bits(n)], bitorder="little")
              if capped else np.zeros(len(carry), np.uint8))
    if carry[n:].any() or at_cap[n:].any() or (carry & at_cap).any():
        return False
    carry, at_cap = carry[:n].view(bool), at_cap[:n].view(bool)
    if int(np.count_nonzero(carry)) != nv or int(np.count_nonzero(at_cap)) != n_cap:
        return False
    flat[:] = 0
    flat[at_cap] = _cap_pattern(cap, block.dtype)
    flat[carry] = _ints(buf[HEADER:start].view(block.dtype))
    return True


def encode_blocks(x: np.ndarray, rows: np.ndarray, row_starts: np.ndarray, mode: str,
                  cap: float | None, out: np.ndarray, out_starts: np.ndarray) -> np.ndarray:
    """Encode message p, rows rows[row_starts[p]:row_starts[p + 1]] of ``x`` (C-contiguous),
    at out[out_starts[p]:] (``expand_capacity`` bytes each) in the form ``mode`` asks for
    (``auto``: the smaller); returns the bytes of each message. The rows are gathered straight
    into the dense form's place; the values, then the bitmaps, move down when the sparse form
    is chosen."""
    used = np.zeros(len(row_starts) - 1, np.int64)
    if mode == "dense":
        for p in range(len(used)):
            r0, r1 = row_starts[p], row_starts[p + 1]
            n = (r1 - r0) * x.shape[1]
            o = out_starts[p]
            out[o:o + HEADER].view(np.int64)[:] = (-1, 0)
            np.take(x, rows[r0:r1], axis=0, mode="clip",
                    out=out[o + HEADER:o + HEADER + n * x.itemsize].view(x.dtype)
                    .reshape(r1 - r0, x.shape[1]))
            used[p] = dense_bytes(n, x.itemsize)
        return used
    if (nbe := _nbe()) is not None:
        nbe.encode_all(_ints(x), rows, row_starts, out, out_starts, mode == "sparse",
                       _capped(cap), _cap_pattern(cap, x.dtype), used)
        return used
    for p in range(len(used)):
        used[p] = _encode_one(x, rows[row_starts[p]:row_starts[p + 1]], mode == "sparse", cap,
                              out[out_starts[p]:])
    return used


def decode_blocks(stage: np.ndarray, in_starts: np.ndarray, x: np.ndarray, first_row: int,
                  counts: np.ndarray, cap: float | None, source: Callable[[int], str]) -> None:
    """Rebuild rows first_row.. of ``x`` (counts[p] rows per message) exactly from the messages
    at stage[in_starts[p]:in_starts[p + 1]]; a corrupt one raises, naming ``source(p)``."""
    bad = -1
    if (nbe := _nbe()) is not None:
        bad = nbe.decode_all(stage, in_starts, _ints(x), first_row, counts, _capped(cap),
                             _cap_pattern(cap, x.dtype), nbe.POP)
    else:
        row = first_row
        for p, count in enumerate(counts):
            if not _decode_one(stage[in_starts[p]:in_starts[p + 1]], x[row:row + count], cap):
                bad = p
                break
            row += count
    if bad >= 0:
        raise SpdnnError(f"{source(bad)}: corrupt sparse message (its header and bitmaps "
                         "disagree)")


def encode_rows(x: np.ndarray, rows: np.ndarray, mode: str, cap: float | None,
                out: np.ndarray) -> int:
    """One message: rows ``rows`` of ``x`` into ``out``; returns its bytes."""
    return int(encode_blocks(x, np.asarray(rows, np.int64), np.array([0, len(rows)], np.int64),
                             mode, cap, out, np.zeros(1, np.int64))[0])


def decode_rows(buf: np.ndarray, block: np.ndarray, cap: float | None, source: str) -> None:
    """One message written by ``encode_rows`` into ``block`` (C-contiguous)."""
    decode_blocks(buf, np.array([0, len(buf)], np.int64), block, 0,
                  np.array([len(block)], np.int64), cap, lambda _: source)


def _cap_arg(cap: float | None) -> float:
    return -1.0 if cap is None else float(cap)


def slope_count(x: np.ndarray, rows: np.ndarray, cap: float | None) -> int:
    """Entries of x[rows] where the activation slope is 1 (the fold's packed length)."""
    if (nbe := _nbe()) is not None:
        return int(nbe.slope_count(x, rows, _cap_arg(cap)))
    return int(np.count_nonzero(slope_mask(x[rows], cap)))


def fold_pack(partials: np.ndarray, x: np.ndarray, rows: np.ndarray, cap: float | None,
              out: np.ndarray) -> int:
    """out[:n] = the partial sums (one row per entry of ``rows``) where the slope of x[rows]
    is 1, row-major; returns n. ``out`` has room for every partial sum (the kernel stores
    whole vectors); it may be ``partials``' own storage (packed in place)."""
    if len(out) < partials.size:
        raise ValueError(f"fold_pack needs {partials.size} entries of output, got {len(out)}")
    if (nbe := _nbe()) is not None:
        return int(nbe.fold_pack(partials, x, rows, _cap_arg(cap), out))
    mask = slope_mask(x[rows], cap).reshape(-1)
    n = int(np.count_nonzero(mask))
    out[:n] = partials.reshape(-1)[mask]  # a copy first: ``out`` may be ``partials``
    return n


def fold_add(g: np.ndarray, rows: np.ndarray, values: np.ndarray, x: np.ndarray,
             cap: float | None) -> None:
    """g[rows] += packed partial sums (fold_pack's order), each where the slope of x[rows] is 1;
    the entries left out are exactly those the slope zeroes."""
    if (nbe := _nbe()) is not None:
        nbe.fold_add(g, rows, values, x, _cap_arg(cap))
        return
    mask = slope_mask(x[rows], cap)
    block = np.zeros(mask.shape, g.dtype)
    block[mask] = values
    g[rows] += block  # rows are unique within one peer's block: each is added once


def add_rows(g: np.ndarray, rows: np.ndarray, block: np.ndarray) -> None:
    """g[rows] += block (rows unique), without fancy indexing's temporaries."""
    if (nbe := _nbe()) is not None:
        nbe.add_rows(g, rows, block)
        return
    g[rows] += block


def fold_packed(count: int, n: int, mode: str) -> bool:
    """Whether a fold message of n partial sums, ``count`` of them under a slope of 1, travels
    packed: ``sparse`` always, ``auto`` when that is smaller. Both ends decide alike."""
    return mode == "sparse" or (mode == "auto" and count < n)
