"""MNIST's IDX files, gzipped or not (docs/formats.md): magic 0x0000TTDD, D big-endian sizes,
then the data. A malformed file is an InputError naming it."""

from __future__ import annotations

import gzip
import math
import os

import numpy as np

from spdnn.errors import InputError
from spdnn.io.atomic import atomic_path
from spdnn.io.formats import read_bytes

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzipped or not): magic 0x0000TTDD, D big-endian sizes, then the data."""
    p = os.fspath(path)
    raw = read_bytes(p)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise InputError(p, "not an IDX file (bad magic number)")
    ndim = raw[3]
    if ndim < 1 or len(raw) < 4 + 4 * ndim:
        raise InputError(p, "truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    need = math.prod(dims) * dtype.itemsize  # Python integers: no overflow
    body = raw[4 + 4 * ndim:]
    if len(body) < need:
        raise InputError(p, f"truncated: header promises {need} data bytes, found {len(body)}")
    if len(body) > need:
        raise InputError(p, f"{len(body) - need} bytes of trailing data after the IDX payload")
    return np.frombuffer(body, dtype, math.prod(dims)).reshape(dims)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09}
    arr = np.ascontiguousarray(array)
    if arr.dtype not in codes:
        raise ValueError("write_idx supports uint8 and int8 arrays")
    head = bytes([0, 0, codes[arr.dtype], arr.ndim]) + np.array(arr.shape, ">u4").tobytes()
    with atomic_path(path) as tmp:
        data = head + arr.tobytes()
        tmp.write_bytes(gzip.compress(data) if os.fspath(path).endswith(".gz") else data)
