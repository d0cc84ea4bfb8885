"""Per-layer exchange schedules: which rows of X_{k-1} go from their owner to the ranks that use
them (``expand``, forward) and which partial sums come back (``fold``, backward), with the
packing into contiguous buffers and the count of every row and byte sent.

A schedule is built once at start-up from each rank's own needs (request lists), never from the
whole network. Messages go over the runtime's private communicator with tag 2k (expand of layer
k) or 2k + 1 (fold of layer k): MPI keeps messages of one (source, tag) in order, and no two
exchanges with the same tag are in flight at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .comm import Communicator, Request
from .errors import SpdnnError

_FIELDS = ("forward_rows", "forward_bytes", "forward_passes", "forward_samples",
           "backward_rows", "backward_bytes", "backward_passes", "backward_samples")


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
    grad_values: np.ndarray  # values this rank put into the gradient sums over replicas

    @staticmethod
    def zeros(n_layers: int) -> Traffic:
        return Traffic(*[np.zeros(n_layers, dtype=np.int64) for _ in range(len(_FIELDS) + 1)])

    def count(self, direction: str, i: int, rows: int, batch: int, itemsize: int) -> None:
        getattr(self, f"{direction}_rows")[i] += rows
        getattr(self, f"{direction}_bytes")[i] += rows * batch * itemsize
        getattr(self, f"{direction}_passes")[i] += 1
        getattr(self, f"{direction}_samples")[i] += batch

    @property
    def bytes_sent(self) -> int:
        return int(self.forward_bytes.sum() + self.backward_bytes.sum())

    def total(self, comm: Communicator, data: Communicator | None = None) -> Traffic:
        """Rows, bytes and gradient-sum values summed over all ranks (``comm``); passes and
        samples summed over the replicas (``data``: the ranks of one part)."""
        t = Traffic(*[getattr(self, n).copy() for n in (*_FIELDS, "grad_values")])
        for name in ("forward_rows", "forward_bytes", "backward_rows", "backward_bytes",
                     "grad_values"):
            setattr(t, name, comm.allreduce(getattr(self, name)))
        if data is not None:
            for name in ("forward_passes", "forward_samples", "backward_passes",
                         "backward_samples"):
                setattr(t, name, data.allreduce(getattr(self, name)))
        return t


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

    def start_expand(self, x: np.ndarray) -> list[Request]:
        """Forward: post receives into x's ghost block and sends of the owned rows others
        need. ``x`` is (n_owned + n_ghost) x B, C-contiguous; returns the requests."""
        reqs = []
        start = self.n_owned
        tag = 2 * self.layer
        for q, count in zip(self.recv_peers, self.recv_counts):
            reqs.append(self.comm.irecv(x[start:start + count], q, tag))
            start += count
        send = self._buffer(self.rows_sent, x.shape[1], x.dtype, 0)
        start = 0
        for q, rows in zip(self.send_peers, self.send_rows):
            block = send[start:start + len(rows)]
            np.take(x, rows, axis=0, out=block, mode="clip")  # "raise" buffers out
            reqs.append(self.comm.isend(block, q, tag))
            start += len(rows)
        return reqs

    def start_fold(self, ghost_partials: np.ndarray) -> tuple[list[Request], np.ndarray]:
        """Backward: send ghost partials (n_ghost x B, grouped by owner) back; post receives
        of the partials other ranks computed for my rows. Returns (requests, receive buffer)."""
        recv = self._buffer(self.rows_sent, ghost_partials.shape[1], ghost_partials.dtype, 1)
        reqs = []
        tag = 2 * self.layer + 1
        start = 0
        for q, rows in zip(self.send_peers, self.send_rows):
            reqs.append(self.comm.irecv(recv[start:start + len(rows)], q, tag))
            start += len(rows)
        start = 0
        for q, count in zip(self.recv_peers, self.recv_counts):
            reqs.append(self.comm.isend(ghost_partials[start:start + count], q, tag))
            start += count
        return reqs, recv

    def finish_fold(self, reqs: list[Request], recv: np.ndarray, g: np.ndarray) -> None:
        """Wait, then add the received partials into the owned rows of ``g``."""
        self.comm.waitall(reqs)
        start = 0
        for rows in self.send_rows:
            # Rows are unique within one peer's block, so fancy-index += adds each once.
            g[rows] += recv[start:start + len(rows)]
            start += len(rows)
