"""Imported first by each command (``spdnn``, ``spdnn-partition``, the scripts, the test suite):
one BLAS/OpenMP thread per rank, set before numpy loads (spdnn.threads). The library itself,
``import spdnn``, leaves the caller's thread settings alone."""

from spdnn.threads import pin_threads

pin_threads()
