"""Loading the kernels a job runs, before it needs them: from numba's cache (or compiled, the
first time), so that no timed step pays for it and a job's baseline is measured with them in
memory (spdnn.runtime.memory_report.measure_baseline)."""

from __future__ import annotations

from typing import Any

import numpy as np

from spdnn.kernels import encoding, layers
from spdnn.kernels import products as kernels


def load_kernels(dtype: Any = None, *, narrow: bool = False,  # noqa: ANN401
                 bfloat16: bool = False) -> None:
    """Load the products and the exchange's encoders for ``dtype`` (None: both types; with
    ``narrow``, also the narrow end of challenge inference; ``bfloat16``: the products of
    bfloat16 blocks too; an optimizer's update: spdnn.optim.load_kernels). Loaded kernels
    load again for nothing; the scipy backend loads nothing."""
    dtypes = (np.float32, np.float64) if dtype is None else (np.dtype(dtype).type,)
    kernels.warm_up(dtypes)
    if bfloat16:
        kernels.warm_up_bfloat16()
    encoding.warm_up(dtypes)
    if narrow:
        layers.warm_up(dtypes + ((np.uint16,) if bfloat16 else ()))
