"""Ctrl-C ends a job with one line and exit code 130, at any moment of it.

The launcher forwards SIGINT to every rank; each gets a KeyboardInterrupt wherever it runs
Python (``spdnn.cli.entry`` from the first import, ``spdnn.comm.collective``'s ``guarded`` and
``run_collectively``, the command's own handler) and leaves at once with 130: a normal exit
would wait in MPI_Finalize for peers already gone, and MPI_Abort adds a line per rank. A rank
blocked inside a C-level MPI wait (its peer gone) would never see the interrupt, so ``watch``
wakes a thread on the signal itself (``signal.set_wakeup_fd``), which prints the line at once
and ends the process after GRACE seconds. MPI_Init spins for peers the interrupt may have
ended: spdnn.comm calls it without the GIL, so this thread runs meanwhile. Where the main
thread holds the GIL inside C for good all the same, this thread cannot run again:
faulthandler's C watchdog, armed by it, ends the process a second later (exit code 1). The
line is printed once, by rank 0 alone (the launcher's rank variable, known before MPI starts).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Iterator

RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")

# Seconds the main thread has to leave by itself (its KeyboardInterrupt, running the clean-up
# on the way) before the watcher ends the process.
GRACE = 1.0

_said = threading.Lock()  # the line is printed once per process
_sink: list = []  # /dev/null, open for the watchdog's traceback (the user sees one line)


def _devnull():  # noqa: ANN202
    if not _sink:
        _sink.append(open(os.devnull, "w"))  # noqa: SIM115 (held open for the process's life)
    return _sink[0]


def launcher_rank() -> int:
    """This process's rank as the launcher set it (0 without a launcher)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def announce(prog: str = "spdnn", rank: int | None = None) -> None:
    """Print ``PROG: interrupted``: from rank 0 only, once per process."""
    if _said.acquire(blocking=False) and (launcher_rank() if rank is None else rank) == 0:
        os.write(2, f"{prog}: interrupted\n".encode())


def interrupted(prog: str = "spdnn", rank: int | None = None) -> None:
    """Announce the interrupt and end this process with 130 at once."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # no second interrupt meanwhile
    announce(prog, rank)
    sys.stdout.flush()
    os._exit(130)


@contextlib.contextmanager
def starting_mpi() -> Iterator[None]:
    """While MPI starts under a call that holds the GIL (mpi4py's own, where spdnn.comm cannot
    find the MPI library to call it without), Ctrl-C ends this rank at once by the signal's
    default action: MPI_Init spins for peers that the same interrupt may have ended, and
    neither the main thread nor ``watch``'s thread would run Python again (a 2-rank job hung
    there at 100% CPU). The rank prints nothing; MPICH's mpiexec exits with the signal's
    number (2)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def watch(prog: str = "spdnn") -> None:
    """From now on, SIGINT ends this process within GRACE seconds even while its main thread
    is blocked in C. Call from the main thread, before MPI starts."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = sys.unraisablehook

    def unraisable(info) -> None:  # noqa: ANN001
        # An interrupt that lands in a finaliser (a ZipFile's __del__ after a checkpoint) is
        # not raised but printed as "Exception ignored"; the thread below ends the process
        # with the one line all the same.
        if not isinstance(info.exc_value, KeyboardInterrupt):
            previous(info)

    sys.unraisablehook = unraisable

    def wait() -> None:
        while signal.SIGINT not in os.read(r, 512):
            pass
        announce(prog)  # at once: a peer that leaves first may make the launcher kill us
        # The main thread may hold the GIL inside C for good (MPI_Init, under mpi4py's import,
        # spinning for a peer that the same interrupt ended): this thread would then never run
        # again. faulthandler's watchdog is a C thread that needs no GIL; it ends the process
        # (exit code 1) if the line below cannot.
        faulthandler.dump_traceback_later(GRACE + 1.0, exit=True, file=_devnull())
        threading.Event().wait(GRACE)
        interrupted(prog)

    threading.Thread(target=wait, name="spdnn-interrupt", daemon=True).start()
