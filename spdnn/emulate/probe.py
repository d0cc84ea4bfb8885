"""Ping-pong between two ranks: the bandwidth and latency of the link between them.

Run as ``python -m spdnn.emulate.probe`` on 2 ranks (one per node); rank 0 prints one JSON
line: ``{"bandwidth": bytes/s for 1 MiB messages, "latency": one-way seconds for 8 bytes}``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from spdnn.comm.collective import run_collectively
from spdnn.comm.mpi import Communicator

LARGE = 1 << 20
SMALL = 8


def _round_trips(c: Communicator, buf: np.ndarray, count: int) -> float:
    """Seconds for ``count`` round trips of ``buf`` between ranks 0 and 1."""
    c.barrier()
    return c.bcast(sum(c.round_trip(buf, 7) for _ in range(count)))


def measure(c: Communicator, seconds: float = 0.5) -> dict[str, float]:
    """Median of three timed rounds for each size, each sized to about ``seconds / 6``."""
    result = {}
    for name, size in (("bandwidth", LARGE), ("latency", SMALL)):
        buf = np.zeros(size, dtype=np.uint8)
        first = max(_round_trips(c, buf, 2) / 2, 1e-6)  # also the warm-up
        count = int(min(max(seconds / 6 / first, 3), 10_000))
        one_way = float(np.median([_round_trips(c, buf, count) for _ in range(3)])) / count / 2
        result[name] = size / one_way if name == "bandwidth" else one_way
    return result


def _main(c: Communicator) -> int:
    if c.size < 2:
        print("probe: needs 2 ranks", file=sys.stderr)
        return 2
    out = measure(c)
    if c.rank == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_collectively(_main))
