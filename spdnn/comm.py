"""Every MPI call of spdnn lives here; compute code never calls MPI directly (one concern:
the rule that keeps message passing auditable in one place, as Heat does).

- ``Communicator``: a private duplicate of the caller's communicator (so spdnn's messages never
  match anyone else's), with ``split``, non-blocking point-to-point, the few collectives the
  runtime needs, and agreement on errors.
- ``run_collectively``: runs an entry point so that an exception on one rank ends every rank.
- ``world_size`` / ``abort_world``: for the test plugin, which must abort without a collective.

Every wait is watched: with a timeout set (``watch``), a wait that lasts longer ends the whole
job with one line naming the rank, its host, the peers and what it waited for (exit code 3).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from spdnn.errors import SpdnnError, say_error
from spdnn.interrupt import interrupted
from spdnn.watchdog import Watchdog

Request = MPI.Request


class AgreedError(SpdnnError):
    """An error every rank raised together (after ``Communicator.agree``)."""


class Communicator:
    """spdnn's view of an MPI communicator (default: a duplicate of COMM_WORLD).

    Construction is collective (``Dup``); ``free`` releases the duplicate.
    """

    def __init__(self, comm: MPI.Comm = MPI.COMM_WORLD, *, duplicate: bool = True,
                 timeout: float | None = None, _watchdog: Watchdog | None = None) -> None:
        self._watchdog = _watchdog or Watchdog(MPI.COMM_WORLD.Get_rank(), _abort_from_thread)
        if timeout is not None:  # the duplication is a wait for every rank too
            self._watchdog.set(timeout)
        self._comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self._world_ranks: list[int] | None = None
        if duplicate:
            with self._waiting("duplicating the communicator"):
                self._comm = comm.Dup()

    def watch(self, timeout: float | None) -> None:
        """End the job when any wait here (or on a split) lasts over ``timeout`` s; None: no
        limit."""
        self._watchdog.set(timeout)

    def before_timeout_abort(self, hook: Callable[[], None], add: bool = True) -> None:
        """Run ``hook`` on this rank before the watchdog ends the job (``add=False``: stop)."""
        hooks = self._watchdog.before_abort
        if add:
            hooks.append(hook)
        elif hook in hooks:
            hooks.remove(hook)

    def _waiting(self, what: str, peers: Sequence[int] | None = None) -> _Waiting:
        return _Waiting(self, what, peers)

    def world_rank(self, rank: int) -> int:
        """``rank`` of this communicator as a rank of the job (what the user sees)."""
        if self._world_ranks is None:
            self._world_ranks = list(MPI.Group.Translate_ranks(
                self._comm.Get_group(), list(range(self.size)), MPI.COMM_WORLD.Get_group()))
        return self._world_ranks[rank]

    def node_size(self) -> int:
        """Ranks of this communicator on this node (sharing its memory)."""
        with self._waiting("splitting the communicator by node"):
            node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, self.rank)
        n = node.Get_size()
        node.Free()
        return int(n)

    @staticmethod
    def self_only() -> Communicator:
        """This process alone (MPI_COMM_SELF, not duplicated): for measurements on one rank."""
        return Communicator(MPI.COMM_SELF, duplicate=False)

    def split(self, color: int, key: int | None = None) -> Communicator:
        """Ranks with the same ``color`` form a new communicator, ordered by ``key``."""
        with self._waiting("splitting the communicator"):
            sub = self._comm.Split(color, self.rank if key is None else key)
        return Communicator(sub, duplicate=False, _watchdog=self._watchdog)

    def free(self) -> None:
        if self._comm not in (MPI.COMM_NULL, MPI.COMM_SELF, MPI.COMM_WORLD):
            self._comm.Free()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    # -- agreement: every rank raises the same error, so none waits in a collective alone --
    def agree(self, error: str | None) -> None:
        """Raise AgreedError on every rank if any rank reports an error (first by rank)."""
        for e in self.allgather(error):
            if e is not None:
                raise AgreedError(e)

    def check(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on every rank; a SpdnnError on any rank is raised on all of them."""
        try:
            result, error = fn(), None
        except SpdnnError as exc:
            result, error = None, str(exc)
        self.agree(error)
        return result

    # -- point-to-point (contiguous numpy buffers; the datatype follows the array) ----------
    def isend(self, buf: np.ndarray, dest: int, tag: int) -> Request:
        return self._comm.Isend(buf, dest=dest, tag=tag)

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> Request:
        return self._comm.Irecv(buf, source=source, tag=tag)

    def waitall(self, reqs: Sequence[Request], what: str = "a point-to-point exchange",
                peers: Sequence[int] | None = None) -> None:
        """Wait for ``reqs``; ``what`` and ``peers`` (ranks here) name the wait if it stalls."""
        if reqs:
            with self._waiting(what, peers):
                MPI.Request.Waitall(list(reqs))

    def round_trip(self, buf: np.ndarray, tag: int) -> float:
        """One ping-pong of ``buf`` between ranks 0 and 1 (others return at once): seconds."""
        t = time.perf_counter()
        if self.rank in (0, 1):
            other = 1 - self.rank
            first, then = (self.isend, self.irecv) if self.rank == 0 else (self.irecv, self.isend)
            self.waitall([first(buf, other, tag)], "a ping-pong", [other])
            self.waitall([then(buf, other, tag)], "a ping-pong", [other])
        return time.perf_counter() - t

    @staticmethod
    def progress(reqs: Sequence[Request]) -> None:
        """Let MPI move pending messages (large ones advance only inside MPI calls)."""
        if reqs:
            MPI.Request.Testall(list(reqs))

    # -- collectives ------------------------------------------------------------------------
    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        """Element-wise sum, max or min over the ranks, into a new array."""
        out = np.empty_like(a)
        with self._waiting(f"an all-reduce ({op})"):
            self._comm.Allreduce(np.ascontiguousarray(a), out, op=_OPS[op])
        return out

    def iallreduce_sum(self, buf: np.ndarray) -> Request:
        """Start an in-place sum of ``buf`` over the ranks (contiguous; wait before use)."""
        return self._comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def iallgatherv(self, send: np.ndarray, recv: np.ndarray, counts: np.ndarray) -> Request:
        """Start gathering every rank's ``send`` (counts[r] items from rank r) into ``recv``,
        rank after rank, on every rank."""
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        return self._comm.Iallgatherv(np.ascontiguousarray(send),
                                      [recv, counts.astype(np.int64), displs,
                                       dtlib.from_numpy_dtype(recv.dtype)])

    def allgather(self, obj: Any) -> list[Any]:
        with self._waiting("an all-gather"):
            return self._comm.allgather(obj)

    def allreduce_scalar(self, x: float, op: str = "sum") -> float:
        with self._waiting(f"an all-reduce ({op})"):
            return float(self._comm.allreduce(x, op=_OPS[op]))

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        with self._waiting("a gather"):
            return self._comm.gather(obj, root=root)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        with self._waiting(f"a broadcast from rank {self.world_rank(root)}"):
            return self._comm.bcast(obj, root=root)

    def barrier(self) -> None:
        with self._waiting("a barrier"):
            self._comm.Barrier()

    def abort(self, code: int = 1) -> None:
        self._comm.Abort(code)

    def guard(self, fn: Callable[[], Any]) -> Any:  # noqa: ANN401
        """Run a collective body: an error every rank agreed on (``check``/``agree``) is raised
        on every rank; any other exception on one rank, which the others cannot know of,
        prints its cause and aborts the job (with one rank it is simply raised)."""
        try:
            return fn()
        except AgreedError:
            raise
        except BaseException as exc:
            if self.size == 1:
                raise
            if isinstance(exc, KeyboardInterrupt):
                interrupted("spdnn", self.rank)  # one line from rank 0, exit 130
                raise
            if isinstance(exc, SystemExit):
                # A rank leaving in the middle of a collective step would leave the others
                # waiting: the job ends, with the exit code it asked for.
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                sys.stderr.write(f"spdnn: rank {self.rank} exited (code {code}) in a "
                                 f"collective step; ending all {self.size} ranks\n")
            elif isinstance(exc, SpdnnError):
                say_error("spdnn", exc)
                code = exc.exit_code
            else:
                traceback.print_exc()
                sys.stderr.write(f"spdnn: rank {self.rank} failed; aborting all {self.size} "
                                 "ranks\n")
                code = 1
            _abort(self, code)
            raise

    def alltoall_lists(self, lists: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Send lists[p] (int64) to rank p; return what every rank sent here."""
        counts = np.array([len(x) for x in lists], dtype=np.int64)
        recv_counts = np.empty(self.size, dtype=np.int64)
        with self._waiting("an all-to-all"):
            self._comm.Alltoall(counts, recv_counts)
        send = np.concatenate(lists).astype(np.int64) if len(lists) else np.zeros(0, np.int64)
        recv = np.empty(int(recv_counts.sum()), dtype=np.int64)
        sdispl = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
        with self._waiting("an all-to-all"):
            self._comm.Alltoallv([send, counts, sdispl, MPI.INT64_T],
                                 [recv, recv_counts, rdispl, MPI.INT64_T])
        return [recv[rdispl[p]:rdispl[p] + recv_counts[p]] for p in range(self.size)]


_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


class _Waiting:
    """Arms the watchdog for one wait (peers translated to ranks of the job)."""

    def __init__(self, c: Communicator, what: str, peers: Sequence[int] | None) -> None:
        self._c, self._what, self._peers = c, what, peers

    def __enter__(self) -> None:
        c = self._c
        if c._watchdog.timeout is not None:
            peers = range(c.size) if self._peers is None else self._peers
            c._watchdog.arm(self._what, [c.world_rank(p) for p in peers if p != c.rank])

    def __exit__(self, *exc: object) -> None:
        self._c._watchdog.disarm()


# The type of a caller's communicator (what entry points accept besides a Communicator), so
# that annotations elsewhere need not import mpi4py.
MPIComm = MPI.Comm


def world() -> MPI.Comm:
    """The communicator of every rank of the job (the default of every entry point)."""
    return MPI.COMM_WORLD


def world_size() -> int:
    """Ranks in COMM_WORLD, or 0 when MPI is not initialised (no collective call)."""
    return MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 0


def abort_world(code: int) -> None:
    MPI.COMM_WORLD.Abort(code)


def run_collectively(fn: Callable[[Communicator], int], comm: MPI.Comm = MPI.COMM_WORLD,
                     prog: str = "spdnn", timeout: float | None = None) -> int:
    """Run an entry point on every rank.

    A SpdnnError that every rank agreed on (Communicator.check/agree) is printed once, by
    rank 0, and every rank returns 2; one raised on a single rank is printed by that rank and
    aborts the job with code 2. Any other exception prints its traceback and aborts the whole
    job, so no rank is left waiting in a collective. ``timeout``: ``--comm-timeout`` from the
    first wait on (the duplication of ``comm``).
    """
    c = Communicator(comm, timeout=timeout)
    try:
        return fn(c)
    except AgreedError as exc:
        if c.rank == 0:
            say_error(prog, exc)
        return exc.exit_code
    except SpdnnError as exc:  # raised on this rank alone: the others must not wait
        say_error(prog, exc)
        if c.size > 1:
            _abort(c, exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        if c.size > 1:
            interrupted(prog, c.rank)  # one line from rank 0, exit 130
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    except BaseException:
        traceback.print_exc()
        sys.stderr.write(f"{prog}: rank {c.rank} failed; aborting all {c.size} ranks\n")
        sys.stderr.flush()
        if c.size > 1:
            _abort(c, 1)
        return 1


def _abort_from_thread(code: int) -> None:
    """MPI_Abort from the watchdog's thread ends every rank; should it block (the main thread
    holding MPI's lock), the process ends itself and the launcher ends the others."""
    threading.Timer(10.0, os._exit, args=(code,)).start()
    time.sleep(0.5)  # the launcher forwards the watchdog's line first (see _abort)
    MPI.COMM_WORLD.Abort(code)


def _abort(c: Communicator, code: int) -> None:
    # Give the launcher a moment to forward this rank's last stderr lines: an immediate
    # Abort sometimes kills the job before they reach the terminal.
    time.sleep(0.5)
    c.abort(code)
