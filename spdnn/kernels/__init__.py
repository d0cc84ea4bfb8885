"""Local kernels, no MPI: the sparse products behind one interface with interchangeable backends
(``scipy``, ``numba``: spdnn.backends, chosen once), the exchange encodings, and index
helpers.

>>> from spdnn import kernels
>>> kernels.set_backend("scipy")
"""

from spdnn.kernels.products import (
    BACKENDS,
    apply_slope,
    available_backends,
    backend,
    callers_threads_kept,
    max_threads,
    sddmm,
    set_backend,
    set_threads,
    spmm,
    spmm_act,
    threads,
    transpose,
)

__all__ = ["BACKENDS", "apply_slope", "available_backends", "backend", "callers_threads_kept",
           "max_threads", "sddmm",
           "set_backend", "set_threads", "spmm", "spmm_act", "threads", "transpose"]
