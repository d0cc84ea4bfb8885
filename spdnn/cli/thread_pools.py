"""Imported first by each command (``spdnn``, ``spdnn-partition``, the scripts, the test suite):
one BLAS/OpenMP thread per rank, set before numpy loads (spdnn.comm.threads). The library itself,
``import spdnn``, leaves the caller's thread settings alone."""

from spdnn.comm.threads import pin_threads

pin_threads()
