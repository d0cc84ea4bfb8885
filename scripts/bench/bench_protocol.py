"""How a receiver should take a message whose size it does not know (the sparse exchange's
forward messages), measured side by side between two ranks:

- ``capacity``: receive posted in advance into a buffer of the largest size the message can
  have (what spdnn does: the header inside says which form came);
- ``probe``: matched probe for the size, then receive exactly that (MPI_Mprobe / MPI_Mrecv);
- ``size first``: a small message with the size, then the payload.

    mpiexec -n 2 python scripts/bench/bench_protocol.py [--repeats 2000] [--no-write]

Each round trip sends one message of the given size each way (ping-pong); the table gives the
median microseconds per round trip over interleaved batches of the three protocols. MPI is
called directly here: the script measures MPI itself, not spdnn.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import parser, publish, summary_row, table  # noqa: E402

SIZES = (1 << 10, 16 << 10, 256 << 10, 1 << 20)


def ping_pong(comm: MPI.Comm, protocol: str, payload: np.ndarray, capacity: np.ndarray,
              repeats: int) -> float:
    """Seconds per round trip."""
    peer, n = 1 - comm.rank, len(payload)
    size = np.array([n], np.int64)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        for turn in (0, 1):
            if comm.rank == turn:
                if protocol == "size first":
                    comm.Send(size, peer, 1)
                comm.Send(payload, peer, 0)
            elif protocol == "capacity":
                comm.Irecv(capacity, peer, 0).Wait()
            elif protocol == "probe":
                status = MPI.Status()
                message = comm.Mprobe(peer, 0, status)
                message.Recv(capacity[:status.Get_count(MPI.BYTE)])
            else:
                comm.Recv(size, peer, 1)
                comm.Recv(capacity[:int(size[0])], peer, 0)
    return (time.perf_counter() - t0) / repeats


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """spdnn's receive (a buffer of the largest size) against probing for the size."""
    return [summary_row(f"receive a message of unknown size, {r['message bytes']} bytes "
                        "(us per round trip)", r["capacity (spdnn)"],
                        f"{r['probe']} (MPI probe, then receive)",
                        f"probe takes {r['probe / capacity']} the time")
            for r in tables[0]]


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=2000, help="round trips per batch")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        print("bench_protocol.py: run with mpiexec -n 2", file=sys.stderr)
        return 2
    protocols = ("capacity", "probe", "size first")
    rows = []
    for nbytes in SIZES:
        payload = np.ones(nbytes, np.uint8)
        capacity = np.empty(nbytes + nbytes // 16 + 64, np.uint8)  # two bitmaps' worth more
        repeats = args.repeats if nbytes <= 16384 else max(50, args.repeats // 10)
        times: dict[str, list[float]] = {p: [] for p in protocols}
        for _ in range(5):
            for p in protocols:
                times[p].append(ping_pong(comm, p, payload, capacity, repeats))
        med = {p: statistics.median(v) * 1e6 for p, v in times.items()}
        rows.append([f"{nbytes:,}", *(f"{med[p]:.1f}" for p in protocols),
                     f"{med['probe'] / med['capacity']:.2f}x",
                     f"{med['size first'] / med['capacity']:.2f}x"])
    if comm.rank == 0:
        body = ("Command: `mpiexec -n 2 python scripts/bench/bench_protocol.py` (MPICH wheel, "
                "shared memory; median microseconds per round trip, one message each way, over 5 "
                "interleaved batches).\n\n"
                + table(["message bytes", "capacity (spdnn)", "probe", "size first",
                         "probe / capacity", "size first / capacity"], rows))
        publish(args, "BENCH_PROTOCOL", "Receiving messages of unknown size", body,
                area="Kernels", rows=summary,
                command="mpiexec -n 2 python scripts/bench/bench_protocol.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
