"""What a rank will hold of a data set, counted before it is read (the memory check before
loading, ``spdnn.runtime.memory_budget.Budget.data``).

The count mirrors what ``spdnn.io.loaders.load_dataset`` (or ``spdnn.io.arrays.from_memory``)
and ``spdnn.runtime.inference.local_inputs`` keep: the x arrays (labels aside), of the rank's
feature columns where the source is read by columns (``npz:``, ``mnist:``, data in memory),
whole where it is not (``digits``; ``xc:``: the replica's share of the samples, every column),
plus the rank's copy of its columns when it has only some of them. It reads headers only
(``xc:`` files: the count of their ``:`` separators).
A file that is not there is refused here, before anything loads; one it cannot make sense of
counts 0: the loader names the problem, as without a count.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.mnist import idx_dims
from spdnn.model.batching import SEGMENT_BYTES
from spdnn.model.csr import as_dtype

DIGITS = (1437, 360, 64)  # training samples, test samples, features (spdnn.io.loaders)
_SCAN = 1 << 24


def data_nbytes(data: Any, dtype: Any, features: np.ndarray, n_in: int, *,  # noqa: ANN401
                training: bool, replicas: int = 1) -> int:
    """Bytes of x this rank will hold for ``data`` (a source name or arrays in memory), with
    ``features`` its first layer's inputs of ``n_in``; ``training``: both splits are kept
    in the rank's columns (inference: the one it evaluates); a replica of ``replicas`` keeps
    only its share of the samples (counted: the largest share)."""
    item = as_dtype(dtype or "float32").itemsize

    def share(rows: int) -> int:
        return -(-rows // replicas)

    some = len(features) < n_in or replicas > 1  # a copy beside a source read whole
    # a training replica's fetched segment, with its send and receive copies
    fetched = 3 * SEGMENT_BYTES // replicas if training and replicas > 1 else 0
    try:
        if not isinstance(data, str):
            return _in_memory(data, item, len(features))
        if data == "digits":
            whole = (DIGITS[0] + DIGITS[1]) * DIGITS[2] * item
            kept = (share(DIGITS[0]) + share(DIGITS[1]) if training else share(DIGITS[1])) * \
                len(features) * item
            return fetched + whole + (kept if some else 0)
        kind, _, arg = data.partition(":")
        if kind == "npz" and arg:  # inference reads only the split it evaluates
            rows = _npz_rows(Path(arg))
            return fetched + sum(share(n) * len(features) * item
                                 for n in (rows if training else rows[-1:]))
        if kind == "mnist" and arg:
            stems = ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte")
            return fetched + sum(share(idx_dims(_idx(Path(arg), stem))[0]) * len(features) *
                                 item for stem in (stems if training else stems[1:]))
        if kind == "xc" and arg:
            splits = [_xc_bytes(Path(arg) / name, item) for name in ("train.txt", "test.txt")
                      if (Path(arg) / name).exists() or name == "train.txt"]
            # both splits' share, every column (kept chunk by chunk as the files are read);
            # nnz of the rank's columns: at most all of the share's
            held = -(-sum(splits) // replicas)
            kept = -(-(sum(splits) if training else splits[-1]) // replicas)
            return fetched + held + (kept if len(features) < n_in else 0)
    except InputError as e:
        if not os.path.lexists(e.path):
            raise  # a file that is not there: refused before anything loads
        return 0  # the loader names what is wrong with it
    except (OSError, ValueError, EOFError, struct.error):
        return 0
    return 0


def _in_memory(data: Any, item: int, width: int) -> int:  # noqa: ANN401
    from spdnn.io.loaders import Dataset

    if isinstance(data, Dataset):
        data = (data.x_train, data.y_train, data.x_test, data.y_test)
    if not isinstance(data, (tuple, list)):
        return 0
    total = 0
    for x in list(data)[0::2]:
        if x is None:
            continue
        if sp.issparse(x):  # the columns kept hold at most every stored value
            total += int(x.nnz) * (item + 4) + (x.shape[0] + 1) * 4
        else:
            total += int(np.shape(x)[0]) * width * item
    return total


def _npz_rows(path: Path) -> list[int]:
    from spdnn.io.npz import NpzReader

    npz = NpzReader(path, "training data")
    try:
        return [npz.header(key)[0][0] for key in ("x_train", "x_test") if key in npz.keys]
    finally:
        npz.close()


def _idx(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise InputError(directory / stem, "no such file")


def _xc_bytes(path: Path, item: int) -> int:
    """A CSR matrix of an XC file: every ``feature:value`` pair a stored value."""
    with open(path, "rb") as fh:
        n = int(fh.readline().split()[0])
        pairs = 0
        while block := fh.read(_SCAN):
            pairs += block.count(b":")
    return pairs * (item + 4) + (n + 1) * 4
