"""The ``spdnn`` console script: Ctrl-C while the modules load, MPI starts or the command runs
ends the job with one line (spdnn.comm.interrupt) instead of a traceback per rank."""

from __future__ import annotations

import sys

# The commands that run on the ranks of an MPI job (the others keep Python's KeyboardInterrupt
# alone: ``spdnn emulate`` cleans its network namespaces up on it).
DISTRIBUTED = ("train", "infer", "calibrate")


def main() -> int:
    import spdnn.cli.thread_pools  # noqa: F401  (one BLAS thread per rank, before numpy loads)

    try:
        if len(sys.argv) > 1 and sys.argv[1] in DISTRIBUTED:
            from spdnn.comm.interrupt import watch

            watch("spdnn")
        from spdnn.cli.parser import main as run

        return run(finalize_mpi=True)
    except KeyboardInterrupt:
        from spdnn.comm.interrupt import interrupted

        interrupted("spdnn")
        return 130
