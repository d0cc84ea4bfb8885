"""Processes: whether one still runs (for locks and namespaces named after the process that
made them, left behind when it was killed), ending with the parent, how to start helper
processes safely (never ``fork`` inside an MPI job of several ranks), and the file-size limit
while MPI starts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent() -> None:
    """In a forked child: end when the parent process ends, however it ends (Linux
    ``PR_SET_PDEATHSIG``; elsewhere nothing). A child that outlived a killed parent would keep
    its pipes open, and whoever waits on the parent's pipes would wait forever."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent ended before the call took effect
        os._exit(1)


def fork_is_safe() -> bool:
    """False inside a running MPI job of more than one process: a forked child shares the
    parent's MPI state and network endpoints with its peers. A lone process that started MPI
    for itself (a singleton, as the test suite's) may fork. Threads alone do not count: under
    pytest-timeout's thread method every MPI test has a timer thread, and the fork server
    instead made the MPI runs of the suite several times slower (each KaHyPar child imports
    anew)."""
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        try:
            return not mpi.Is_initialized() or mpi.Is_finalized() or \
                mpi.COMM_WORLD.Get_size() == 1
        except Exception:  # noqa: BLE001 (an MPI that cannot say: assume the worst)
            return False
    return True


# What an MPI launcher tells the processes it starts (MPICH's Hydra, Open MPI's PRRTE, PMIx):
# a helper started with them would take itself for that rank and fail in MPI's start.
LAUNCHER_VARIABLES = ("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDRA_", "HYDI_", "MPI_LOCAL")


def child_context() -> BaseContext:
    """Where to start a helper process: ``fork`` (fast, shares memory) where that is safe,
    else ``forkserver`` (a clean server process forks the children), the server started
    without the MPI launcher's variables and without importing the caller's script. Start
    the children under ``main_script_hidden`` too: a script without a ``__main__`` guard, as
    the README's, would otherwise run again in each."""
    import multiprocessing as mp

    if fork_is_safe():
        return mp.get_context("fork")
    from multiprocessing import forkserver

    kept = {k: v for k, v in os.environ.items() if k.startswith(LAUNCHER_VARIABLES)}
    for k in kept:
        del os.environ[k]
    try:
        forkserver.set_forkserver_preload([])
        forkserver.ensure_running()  # a no-op once it runs: it keeps the environment it had
    finally:
        os.environ.update(kept)
    return mp.get_context("forkserver")


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """While a ``forkserver`` child starts: the caller's script is not named to it, so the
    child does not import it again (as multiprocessing does for an interactive session). The
    helpers' targets live in spdnn's and partition's modules, which the child imports."""
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is not None:
        del main.__file__
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path


# MPI's shared memory is files (/dev/shm): under a file-size limit (``ulimit -f``) below this,
# MPICH 5's start fails with a 10-line abort (measured: 4 MiB fails, 8 MiB starts 1-4 ranks).
MPI_START_FILE_BYTES = 8 << 20


@contextlib.contextmanager
def file_size_limit_lifted() -> Iterator[None]:
    """A soft file-size limit lifted to the hard one while MPI starts, then restored (the
    job's own files keep the user's limit: a write past it is "cannot write"); a hard limit too
    small for the start is one line (``SpdnnError``) before MPI's abort could print its
    stack."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and hard < MPI_START_FILE_BYTES:
        from spdnn.errors import SpdnnError

        raise SpdnnError(f"the file-size limit (ulimit -f) of {hard:,} bytes is below the "
                         f"{MPI_START_FILE_BYTES >> 20} MiB MPI's shared memory needs to start "
                         "(its segments are files): raise it, or lower only the soft limit "
                         "(ulimit -S -f), which spdnn lifts while MPI starts")
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    try:
        yield
    finally:
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
