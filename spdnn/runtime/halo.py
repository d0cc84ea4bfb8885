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

from spdnn.comm.mpi import Communicator, Request
from spdnn.errors import SpdnnError
from spdnn.kernels.encoding import (
    add_rows,
    decode_blocks,
    encode_blocks,
    expand_capacity,
    fold_add,
    fold_pack,
    fold_packed,
    slope_count,
)
from spdnn.model.choices import Exchange as ExchangeMode

_FIELDS = ("forward_rows", "forward_bytes", "forward_passes", "forward_samples",
           "backward_rows", "backward_bytes", "backward_passes", "backward_samples",
           "forward_sent", "backward_sent", "forward_messages", "backward_messages")
# The gradient sums over replicas: values put in (indices counted as values when compressed),
# their bytes, and (compressed layers) the values selected of those considered.
_GRAD = ("grad_values", "grad_bytes", "grad_selected", "grad_considered")
_SUMMED = ("forward_rows", "forward_bytes", "backward_rows", "backward_bytes", "forward_sent",
           "backward_sent", "forward_messages", "backward_messages", *_GRAD)


@dataclass(kw_only=True)
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
    forward_messages: np.ndarray  # messages sent (one per peer and pass)
    backward_messages: np.ndarray
    grad_values: np.ndarray  # values this rank put into the gradient sums over replicas
    grad_bytes: np.ndarray
    grad_selected: np.ndarray
    grad_considered: np.ndarray

    @staticmethod
    def zeros(n_layers: int) -> Traffic:
        return Traffic(**{n: np.zeros(n_layers, dtype=np.int64) for n in (*_FIELDS, *_GRAD)})

    def count(self, direction: str, i: int, rows: int, batch: int, itemsize: int,
              sent: int, messages: int) -> None:
        getattr(self, f"{direction}_rows")[i] += rows
        getattr(self, f"{direction}_bytes")[i] += rows * batch * itemsize
        getattr(self, f"{direction}_passes")[i] += 1
        getattr(self, f"{direction}_samples")[i] += batch
        getattr(self, f"{direction}_sent")[i] += sent
        getattr(self, f"{direction}_messages")[i] += messages

    @property
    def bytes_sent(self) -> int:
        return int(self.forward_sent.sum() + self.backward_sent.sum())

    def total(self, comm: Communicator, data: Communicator | None = None) -> Traffic:
        """Rows, bytes and gradient-sum values summed over all ranks (``comm``); passes and
        samples summed over the replicas (``data``: the ranks of one part)."""
        t = Traffic(**{n: getattr(self, n).copy() for n in (*_FIELDS, *_GRAD)})
        for name in _SUMMED:
            setattr(t, name, comm.allreduce(getattr(self, name)))
        if data is not None:
            for name in ("forward_passes", "forward_samples", "backward_passes",
                         "backward_samples"):
                setattr(t, name, data.allreduce(getattr(self, name)))
        return t


# The message buffers: one of bytes for the rows a rank sends forward (the dense or encoded
# sends; backward, the partial sums it receives for them) and one for its ghost rows (the
# encoded receives forward; backward, the packed partial sums it sends for them). A pass's
# exchanges finish before the next pass starts, so both directions share them: the peak is
# the larger direction's, not their sum.
SENT_SIDE, GHOST_SIDE = 0, 1
_NO_BYTES = np.zeros(0, np.uint8)


@dataclass(kw_only=True)
class Exchange:
    """Point-to-point schedule of one layer k: rows of X_{k-1} between owners and users.

    ``send_rows[q]``: local indices (into this rank's owned rows of layer k-1) sent to rank q.
    ``recv_counts[q]``: ghost rows received from rank q; ghosts are stored after the owned rows,
    grouped by source rank in ascending order, so each source fills one contiguous block.
    ``mode`` (``spdnn.kernels.encoding.MODES``): how blocks travel; ``dense`` sends rows as they are
    (into place, no header), ``auto`` and ``sparse`` encode each message (spdnn.kernels.encoding);
    ``cap`` is the activation cap, for the fold's mask; ``masked``: the inputs are ReLU's,
    so the fold may leave out the entries whose slope is zero (other activations: dense).
    """

    comm: Communicator
    layer: int
    n_owned: int
    send_peers: list[int]
    send_rows: list[np.ndarray]
    recv_peers: list[int]
    recv_counts: list[int]
    mode: ExchangeMode = "dense"
    cap: float | None = None
    masked: bool = True
    _buffers: dict = field(default_factory=dict)  # slot (SENT_SIDE, GHOST_SIDE) -> bytes
    _unpack: list = field(default_factory=list)  # (rows, received block or packed values)
    _ghosts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _layout_key: tuple[int, int] = (0, 0)
    _out_starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    _in_starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    _out_list: list[int] = field(default_factory=lambda: [0])
    _in_list: list[int] = field(default_factory=lambda: [0])
    _stage: np.ndarray = field(default_factory=lambda: _NO_BYTES)  # expand's receives

    def __post_init__(self) -> None:
        # The send rows of all peers in one array, for the one-call encoders.
        self._send_all = np.concatenate([np.zeros(0, np.int64), *self.send_rows]).astype(
            np.int64)
        self._send_starts = np.cumsum([0] + [len(r) for r in self.send_rows], dtype=np.int64)
        # Each peer's rows as a view of that array: one copy of the send lists, not two (a
        # block plan sends about every row: 8 bytes a row of every layer).
        self.send_rows = [self._send_all[a:b] for a, b in
                          zip(self._send_starts[:-1], self._send_starts[1:])]
        self._recv_counts = np.array(self.recv_counts, np.int64)

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
        return Exchange(comm=comm, layer=layer, n_owned=len(owned_prev), send_peers=send_peers,
                        send_rows=send_rows, recv_peers=recv_peers,
                        recv_counts=recv_counts)

    def share_buffers(self, pool: dict) -> None:
        """Use ``pool`` for the message buffers, shared with other exchanges that never run at
        the same time (one pass's layers): fewer fresh pages to fault in, less memory."""
        self._buffers = pool

    def index_nbytes(self) -> dict[str, int]:
        """Bytes of the schedule's index arrays by row: the send lists (held from the start)
        and the ghost rows' index (built by the first fold: training state). The per-peer
        arrays (a few entries) are not counted."""
        return {"weights": int(self._send_all.nbytes), "training": int(self._ghosts.nbytes)}

    def pool_nbytes(self) -> int:
        """Bytes of the message buffers (the pool ``share_buffers`` gave, or this layer's)."""
        return int(sum(b.nbytes for b in self._buffers.values()))

    def _buffer(self, rows: int, batch: int, dtype: np.dtype, slot: int) -> np.ndarray:
        """A rows x batch block of ``dtype`` over the bytes of ``slot``."""
        dtype = np.dtype(dtype)
        n = rows * batch
        return self._bytes(n * dtype.itemsize, slot).view(dtype).reshape(rows, batch)

    def _bytes(self, n: int, slot: int) -> np.ndarray:
        """The first ``n`` bytes of ``slot``'s buffer, grown only when a larger batch needs
        more (its start stays 8-byte aligned for any value type's view)."""
        buf = self._buffers.get(slot)
        if buf is None or len(buf) < n:
            buf = self._buffers[slot] = np.empty(max(n, 1), np.uint8)
        return buf[:n]

    def _layout(self, batch: int, itemsize: int) -> None:
        """Byte offsets of each peer's slot in the encoded modes' send and receive buffers
        (once per batch size; plain ints, as inference meets each layer once)."""
        if self._layout_key == (batch, itemsize):
            return
        self._layout_key = (batch, itemsize)
        for name, counts in (("_out", [len(r) for r in self.send_rows]),
                             ("_in", self.recv_counts)):
            starts = [0]
            for c in counts:
                starts.append(starts[-1] + expand_capacity(c, batch, itemsize))
            setattr(self, name + "_list", starts)
            setattr(self, name + "_starts", np.array(starts, np.int64))

    def stage_nbytes(self, batch: int, itemsize: int) -> int:
        """Bytes the encoded messages of the ghost rows take on arrival (0: none staged)."""
        if self.mode == "dense" or not self.recv_peers:
            return 0
        self._layout(batch, itemsize)
        return self._in_list[-1]

    def start_expand(self, x: np.ndarray, stage: np.ndarray | None = None
                     ) -> tuple[list[Request], int]:
        """Forward: post receives of the ghost rows and sends of the owned rows others need.
        ``x`` is (n_owned + n_ghost) x B, C-contiguous; ``stage``: bytes (``stage_nbytes``)
        the caller lends for the encoded arrivals, instead of the pool's. Returns the requests
        and the bytes sent; ``finish_expand`` completes the ghost rows."""
        if not self.recv_peers and not self.send_peers:  # this layer's rows stay here
            return [], 0
        reqs = []
        batch, tag = x.shape[1], 2 * self.layer
        if self.mode == "dense":
            start = self.n_owned
            for q, count in zip(self.recv_peers, self.recv_counts):
                reqs.append(self.comm.irecv(x[start:start + count], q, tag))
                start += count
            send = self._buffer(self.rows_sent, batch, x.dtype, SENT_SIDE)
            start = 0
            for q, rows in zip(self.send_peers, self.send_rows):
                block = send[start:start + len(rows)]
                np.take(x, rows, axis=0, out=block, mode="clip")  # "raise" buffers out
                reqs.append(self.comm.isend(block, q, tag))
                start += len(rows)
            return reqs, send.nbytes
        self._layout(batch, x.itemsize)
        starts = self._in_list
        stage = self._stage = stage[:starts[-1]] \
            if stage is not None and len(stage) >= starts[-1] else \
            self._bytes(starts[-1], GHOST_SIDE)
        for i, q in enumerate(self.recv_peers):
            reqs.append(self.comm.irecv(stage[starts[i]:starts[i + 1]], q, tag))
        starts = self._out_list
        out = self._bytes(starts[-1], SENT_SIDE)
        # Every message gathered straight into its encoded form, in one call.
        used = encode_blocks(x, self._send_all, self._send_starts, self.mode, self.cap, out,
                             self._out_starts).tolist()
        for i, q in enumerate(self.send_peers):
            reqs.append(self.comm.isend(out[starts[i]:starts[i] + used[i]], q, tag))
        return reqs, sum(used)

    def finish_expand(self, reqs: list[Request], x: np.ndarray) -> None:
        """Wait, then (encoded modes) rebuild the ghost rows of ``x`` from the messages."""
        if not reqs:
            return
        self.comm.waitall(reqs, f"the forward exchange of layer {self.layer}", self._peers())
        if self.mode == "dense":
            return
        decode_blocks(self._stage, self._in_starts, x, self.n_owned, self._recv_counts, self.cap,
                      lambda p: f"layer {self.layer}, rows from rank {self.recv_peers[p]}")
        # let go of the buffer: once a larger layer has grown the pool's, this view would
        # keep the smaller one alive beside it
        self._stage = _NO_BYTES

    def _peers(self) -> list[int]:
        return sorted(set(self.recv_peers) | set(self.send_peers))

    def _ghost_index(self) -> np.ndarray:
        if len(self._ghosts) != self.n_ghost:
            self._ghosts = np.arange(self.n_owned, self.n_owned + self.n_ghost)
        return self._ghosts

    def start_fold(self, ghost_partials: np.ndarray, x: np.ndarray
                   ) -> tuple[list[Request], np.ndarray, int]:
        """Backward: send ghost partials (n_ghost x B, grouped by owner) back; post receives
        of the partials other ranks computed for my rows. ``x`` is the layer's input buffer
        (its activations give both ends the same mask in the encoded modes). A packed
        message is packed in place: ``ghost_partials`` is spent. Returns (requests, receive
        buffer, bytes sent)."""
        batch, dtype = ghost_partials.shape[1], ghost_partials.dtype
        recv = self._buffer(self.rows_sent, batch, dtype, SENT_SIDE)
        reqs: list[Request] = []
        self._unpack = []
        tag = 2 * self.layer + 1
        dense = self.mode == "dense" or not self.masked
        start = 0
        for q, rows in zip(self.send_peers, self.send_rows):
            block = recv[start:start + len(rows)]
            n = len(rows) * batch
            count = n if dense else slope_count(x, rows, self.cap)
            if not dense and fold_packed(count, n, self.mode):
                values = block.reshape(-1)[:count]  # the packed values fit in the dense slot
                reqs.append(self.comm.irecv(values, q, tag))
                self._unpack.append((rows, values))
            else:
                reqs.append(self.comm.irecv(block, q, tag))
                self._unpack.append((rows, block))
            start += len(rows)
        ghosts = self._ghost_index()
        start = sent = 0
        for q, count in zip(self.recv_peers, self.recv_counts):
            block = ghost_partials[start:start + count]
            rows = ghosts[start:start + count]
            n = count * batch
            kept = n if dense else slope_count(x, rows, self.cap)
            if not dense and fold_packed(kept, n, self.mode):
                # packed in place, over the peer's own block (read no later than written):
                # the ghost side's buffer then holds only the forward's rows, which are
                # narrower than the partial sums under bfloat16
                packed = block.reshape(-1)
                fold_pack(block, x, rows, self.cap, packed)
                reqs.append(self.comm.isend(packed[:kept], q, tag))
                sent += kept * block.itemsize
            else:
                reqs.append(self.comm.isend(block, q, tag))
                sent += block.nbytes
            start += count
        return reqs, recv, sent

    def finish_fold(self, reqs: list[Request], recv: np.ndarray, g: np.ndarray,
                    x: np.ndarray) -> None:
        """Wait, then add the received partials into the owned rows of ``g``: dense blocks row
        by row, packed ones under their mask (the entries left out are exactly those the
        activation slope zeroes)."""
        self.comm.waitall(reqs, f"the backward exchange of layer {self.layer}", self._peers())
        for rows, values in self._unpack:
            if values.ndim == 2:
                add_rows(g, rows, values)
            else:
                fold_add(g, rows, values, x, self.cap)
        self._unpack = []
