"""One thread per rank: pin the BLAS/OpenMP thread pools before numpy is imported.

Threaded kernels collapse when ranks x threads exceed the cores (README, "Performance
settings"), so the default is one; ``SPDNN_THREADS`` (or an explicit ``OMP_NUM_THREADS``)
raises it.
"""

import os

_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def pin_threads() -> None:
    wanted = os.environ.get("SPDNN_THREADS", "1")
    for var in _VARS:
        os.environ.setdefault(var, wanted)


pin_threads()
