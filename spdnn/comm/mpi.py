"""Every MPI call of spdnn lives here; compute code never calls MPI directly (one concern:
the rule that keeps message passing auditable in one place, as Heat does).

- ``Communicator``: a private duplicate of the caller's communicator (so spdnn's messages never
  match anyone else's), with ``split``, non-blocking point-to-point, the few collectives the
  runtime needs, and agreement on errors.
- (``spdnn.comm.collective`` holds the policy that ends every rank when one fails.)
- ``world_size`` / ``abort_world``: for the test plugin, which must abort without a collective.
- Importing this module starts MPI, without the GIL (``_start``: Ctrl-C must end a rank whose
  MPI_Init waits for peers).

Every wait is watched: with a timeout set (``watch``), a wait that lasts longer ends the whole
job with one line naming the rank, its host, the peers and what it waited for (exit code 3).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import mpi4py
import numpy as np

from spdnn.comm import object_buffers
from spdnn.comm.watchdog import TIMEOUT_EXIT, Waiting, Watchdog
from spdnn.errors import SpdnnError

_CALLERS_RC = (mpi4py.rc.initialize, mpi4py.rc.finalize)
if "mpi4py.MPI" not in sys.modules:  # this module starts MPI, without the GIL (``_start``)
    mpi4py.rc.initialize, mpi4py.rc.finalize = False, True
from mpi4py import MPI  # noqa: E402
from mpi4py.util import dtlib  # noqa: E402

mpi4py.rc.initialize, mpi4py.rc.finalize = _CALLERS_RC  # read at mpi4py.MPI's import only

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
        self._splits: list[Communicator] = []  # freed with release_splits (or free)
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

    def _waiting(self, what: str, peers: Sequence[int] | None = None) -> Waiting:
        return Waiting(self._watchdog, what, lambda: [
            self.world_rank(p) for p in (range(self.size) if peers is None else peers)
            if p != self.rank])

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
        out = Communicator(sub, duplicate=False, _watchdog=self._watchdog)
        self._splits.append(out)
        return out

    @property
    def split_count(self) -> int:
        """How many communicators have been split from this one (``release_splits``' mark)."""
        return len(self._splits)

    def release_splits(self, since: int = 0) -> None:
        """Free the communicators split from this one after the first ``since`` (a job's
        grid), and theirs: MPI has a few thousand per process, and a script may run thousands
        of jobs."""
        for sub in self._splits[since:]:
            sub.free()
        del self._splits[since:]

    def free(self) -> None:
        self.release_splits()
        if self._comm not in (MPI.COMM_NULL, MPI.COMM_SELF, MPI.COMM_WORLD):
            self._comm.Free()
            self._comm = MPI.COMM_NULL

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
    def progress(reqs: Sequence[Request]) -> bool:
        """Let MPI move pending messages (large ones advance only inside MPI calls); True
        when all of them have completed."""
        return bool(reqs) and bool(MPI.Request.Testall(list(reqs)))

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
        displs = _displacements(counts)
        return self._comm.Iallgatherv(np.ascontiguousarray(send),
                                      [recv, counts.astype(np.int64), displs,
                                       dtlib.from_numpy_dtype(recv.dtype)])

    # Objects travel pickled through buffer collectives (spdnn.comm.object_buffers says why): a
    # short pickle in one fixed-size message, a longer one in a second.
    def allgather(self, obj: Any) -> list[Any]:
        data = object_buffers.dumps(obj)
        slots = np.empty((self.size, object_buffers.SLOT), dtype=np.uint8)
        with self._waiting("an all-gather"):
            self._comm.Allgather(object_buffers.slot(data), slots)
        counts = object_buffers.lengths(slots)
        if counts.max() <= object_buffers.INLINE:
            return object_buffers.inline(slots)
        recv = np.empty(int(counts.sum()), dtype=np.uint8)
        with self._waiting("an all-gather"):
            self._comm.Allgatherv(data, [recv, counts, _displacements(counts), MPI.BYTE])
        return object_buffers.split(recv, counts)

    def allgather_rows(self, block: np.ndarray) -> np.ndarray:
        """Every rank's rows of the 2-D ``block`` (the same width on every rank), rank after
        rank, on every rank."""
        block = np.ascontiguousarray(block)
        width = block.shape[1]
        rows = np.array(self.allgather(int(block.shape[0])), dtype=np.int64)
        out = np.empty((int(rows.sum()), width), dtype=block.dtype)
        counts = rows * width
        with self._waiting("an all-gather of rows"):
            self._comm.Allgatherv(block, [out, counts, _displacements(counts),
                                          dtlib.from_numpy_dtype(block.dtype)])
        return out

    def allreduce_scalar(self, x: float, op: str = "sum") -> float:
        out = np.empty(1, dtype=np.float64)
        with self._waiting(f"an all-reduce ({op})"):
            self._comm.Allreduce(np.array([x], dtype=np.float64), out, op=_OPS[op])
        return float(out[0])

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        data = object_buffers.dumps(obj)
        counts = np.empty(self.size, dtype=np.int64)
        with self._waiting("a gather"):
            self._comm.Gather(np.array([len(data)], dtype=np.int64), counts, root=root)
        if self.rank != root:
            with self._waiting("a gather"):
                self._comm.Gatherv(data, None, root=root)
            return None
        recv = np.empty(int(counts.sum()), dtype=np.uint8)
        with self._waiting("a gather"):
            self._comm.Gatherv(data, [recv, counts, _displacements(counts), MPI.BYTE],
                               root=root)
        return object_buffers.split(recv, counts)

    def bcast(self, obj: Any, root: int = 0) -> Any:  # noqa: ANN401
        data = object_buffers.dumps(obj) if self.rank == root else None
        head = object_buffers.slot(data)
        what = f"a broadcast from rank {self.world_rank(root)}"
        with self._waiting(what):
            self._comm.Bcast(head, root=root)
        n = int(object_buffers.lengths(head)[0])
        if n <= object_buffers.INLINE:
            return object_buffers.loads(head[8:8 + n])
        # The root's buffer too must be writable (a pickle's bytes are not).
        buf = data.copy() if data is not None else np.empty(n, dtype=np.uint8)
        with self._waiting(what):
            self._comm.Bcast(buf, root=root)
        return object_buffers.loads(buf)

    def barrier(self) -> None:
        with self._waiting("a barrier"):
            self._comm.Barrier()

    def finalize(self) -> None:
        """MPI_Finalize, watched as every wait is: a link frozen after the job's last message
        held it for good. Called without the GIL, so the watchdog's thread can end the job:
        by ending this process (MPI_Abort fails once MPI_Finalize has begun; the launcher ends
        the others), its output flushed first."""
        sys.stdout.flush()
        sys.stderr.flush()
        self.before_timeout_abort(lambda: os._exit(TIMEOUT_EXIT))
        with self._waiting("MPI_Finalize"):
            _call_without_gil("MPI_Finalize", MPI.Finalize)

    def abort(self, code: int = 1) -> None:
        self._comm.Abort(code)

    def alltoall_lists(self, lists: Sequence[np.ndarray], dtype: Any = np.int64  # noqa: ANN401
                       ) -> list[np.ndarray]:
        """Send lists[p] (1-D, ``dtype`` on every rank) to rank p; return what every rank
        sent here."""
        dtype = np.dtype(dtype)
        counts = np.array([len(x) for x in lists], dtype=np.int64)
        recv_counts = np.empty(self.size, dtype=np.int64)
        with self._waiting("an all-to-all"):
            self._comm.Alltoall(counts, recv_counts)
        send = np.concatenate(lists).astype(dtype) if len(lists) else np.zeros(0, dtype)
        recv = np.empty(int(recv_counts.sum()), dtype=dtype)
        size = dtype.itemsize  # sent as bytes: one call for every type
        sdispl, rdispl = _displacements(counts), _displacements(recv_counts)
        with self._waiting("an all-to-all"):
            self._comm.Alltoallv([send.view(np.uint8), counts * size, sdispl * size, MPI.BYTE],
                                 [recv.view(np.uint8), recv_counts * size, rdispl * size,
                                  MPI.BYTE])
        return [recv[rdispl[p]:rdispl[p] + recv_counts[p]] for p in range(self.size)]


_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


def _displacements(counts: np.ndarray) -> np.ndarray:
    """Where each rank's part starts in a buffer of parts of ``counts`` items, rank after rank."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


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


def _abort_from_thread(code: int) -> None:
    """MPI_Abort from the watchdog's thread ends every rank; should it block (the main thread
    holding MPI's lock), the process ends itself and the launcher ends the others."""
    threading.Timer(10.0, os._exit, args=(code,)).start()
    time.sleep(0.5)  # the launcher forwards the watchdog's line first (see spdnn.comm.collective)
    MPI.COMM_WORLD.Abort(code)


def _loaded_libmpi() -> ctypes.CDLL | None:
    """The MPI library mpi4py loaded (from this process's memory map: Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = dict.fromkeys(line.split()[-1] for line in maps if "/libmpi" in line)
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        if hasattr(lib, "MPI_Init_thread"):
            return lib
    return None


def _call_without_gil(name: str, fallback: Callable[[], Any], *args: Any) -> None:  # noqa: ANN401
    """MPI's C function ``name`` through ctypes, which releases the GIL; elsewhere than Linux,
    mpi4py's ``fallback``."""
    lib = _loaded_libmpi()
    if lib is None:
        fallback()
    elif getattr(lib, name)(*args) != 0:
        raise RuntimeError(f"{name} failed")


def _start() -> None:
    """MPI_Init_thread without the GIL (a ctypes call): it spins for peers that a Ctrl-C may
    have ended, and under mpi4py's call, which holds the GIL, spdnn.comm.interrupt's watcher could
    not run to end the rank with its line. Elsewhere than Linux, mpi4py's call, with Ctrl-C
    at its default action (``starting_mpi``)."""
    def with_mpi4py() -> None:
        from spdnn.comm.interrupt import starting_mpi

        with starting_mpi():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)

    from spdnn.comm.processes import file_size_limit_lifted

    with file_size_limit_lifted():  # MPI's shared memory is files
        _call_without_gil("MPI_Init_thread", with_mpi4py, None, None, MPI.THREAD_MULTIPLE,
                          ctypes.byref(ctypes.c_int(0)))
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):  # errors raise, as under mpi4py's own start
        comm.Set_errhandler(MPI.ERRORS_RETURN)


if not MPI.Is_initialized():
    _start()
