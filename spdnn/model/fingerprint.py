"""A network's fingerprint: a stable hash of its layer sizes and sparsity patterns (not the
values), which plans, checkpoints and bundles carry to say which network they are for."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

import numpy as np

HASH_BLOCK = 1 << 20


class Fingerprint:
    """A stable hash of the layer sizes and sparsity patterns (not the values), fed layer by
    layer. Index dtype and byte order do not change it: everything is hashed as little-endian
    int64."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self._h = hashlib.sha256(json.dumps([int(n) for n in sizes]).encode())

    def add(self, indptr: np.ndarray, indices: np.ndarray) -> None:
        self.add_indices(indptr)
        self.add_indices(indices)

    def add_indices(self, values: np.ndarray) -> None:
        """Hash ``values`` after what was added before (a layer's indices may come in
        consecutive parts: the digest is that of their concatenation). Blocks of
        HASH_BLOCK values bound the int64 temporary."""
        for start in range(0, len(values), HASH_BLOCK):
            self._h.update(np.asarray(values[start:start + HASH_BLOCK], dtype="<i8").data)

    def hexdigest(self) -> str:
        return "sha256:" + self._h.hexdigest()[:32]


def fingerprint_of(
    sizes: Sequence[int], patterns: Iterable[tuple[np.ndarray, np.ndarray]]
) -> str:
    """The fingerprint of a whole network given as (indptr, indices) per layer."""
    f = Fingerprint(sizes)
    for indptr, indices in patterns:
        f.add(indptr, indices)
    return f.hexdigest()
