"""One thread per rank: pin the BLAS/OpenMP thread pools before numpy is imported.

Threaded kernels collapse when ranks x threads exceed the cores (README, "Performance
settings"), so the default is one; ``SPDNN_THREADS`` (or an explicit ``OMP_NUM_THREADS``)
raises it. numba's pool is sized to the cores (``NUMBA_NUM_THREADS`` is its upper bound, fixed
at import) so that ``--threads N`` can choose N later; its kernels use ``threads()`` of them.
"""

import os

_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def default_threads() -> int:
    """SPDNN_THREADS when it is a positive integer, else 1."""
    value = os.environ.get("SPDNN_THREADS", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def pin_threads() -> None:
    wanted = str(default_threads())
    for var in _VARS:
        os.environ.setdefault(var, wanted)
    os.environ.setdefault("NUMBA_NUM_THREADS", str(max(os.cpu_count() or 1,
                                                       default_threads())))


pin_threads()
