"""One thread per rank: the commands pin the BLAS/OpenMP thread pools before numpy is imported
(``spdnn.cli.thread_pools``); importing the library changes nothing.

Threaded kernels collapse when ranks x threads exceed the cores (docs/running.md,
"Performance settings"), so the default is one; ``SPDNN_THREADS`` (or an explicit
``OMP_NUM_THREADS``) raises it. numba's pool is sized when numba loads
(``NUMBA_NUM_THREADS``, its upper bound), and spdnn loads numba lazily, so ``--threads N``
can still size it (``reserve_threads``). The pool
is not sized to the cores: idle OpenMP workers of every rank would compete for them.
"""

import os
import sys

_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def default_threads() -> int:
    """SPDNN_THREADS when it is a positive integer, else 1."""
    value = os.environ.get("SPDNN_THREADS", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def pin_threads() -> None:
    """Set each thread variable the environment leaves unset to ``default_threads()``."""
    wanted = str(default_threads())
    for var in _VARS:
        # numba already loaded (by the caller) has sized its pool: changing the variable now
        # would make its next compilation fail.
        if var != "NUMBA_NUM_THREADS" or "numba" not in sys.modules:
            os.environ.setdefault(var, wanted)


def reserve_threads(n: int) -> None:
    """Let numba's pool hold ``n`` threads, if numba has not loaded yet (then its size is
    fixed, and spdnn.kernels.set_threads refuses more)."""
    n = min(n, os.cpu_count() or 1)  # more is refused by the command (one-line error)
    current = os.environ.get("NUMBA_NUM_THREADS", "1")
    if "numba" not in sys.modules and (not current.isdigit() or int(current) < n):
        os.environ["NUMBA_NUM_THREADS"] = str(n)
