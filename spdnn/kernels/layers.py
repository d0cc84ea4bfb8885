"""A run of layers in one kernel call: the narrow end of an inference pass that exchanges
nothing (spdnn.kernels._numba_layers; the numba backend only). No MPI here.

- ``LayerRun.of(weights, biases, in_rows)``: where the layers' arrays are, found once (no
  copies), or None where the backend is scipy or the layers' array types differ (one type of
  index, one of value, one of bias: bfloat16's weights hold bits beside float32 biases).
- ``run.narrow(...)``: the layers from ``first`` on a narrow batch; see ``narrow_layers``.
- ``warm_up(dtypes)``: load (or compile) that kernel now, outside any timed loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.kernels import products

# The batch widths of the narrow kernels (bytes of a row of X: 32 float32 or 16 float64).
NARROW_BYTES = 128


@dataclass(frozen=True)
class LayerRun:
    """Where the layers' CSR arrays and biases are (addresses and lengths: numba's typed lists
    took seconds to build in every process), the arrays themselves (kept alive with them), and
    each layer's X rows and output rows."""

    where: np.ndarray  # (2, 4, layers): address and length of indptr, indices, data, bias
    arrays: tuple
    in_rows: np.ndarray
    rows: np.ndarray

    @staticmethod
    def of(weights: Sequence[sp.csr_matrix], biases: Sequence[np.ndarray],
           in_rows: Sequence[int]) -> LayerRun | None:
        if products.active().compiled("layers") is None or not weights:
            return None
        arrays = ([w.indptr for w in weights], [w.indices for w in weights],
                  [w.data for w in weights], list(biases))
        def kinds(group: list) -> set:
            return {(a.dtype, a.ndim, a.flags.c_contiguous) for a in group}

        if len(kinds(arrays[0] + arrays[1])) != 1 or len(kinds(arrays[2])) != 1 \
                or len(kinds(arrays[3])) != 1:  # one type of index, of value, of bias
            return None
        where = np.array([[[a.ctypes.data for a in group] for group in arrays],
                          [[len(a) for a in group] for group in arrays]], dtype=np.int64)
        return LayerRun(where, tuple(map(tuple, arrays)), np.asarray(in_rows, dtype=np.int64),
                        np.array([w.shape[0] for w in weights], dtype=np.int64))

    def narrow(self, first: int, cap: float | None, compact_below: float,
               xbufs: Sequence[np.ndarray], cur: int, zbuf: np.ndarray, width: int,
               ids: np.ndarray) -> tuple[int, np.ndarray]:
        """Layers first.. on X_first, (in_rows[first] x width) at the start of xbufs[cur]:
        returns the final width (0: every column died) with Z_L in zbuf's first rows x width
        and the survivors in ids' first entries (ids is changed), and nnz x width per layer
        run (the others 0)."""
        products._nb()  # numba's threads set as the kernels expect
        from spdnn.kernels._numba_layers import narrow_layers

        work = np.zeros(len(self.in_rows), dtype=np.float64)
        index, value, bias = (self.arrays[a][0][:0] for a in (0, 2, 3))
        width = narrow_layers(self.where, self.in_rows, first, -1.0 if cap is None else
                              float(cap), compact_below, xbufs[0], xbufs[1], cur, zbuf, width,
                              ids, work, index, value, bias)
        return int(width), work
    def fits(self, first: int, width: int, itemsize: int) -> bool:
        """Whether layers first.. run in one call: a narrow batch (of ``itemsize``-byte
        values; bfloat16's 2 fill a float32's lane), and products small enough for the one
        thread that runs them (as spmm_act would give them)."""
        if not 0 < width * max(itemsize, 4) <= NARROW_BYTES:
            return False
        return products.threads() == 1 or \
            int(self.rows[first:].max()) * width < products.SMALL_PRODUCT


def warm_up(dtypes: tuple = (np.float32, np.float64)) -> None:
    """Load (or compile) the run's kernel for ``dtypes`` (int32 indices, as layers hold;
    uint16: bfloat16's bits, with float32 biases and Z)."""
    for dt in dtypes:
        sums = np.float32 if np.dtype(dt) == np.uint16 else dt
        w = sp.csr_matrix((np.ones(1, dt), np.zeros(1, np.int32), np.array([0, 1], np.int32)),
                          shape=(1, 1))  # one stored entry, int32 indices
        run = LayerRun.of([w], [np.zeros(1, sums)], [1])
        if run is None:  # the scipy backend
            return
        buf = np.ones(2, dt)
        run.narrow(0, None, 0.75, (buf, buf.copy()), 0, np.zeros(2, sums), 2, np.arange(2))
