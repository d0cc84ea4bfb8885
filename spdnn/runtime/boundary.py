"""The activations between two blocks of a layer-streamed inference: each chunk's surviving
samples and this rank's rows of the block's last activation, kept until the next block reads
them. Held in memory up to an allowance, spilled to private scratch files beyond it (a chunk
at a time), and stored sparse where that is smaller (ReLU leaves zeros)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.errors import SpdnnError

# Stored as CSR when its nonzeros take less than this share of the dense block's elements.
SPARSE_BELOW = 0.4


@dataclass(frozen=True)
class Chunk:
    """One chunk between blocks: the samples still alive (``ids``, into the chunk's inputs)
    and their activations, (my rows x len(ids)), dense or CSR."""

    ids: np.ndarray
    values: np.ndarray | sp.csr_matrix

    @property
    def nbytes(self) -> int:
        v = self.values
        held = v.nbytes if isinstance(v, np.ndarray) else \
            v.data.nbytes + v.indices.nbytes + v.indptr.nbytes
        return int(self.ids.nbytes + held)

    def dense(self) -> np.ndarray:
        v = self.values
        return v if isinstance(v, np.ndarray) else np.ascontiguousarray(v.toarray())

    @staticmethod
    def of(ids: np.ndarray, block: np.ndarray) -> Chunk:
        """``block`` kept dense or turned CSR, whichever is smaller (values unchanged)."""
        if block.size and np.count_nonzero(block) < SPARSE_BELOW * block.size:
            csr = sp.csr_matrix(block)
            csr.indices = csr.indices.astype(np.int32, copy=False)
            return Chunk(ids, csr)
        return Chunk(ids, np.ascontiguousarray(block))


class BoundaryStore:
    """Chunks by number: ``put`` keeps one in memory while the kept ones stay within
    ``allowance`` bytes (0: no bound) and writes it to ``scratch`` (a private directory made
    under it, removed by ``close``) otherwise; ``take`` returns it and forgets it."""

    def __init__(self, allowance: int, scratch: str | None = None) -> None:
        self.allowance = allowance
        self._scratch_root = scratch
        self._dir: str | None = None
        self._kept: dict[int, Chunk] = {}
        self._spilled: dict[int, tuple[str, str]] = {}
        self.held = 0  # bytes kept in memory now
        self.peak = 0  # the most kept at once
        self.spilled_bytes = 0  # written to scratch over the job

    def put(self, key: int, chunk: Chunk) -> None:
        size = chunk.nbytes
        if not self.allowance or self.held + size <= self.allowance:
            self._kept[key] = chunk
            self.held += size
            self.peak = max(self.peak, self.held)
            return
        self._spill(key, chunk)

    def _spill(self, key: int, chunk: Chunk) -> None:
        if self._dir is None:
            try:
                self._dir = tempfile.mkdtemp(prefix="spdnn-stream-", dir=self._scratch_root)
            except OSError as exc:
                raise SpdnnError(f"scratch directory {self._scratch_root or tempfile.gettempdir()}"
                                 f": cannot create a spill directory ({exc.strerror})") from None
        base = os.path.join(self._dir, str(key))
        v = chunk.values
        try:
            if isinstance(v, np.ndarray):
                np.savez(base + ".npz", ids=chunk.ids, dense=v)
            else:
                np.savez(base + ".npz", ids=chunk.ids, data=v.data, indices=v.indices,
                         indptr=v.indptr, shape=np.array(v.shape))
        except OSError as exc:
            raise SpdnnError(f"{base}.npz: cannot spill the activations between blocks "
                             f"({exc.strerror}); give a scratch directory with room "
                             "(TMPDIR) or a larger --memory-limit") from None
        self._spilled[key] = (base + ".npz", "")
        self.spilled_bytes += chunk.nbytes

    def take(self, key: int) -> Chunk | None:
        if key in self._kept:
            chunk = self._kept.pop(key)
            self.held -= chunk.nbytes
            return chunk
        if key not in self._spilled:
            return None
        path, _ = self._spilled.pop(key)
        with np.load(path) as f:
            if "dense" in f:
                chunk = Chunk(f["ids"], f["dense"])
            else:
                chunk = Chunk(f["ids"], sp.csr_matrix((f["data"], f["indices"], f["indptr"]),
                                                      shape=tuple(f["shape"])))
        os.unlink(path)
        return chunk

    def close(self) -> None:
        self._kept.clear()
        self._spilled.clear()
        self.held = 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
