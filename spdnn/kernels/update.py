"""Where the optimizers' fused updates run (spdnn.optim: ``make(..., parallel=PARALLEL)``):
one pass over a parameter split over the kernel threads, on the numba backend, for arrays of
at least ``PARALLEL_MIN`` values (below that, starting threads costs more than it saves).
Elsewhere the optimizer's numpy passes run: the same bits."""

from __future__ import annotations

import numpy as np

from spdnn.kernels import products

PARALLEL_MIN = 1 << 15


class _Parallel:
    """spdnn.optim.optimizer.Parallel on this process's kernel backend and threads."""

    def applies(self, *arrays: np.ndarray) -> bool:
        return (len(arrays[0]) >= PARALLEL_MIN and self.loads()
                and all(a.flags.c_contiguous and a.ndim == 1 for a in arrays))

    def ready(self) -> None:
        products._nb()  # the thread count set for this rank

    @staticmethod
    def loads() -> bool:
        """Whether fused kernels are in use (the backend runs compiled kernels: worth loading
        ahead)."""
        return products.active().compiled("products") is not None


PARALLEL = _Parallel()
