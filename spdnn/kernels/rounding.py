"""The bfloat16 copies the products gather, rounded to nearest even from float32 behind the
kernel backends: an input or error block (with its rows' sums, the bias gradient of what was
rounded) and the weights after an update. numba rounds in one pass (spdnn.kernels.
_numba_bfloat16); the scipy backend with numpy's ``bfloat16.narrow``. No MPI here."""

from __future__ import annotations

import numpy as np

from spdnn.backends import active, form
from spdnn.kernels import bfloat16
from spdnn.kernels.products import _nb

_NO_SUMS = np.zeros(0, dtype=np.float32)


def round_rows(g: np.ndarray, out: np.ndarray, sums: np.ndarray | None = None) -> None:
    """out = g rounded to bfloat16 (an input or error block before the products gather it)
    and, when given, sums = out's row sums in float32 (the bias gradient of what was
    rounded)."""
    active().round_rows(g, out, sums)


@form("numba", "round_rows")
def _round_rows_numba(g: np.ndarray, out: np.ndarray, sums: np.ndarray | None) -> None:
    _nb()
    g = np.ascontiguousarray(g, np.float32)  # (a no-op for the passes' blocks)
    active().compiled("bfloat16").narrow_rows(g, out, _NO_SUMS if sums is None else sums)


@form("scipy", "round_rows")
def _round_rows(g: np.ndarray, out: np.ndarray, sums: np.ndarray | None) -> None:
    bfloat16.narrow(g, out=out)
    if sums is not None:
        np.sum(bfloat16.widen(out), axis=1, out=sums)


def round_weights(master: np.ndarray, out: np.ndarray) -> None:
    """out = the master weights rounded to bfloat16 (the products' copy after an update)."""
    active().round_weights(master, out)


@form("numba", "round_weights")
def _round_weights_numba(master: np.ndarray, out: np.ndarray) -> None:
    _nb()
    active().compiled("bfloat16").narrow_flat(master, out)


@form("scipy", "round_weights")
def _round_weights(master: np.ndarray, out: np.ndarray) -> None:
    bfloat16.narrow(master, out=out)
