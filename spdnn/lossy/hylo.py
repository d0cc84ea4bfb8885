"""Hylo's 2-bit gradient sums (``--compress hylo``): each value of a large layer travels as
two bits, with no positions.

Per layer and rank, the step's gradient is added to the residual of what was not sent before
(error feedback). The threshold is the mean magnitude of that vector (it follows the layer's
gradient scale); values at or above it in magnitude are sent as +s or -s, where s is their
mean magnitude, the others as 0; what was sent is taken out of the residual. The wire message
is the packed codes (n / 4 bytes) followed by s as 8 bytes; every replica gathers every
replica's message and adds them in replica order, so the replicas stay bit-identical. Layers
with fewer values than ``--compress-min-values`` are summed exactly (spdnn.runtime.gradsum).
Kernels know nothing of MPI.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SCALE_BYTES = 8  # the scale travels as a float64 after the codes


def message_bytes(n: int) -> int:
    """Bytes a rank sends for a layer of n gradient values."""
    return (n + 3) // 4 + SCALE_BYTES


class HyloCompressor:
    """One layer's 2-bit quantiser on one rank: the residual (error feedback). ``state`` keeps
    the last threshold and scale (informative; each step computes its own), so that checkpoints
    hold every compressor alike."""

    def __init__(self, n: int, dtype: np.dtype) -> None:
        self.n = n
        self.residual = np.zeros(n, dtype=dtype)
        self.state = np.zeros(4)
        self._message = np.empty(message_bytes(n), dtype=np.uint8)

    def pack(self, grads: Sequence[np.ndarray]) -> tuple[np.ndarray, int]:
        """Add the gradient (``grads`` end to end) to the residual and quantise it; returns the
        message (valid until the next call) and the count of nonzero codes."""
        from spdnn.lossy.compress import compressor_passes

        nbh, abs_sum = _passes_hylo(), compressor_passes().abs_sum
        acc = self.residual
        start = 0
        for g in grads:
            acc[start:start + len(g)] += g
            start += len(g)
        dtype = acc.dtype.type
        threshold = abs_sum(acc) / self.n if self.n else 0.0
        above, count = nbh.above_stats(acc, threshold)
        scale = dtype(above / count) if count else dtype(0)
        # compare in the values' type: the smallest value of it not below the threshold
        t = dtype(threshold)
        if float(t) < threshold:
            t = np.nextafter(t, dtype(np.inf))
        nonzero = nbh.quantize_pack(acc, t, scale, self._message[:-SCALE_BYTES])
        self._message[-SCALE_BYTES:] = np.frombuffer(np.float64(scale).tobytes(), np.uint8)
        self.state[:2] = threshold, float(scale)
        return self._message, nonzero


def add_messages(gathered: np.ndarray, n: int, total: np.ndarray) -> None:
    """Add every replica's message (``gathered``: the messages end to end, in replica order)
    into ``total`` (n values, zeroed by the caller)."""
    nbh = _passes_hylo()
    size = message_bytes(n)
    for start in range(0, len(gathered), size):
        msg = gathered[start:start + size]
        scale = total.dtype.type(msg[-SCALE_BYTES:].view(np.float64)[0])
        nbh.unpack_add(msg[:-SCALE_BYTES], scale, total)


def _passes_hylo():  # noqa: ANN202
    """The 2-bit sum's passes: compiled where the kernel backend runs them, else numpy's."""
    from spdnn.backends import active

    return active().passes("spdnn.lossy._numba_hylo", "spdnn.lossy._numpy_hylo")


def warm_up() -> None:
    _passes_hylo().warm_up()
