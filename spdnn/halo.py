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
from .encoding import decode_expand, encode_expand, expand_capacity, fold_packed, slope_mask
from .errors import SpdnnError

_FIELDS = ("forward_rows", "forward_bytes", "forward_passes", "forward_samples",
           "backward_rows", "backward_bytes", "backward_passes", "backward_samples",
           "forward_sent", "backward_sent")
_SUMMED = ("forward_rows", "forward_bytes", "backward_rows", "backward_bytes", "forward_sent",
           "backward_sent", "grad_values")


@dataclass
class Traffic:
    """What one rank sent, per layer (index k-1) and direction: rows, their bytes as dense
    rows, and the number of passes and samples they carried (to compare with the plan's
    predicted volume); and the bytes actually sent (``*_sent``: payload and headers of the
    chosen encodings, at most the dense bytes plus a header per message)."""

    forward_rows: np.ndarray
    forward_bytes: np.ndarray
    forward_passes: np.ndarray
    forward_samples: np.ndarray
    backward_rows: np.ndarray
    backward_bytes: np.ndarray
    backward_passes: np.ndarray
    backward_samples: np.ndarray
    forward_sent: np.ndarray
    backward_sent: np.ndarray
    grad_values: np.ndarray  # values this rank put into the gradient sums over replicas

    @staticmethod
    def zeros(n_layers: int) -> Traffic:
        return Traffic(*[np.zeros(n_layers, dtype=np.int64) for _ in range(len(_FIELDS) + 1)])

    def count(self, direction: str, i: int, rows: int, batch: int, itemsize: int,
              sent: int) -> None:
        getattr(self, f"{direction}_rows")[i] += rows
        getattr(self, f"{direction}_bytes")[i] += rows * batch * itemsize
        getattr(self, f"{direction}_passes")[i] += 1
        getattr(self, f"{direction}_samples")[i] += batch
        getattr(self, f"{direction}_sent")[i] += sent

    @property
    def bytes_sent(self) -> int:
        return int(self.forward_sent.sum() + self.backward_sent.sum())

    def total(self, comm: Communicator, data: Communicator | None = None) -> Traffic:
        """Rows, bytes and gradient-sum values summed over all ranks (``comm``); passes and
        samples summed over the replicas (``data``: the ranks of one part)."""
        t = Traffic(*[getattr(self, n).copy() for n in (*_FIELDS, "grad_values")])
        for name in _SUMMED:
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
    ``mode`` (``spdnn.encoding.MODES``): how blocks travel; ``dense`` sends rows as they are
    (into place, no header), ``auto`` and ``sparse`` encode each message (spdnn.encoding);
    ``cap`` is the activation cap, for the fold's mask.
    """

    comm: Communicator
    layer: int
    n_owned: int
    send_peers: list[int]
    send_rows: list[np.ndarray]
    recv_peers: list[int]
    recv_counts: list[int]
    mode: str = "dense"
    cap: float | None = None
    _buffers: dict[tuple[int, np.dtype], np.ndarray] = field(default_factory=dict)
    _unpack: list = field(default_factory=list)  # (block, mask, values) of a packed fold

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

    def _bytes(self, n: int, slot: int) -> np.ndarray:
        return self._buffer(1, n, np.uint8, slot)[0]

    def start_expand(self, x: np.ndarray) -> tuple[list[Request], int]:
        """Forward: post receives of the ghost rows and sends of the owned rows others need.
        ``x`` is (n_owned + n_ghost) x B, C-contiguous. Returns the requests and the bytes
        sent; ``finish_expand`` completes the ghost rows."""
        reqs = []
        batch, tag, dense = x.shape[1], 2 * self.layer, self.mode == "dense"
        caps = [expand_capacity(c, batch, x.itemsize) for c in self.recv_counts]
        stage = None if dense else self._bytes(sum(caps), 2)
        start, offset = self.n_owned, 0
        for q, count, cap in zip(self.recv_peers, self.recv_counts, caps):
            target = x[start:start + count] if dense else stage[offset:offset + cap]
            reqs.append(self.comm.irecv(target, q, tag))
            start, offset = start + count, offset + cap
        send = self._buffer(self.rows_sent, batch, x.dtype, 0)
        out = None if dense else self._bytes(
            sum(expand_capacity(len(r), batch, x.itemsize) for r in self.send_rows), 3)
        start, offset, sent = 0, 0, 0
        for q, rows in zip(self.send_peers, self.send_rows):
            block = send[start:start + len(rows)]
            np.take(x, rows, axis=0, out=block, mode="clip")  # "raise" buffers out
            if dense:
                reqs.append(self.comm.isend(block, q, tag))
                sent += block.nbytes
            else:
                used = encode_expand(block, self.mode, out[offset:])
                reqs.append(self.comm.isend(out[offset:offset + used], q, tag))
                sent += used
                offset += expand_capacity(len(rows), batch, x.itemsize)
            start += len(rows)
        return reqs, sent

    def finish_expand(self, reqs: list[Request], x: np.ndarray) -> None:
        """Wait, then (encoded modes) rebuild the ghost rows of ``x`` from the messages."""
        self.comm.waitall(reqs)
        if self.mode == "dense":
            return
        batch = x.shape[1]
        stage = self._bytes(sum(expand_capacity(c, batch, x.itemsize)
                                for c in self.recv_counts), 2)
        start, offset = self.n_owned, 0
        for q, count in zip(self.recv_peers, self.recv_counts):
            decode_expand(stage[offset:], x[start:start + count],
                          f"layer {self.layer}, rows from rank {q}")
            start += count
            offset += expand_capacity(count, batch, x.itemsize)

    def start_fold(self, ghost_partials: np.ndarray, x: np.ndarray
                   ) -> tuple[list[Request], np.ndarray, int]:
        """Backward: send ghost partials (n_ghost x B, grouped by owner) back; post receives
        of the partials other ranks computed for my rows. ``x`` is the layer's input buffer
        (its activations give both ends the same mask in the encoded modes). Returns
        (requests, receive buffer, bytes sent)."""
        batch, dtype = ghost_partials.shape[1], ghost_partials.dtype
        recv = self._buffer(self.rows_sent, batch, dtype, 1)
        reqs: list[Request] = []
        self._unpack = []
        tag = 2 * self.layer + 1
        dense = self.mode == "dense"
        values = None if dense else self._buffer(1, self.rows_sent * batch, dtype, 4)[0]
        start = offset = 0
        for q, rows in zip(self.send_peers, self.send_rows):
            block = recv[start:start + len(rows)]
            mask = None if dense else slope_mask(x[rows], self.cap)
            if mask is not None and fold_packed(mask, self.mode):
                count = int(np.count_nonzero(mask))
                reqs.append(self.comm.irecv(values[offset:offset + count], q, tag))
                self._unpack.append((block, mask, values[offset:offset + count]))
                offset += count
            else:
                reqs.append(self.comm.irecv(block, q, tag))
            start += len(rows)
        out = None if dense else self._buffer(1, self.n_ghost * batch, dtype, 5)[0]
        start = offset = sent = 0
        for q, count in zip(self.recv_peers, self.recv_counts):
            block = ghost_partials[start:start + count]
            mask = None if dense else slope_mask(
                x[self.n_owned + start:self.n_owned + start + count], self.cap)
            if mask is not None and fold_packed(mask, self.mode):
                n = int(np.count_nonzero(mask))
                np.compress(mask.reshape(-1), block.reshape(-1), out=out[offset:offset + n])
                reqs.append(self.comm.isend(out[offset:offset + n], q, tag))
                sent += n * block.itemsize
                offset += n
            else:
                reqs.append(self.comm.isend(block, q, tag))
                sent += block.nbytes
            start += count
        return reqs, recv, sent

    def finish_fold(self, reqs: list[Request], recv: np.ndarray, g: np.ndarray) -> None:
        """Wait, then add the received partials into the owned rows of ``g`` (packed ones
        unpacked under their mask: the entries left out are exactly those the activation
        slope zeroes)."""
        self.comm.waitall(reqs)
        for block, mask, values in self._unpack:
            block[...] = 0
            block[mask] = values
        self._unpack = []
        start = 0
        for rows in self.send_rows:
            # Rows are unique within one peer's block, so fancy-index += adds each once.
            g[rows] += recv[start:start + len(rows)]
            start += len(rows)
