"""The watchdog on every wait of spdnn's communication (``--comm-timeout``): a wait that lasts
longer than the timeout means a peer that stalled, a link that went down or a rank that died,
and the job ends with one line instead of hanging. It knows nothing of MPI: the communicator
gives it this rank's number and a function that ends the job."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence

from spdnn.errors import say_error

TIMEOUT_EXIT = 3  # the exit code of a job ended by the watchdog


class Watchdog:
    """One per process, shared by a communicator and its splits: a thread that ends the job
    when the wait in progress has lasted longer than ``timeout`` seconds."""

    def __init__(self, rank: int, abort: Callable[[int], None]) -> None:
        self._rank, self._abort = rank, abort
        self.timeout: float | None = None
        self._since = 0.0
        self._what: tuple[str, Sequence[int]] | None = None
        self._thread: threading.Thread | None = None
        self.before_abort: list[Callable[[], None]] = []  # e.g. release a checkpoint lock

    def set(self, timeout: float | None) -> None:
        self.timeout = timeout
        if timeout is not None and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(target=self._run, name="spdnn-watchdog",
                                            daemon=True)
            self._thread.start()

    def arm(self, what: str, peers: Sequence[int]) -> None:
        self._since = time.monotonic()  # before _what: the thread never sees an old start
        self._what = (what, peers)

    def disarm(self) -> None:
        self._what = None

    def _run(self) -> None:
        while (timeout := self.timeout) is not None:  # no timeout: the thread ends
            time.sleep(min(1.0, max(timeout / 20, 0.05)))
            what, since = self._what, self._since
            if what is None or time.monotonic() - since <= timeout:
                continue
            if self._rank != 0:
                # Rank 0 usually waits too: let it end the job, releasing what it holds (the
                # checkpoint directory's lock) and printing the line a user reads first (a
                # stalled node's lines may never arrive). Its wait may have begun later (it
                # was still computing): one more timeout, within [2, 30] s.
                time.sleep(min(max(2.0, timeout), 30.0))
                if self._what is not what or self._since != since:
                    continue  # that wait ended meanwhile: nothing stalled
            task, peers = what
            names = ", ".join(map(str, peers)) if peers else "the others"
            say_error("spdnn", f"rank {self._rank} ({socket.gethostname()}) waited {timeout:g} s "
                               f"for rank{'s' * (len(peers) != 1)} {names} in {task} "
                               "(--comm-timeout): a stalled peer, a lost link or a dead rank; "
                               "ending the job")
            for hook in list(self.before_abort):
                try:
                    hook()
                except Exception:  # noqa: BLE001 - ending the job matters more
                    pass
            self._abort(TIMEOUT_EXIT)
            return


def guard_start(timeout: float, prog: str = "spdnn", rank: int = 0) -> Callable[[], None]:
    """Cover MPI's start-up with the same limit: until the returned function is called, a
    sentinel process ends this one (SIGKILL, after one line) if the start lasts longer than
    ``timeout`` plus the grace of the watchdog (a link frozen while the ranks exchange their
    addresses). No thread of this process could: MPI_Init holds the interpreter. The sentinel
    leaves quietly when this process ends first. Call before MPI is imported, from the main
    thread."""
    import os
    import select
    import signal

    limit = timeout + min(max(2.0, timeout), 30.0)
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the sentinel: only system calls, no lock of the parent's is taken
        try:
            os.close(w)
            ready, _, _ = select.select([r], [], [], limit)
            if not ready:
                line = (f"{prog}: error: rank {rank} ({socket.gethostname()}) waited "
                        f"{limit:g} s for MPI to start (--comm-timeout): a stalled peer, a "
                        "lost link or a dead rank; ending the job\n")
                os.write(2, line.encode())
                os.kill(parent, signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(r)

    def dismiss() -> None:
        os.write(w, b".")
        os.close(w)
        os.waitpid(pid, 0)

    return dismiss


class Waiting:
    """Arms ``dog`` for one wait: ``peers()`` gives the job's ranks waited for (called only
    when a timeout is set)."""

    __slots__ = ("_dog", "_what", "_peers")

    def __init__(self, dog: Watchdog, what: str, peers: Callable[[], Sequence[int]]) -> None:
        self._dog, self._what, self._peers = dog, what, peers

    def __enter__(self) -> None:
        if self._dog.timeout is not None:
            self._dog.arm(self._what, self._peers())

    def __exit__(self, *exc: object) -> None:
        self._dog.disarm()
