"""All of spdnn's MPI calls live here; compute code never calls MPI directly.

- ``Communicator``: the few collectives the runtime needs (small all-reduces of per-sample
  values, agreement on errors, gathers for saving), over an explicit communicator.
- ``Exchange``: one layer's point-to-point schedule, built once at start-up from each rank's own
  needs (request lists, never the whole network), with ``expand`` (owned rows -> ghost copies,
  forward) and ``fold`` (ghost partial sums -> owners, backward) over non-blocking messages from
  preallocated contiguous buffers, and a count of every row and byte sent.
- ``run_collectively``: runs an entry point so that an exception on one rank ends every rank.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from .errors import SpdnnError


class AgreedError(SpdnnError):
    """An error every rank raised together (after ``Communicator.agree``)."""


_MPI_DTYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}


def world() -> MPI.Comm:
    return MPI.COMM_WORLD


class Communicator:
    """A thin wrapper over an mpi4py communicator (default: COMM_WORLD)."""

    def __init__(self, comm: MPI.Comm | None = None) -> None:
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    # -- agreement: every rank raises the same error, so none waits in a collective alone --
    def agree(self, error: str | None) -> None:
        """Raise SpdnnError on every rank if any rank reports an error (first by rank)."""
        errors = self.comm.allgather(error)
        for e in errors:
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

    # -- small collectives ------------------------------------------------------------------
    def allreduce_sum(self, a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=MPI.SUM)
        return out

    def allreduce_max(self, a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=MPI.MAX)
        return out

    def allreduce_min(self, a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=MPI.MIN)
        return out

    def sum_scalar(self, x: float) -> float:
        return float(self.comm.allreduce(x, op=MPI.SUM))

    def max_scalar(self, x: float) -> float:
        return float(self.comm.allreduce(x, op=MPI.MAX))

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        return self.comm.gather(obj, root=root)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)

    def alltoall_lists(self, lists: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Send lists[p] (int64) to rank p; return what every rank sent here."""
        counts = np.array([len(x) for x in lists], dtype=np.int64)
        recv_counts = np.empty(self.size, dtype=np.int64)
        self.comm.Alltoall(counts, recv_counts)
        send = np.concatenate(lists).astype(np.int64) if len(lists) else np.zeros(0, np.int64)
        recv = np.empty(int(recv_counts.sum()), dtype=np.int64)
        sdispl = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
        self.comm.Alltoallv([send, counts, sdispl, MPI.INT64_T],
                            [recv, recv_counts, rdispl, MPI.INT64_T])
        return [recv[rdispl[p]:rdispl[p] + recv_counts[p]] for p in range(self.size)]


@dataclass
class Traffic:
    """What one rank sent, per layer (index k-1) and direction: rows, bytes, and the number of
    passes and samples they carried (to compare with the plan's predicted volume)."""

    forward_rows: np.ndarray
    forward_bytes: np.ndarray
    forward_passes: np.ndarray
    forward_samples: np.ndarray
    backward_rows: np.ndarray
    backward_bytes: np.ndarray
    backward_passes: np.ndarray
    backward_samples: np.ndarray

    @staticmethod
    def zeros(n_layers: int) -> Traffic:
        return Traffic(*[np.zeros(n_layers, dtype=np.int64) for _ in range(8)])

    def count_forward(self, i: int, rows: int, batch: int, itemsize: int) -> None:
        self.forward_rows[i] += rows
        self.forward_bytes[i] += rows * batch * itemsize
        self.forward_passes[i] += 1
        self.forward_samples[i] += batch

    def count_backward(self, i: int, rows: int, batch: int, itemsize: int) -> None:
        self.backward_rows[i] += rows
        self.backward_bytes[i] += rows * batch * itemsize
        self.backward_passes[i] += 1
        self.backward_samples[i] += batch

    def total(self, comm: Communicator) -> Traffic:
        """Summed over all ranks (rows and bytes) — passes and samples are per rank."""
        t = Traffic(*[a.copy() for a in self.arrays()])
        for name in ("forward_rows", "forward_bytes", "backward_rows", "backward_bytes"):
            setattr(t, name, comm.allreduce_sum(getattr(self, name)))
        return t

    def arrays(self) -> list[np.ndarray]:
        return [self.forward_rows, self.forward_bytes, self.forward_passes,
                self.forward_samples, self.backward_rows, self.backward_bytes,
                self.backward_passes, self.backward_samples]

    def as_dict(self) -> dict[str, list[int]]:
        names = ("forward_rows", "forward_bytes", "forward_passes", "forward_samples",
                 "backward_rows", "backward_bytes", "backward_passes", "backward_samples")
        return {n: a.tolist() for n, a in zip(names, self.arrays())}


@dataclass
class Exchange:
    """Point-to-point schedule of one layer k: rows of X_{k-1} between owners and users.

    ``send_rows[q]``: local indices (into this rank's owned rows of layer k-1) sent to rank q.
    ``recv_counts[q]``: ghost rows received from rank q; ghosts are stored after the owned rows,
    grouped by source rank in ascending order, so each source fills one contiguous block.
    """

    comm: Communicator
    layer: int
    n_owned: int
    send_peers: list[int]
    send_rows: list[np.ndarray]
    recv_peers: list[int]
    recv_counts: list[int]
    _buffers: dict[tuple[int, np.dtype], np.ndarray] = field(default_factory=dict)

    @property
    def n_ghost(self) -> int:
        return sum(self.recv_counts)

    @property
    def rows_sent(self) -> int:
        return sum(len(r) for r in self.send_rows)

    @staticmethod
    def build(comm: Communicator, layer: int, owned_prev: np.ndarray, owner_prev: np.ndarray,
              ghosts: np.ndarray) -> Exchange:
        """``ghosts``: global rows of layer k-1 this rank needs but does not own, sorted by
        (owner, index). Each rank tells every owner what it needs (request lists)."""
        requests = [ghosts[owner_prev[ghosts] == q] for q in range(comm.size)]
        wanted = comm.alltoall_lists(requests)  # wanted[q]: rows rank q needs from me
        local = np.full(len(owner_prev), -1, dtype=np.int64)
        local[owned_prev] = np.arange(len(owned_prev))
        send_peers, send_rows = [], []
        for q, rows in enumerate(wanted):
            if len(rows):
                if np.any(local[rows] < 0):
                    raise SpdnnError(f"layer {layer}: rank {q} asked for rows not owned here")
                send_peers.append(q)
                send_rows.append(local[rows])
        recv_peers = [q for q in range(comm.size) if len(requests[q])]
        recv_counts = [len(requests[q]) for q in recv_peers]
        return Exchange(comm, layer, len(owned_prev), send_peers, send_rows, recv_peers,
                        recv_counts)

    def _buffer(self, rows: int, batch: int, dtype: np.dtype, slot: int) -> np.ndarray:
        """A preallocated contiguous buffer, grown only when a larger batch appears."""
        key = (slot, np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < rows * batch:
            buf = np.empty(max(rows * batch, 1), dtype=dtype)
            self._buffers[key] = buf
        return buf[: rows * batch].reshape(rows, batch)

    # -- forward: owned rows -> ghost copies ------------------------------------------------
    def start_expand(self, x: np.ndarray) -> list[MPI.Request]:
        """Post receives into x's ghost block and sends of the owned rows others need.

        ``x`` is (n_owned + n_ghost) x B, C-contiguous; returns the requests to wait on.
        """
        batch, dt = x.shape[1], _MPI_DTYPES[x.dtype]
        reqs = []
        start = self.n_owned
        for q, count in zip(self.recv_peers, self.recv_counts):
            reqs.append(self.comm.comm.Irecv([x[start:start + count], dt], source=q,
                                             tag=2 * self.layer))
            start += count
        send = self._buffer(self.rows_sent, batch, x.dtype, 0)
        start = 0
        for q, rows in zip(self.send_peers, self.send_rows):
            block = send[start:start + len(rows)]
            np.take(x, rows, axis=0, out=block)
            reqs.append(self.comm.comm.Isend([block, dt], dest=q, tag=2 * self.layer))
            start += len(rows)
        return reqs

    # -- backward: ghost partial sums -> owners ---------------------------------------------
    def start_fold(self, ghost_partials: np.ndarray) -> tuple[list[MPI.Request], np.ndarray]:
        """Send ghost partials (n_ghost x B, grouped by owner) back; post receives of the
        partials other ranks computed for my rows. Returns (requests, receive buffer)."""
        batch, dt = ghost_partials.shape[1], _MPI_DTYPES[ghost_partials.dtype]
        recv = self._buffer(self.rows_sent, batch, ghost_partials.dtype, 1)
        reqs = []
        start = 0
        for q, rows in zip(self.send_peers, self.send_rows):
            reqs.append(self.comm.comm.Irecv([recv[start:start + len(rows)], dt], source=q,
                                             tag=2 * self.layer + 1))
            start += len(rows)
        start = 0
        for q, count in zip(self.recv_peers, self.recv_counts):
            reqs.append(self.comm.comm.Isend([ghost_partials[start:start + count], dt],
                                             dest=q, tag=2 * self.layer + 1))
            start += count
        return reqs, recv

    def finish_fold(self, reqs: list[MPI.Request], recv: np.ndarray, g: np.ndarray) -> None:
        """Wait, then add the received partials into the owned rows of ``g``."""
        MPI.Request.Waitall(reqs)
        start = 0
        for rows in self.send_rows:
            # Rows are unique within one peer's block, so fancy-index += adds each once.
            g[rows] += recv[start:start + len(rows)]
            start += len(rows)


def wait(reqs: list[MPI.Request]) -> None:
    MPI.Request.Waitall(reqs)


def progress(reqs: list[MPI.Request]) -> None:
    """Let MPI move pending messages (large ones advance only inside MPI calls)."""
    if reqs:
        MPI.Request.Testall(reqs)


def run_collectively(fn: Callable[[Communicator], int], comm: MPI.Comm | None = None,
                     prog: str = "spdnn") -> int:
    """Run an entry point on every rank.

    A SpdnnError that every rank agreed on (Communicator.check/agree) is printed once, by
    rank 0, and every rank returns 2; one raised on a single rank is printed by that rank and
    aborts the job with code 2. Any other exception prints its traceback and aborts the whole
    job, so no rank is left waiting in a collective.
    """
    c = Communicator(comm)
    try:
        return fn(c)
    except AgreedError as exc:
        if c.rank == 0:
            print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except SpdnnError as exc:  # raised on this rank alone: the others must not wait
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        if c.size > 1:
            _abort(c, exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        if c.size > 1:
            c.abort(130)
        return 130
    except BaseException:
        traceback.print_exc()
        sys.stderr.write(f"{prog}: rank {c.rank} failed; aborting all {c.size} ranks\n")
        sys.stderr.flush()
        if c.size > 1:
            _abort(c, 1)
        return 1


def _abort(c: Communicator, code: int) -> None:
    # Give the launcher a moment to forward this rank's last stderr lines: an immediate
    # Abort sometimes kills the job before they reach the terminal.
    time.sleep(0.5)
    c.abort(code)
