"""The network between ranks, for ``spdnn calibrate``: ping-pong and all-reduce curves, and
the CPU time that moving a byte costs each end (through TCP, the kernel's stack copies and
processes every byte on the cores that compute; over RDMA a NIC does, and it is near zero)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.cost._calibrate_grid import FULL, CalibrationGrid
from spdnn.cost.machine import Network


def network_sweep(comm: Communicator, sizes: tuple[int, ...], reps: int = 20,
                  budget_s: float = 0.5) -> tuple[list[float], list[float]]:
    """Per size of ``sizes`` (bytes): half a ping-pong round trip between ranks 0 and 1, and an
    all-reduce over every rank (seconds, medians of single calls: robust to a busy machine);
    every rank returns the same. Each size takes ``reps`` calls, or fewer (at least 3) when
    they would take longer than ``budget_s``: over a slow link (100 Mbit/s) 20 round trips
    of 16 MiB alone would take a minute."""

    def calls(first: float) -> int:  # the same count on every rank
        return int(comm.bcast(max(3, min(reps, int(budget_s / max(first, 1e-9))))))

    half, ar = [], []
    for size in sizes:
        buf = np.zeros(size // 8, np.float64)
        comm.barrier()
        trips = [comm.round_trip(buf, 9)]
        trips += [comm.round_trip(buf, 9) for _ in range(calls(trips[0]) - 1)]
        half.append(float(np.median(trips)) / 2)
        comm.barrier()
        sums = []
        for i in range(reps):
            t = time.perf_counter()
            comm.waitall([comm.iallreduce_sum(buf)])
            sums.append(time.perf_counter() - t)
            if i == 0:
                count = calls(sums[0])
            if len(sums) >= count:
                break
        ar.append(float(np.median(sums)))
    return comm.bcast((half, ar))


def network_costs(comm: Communicator, message_s: float,
                  sweeps: list[tuple[list[float], list[float]]],
                  sizes: tuple[int, ...] = FULL.link_sizes) -> Network | None:
    """Latency and bandwidth between ranks 0 and 1 (ping-pong), the all-reduce over every
    rank, and both measured curves: per size of ``sizes`` the median of ``sweeps``
    (``network_sweep`` taken at several moments: on a shared VM, shared-memory transfers
    ran far slower for minutes at a time, and one sweep caught either state); None on one
    rank."""
    if comm.size < 2 or not sweeps:
        return None
    half_t = np.median(np.array([h for h, _ in sweeps]), axis=0)
    ar_t = np.median(np.array([a for _, a in sweeps]), axis=0)
    nbytes = np.array(sizes, float)
    lat, bw = _fit(nbytes, half_t)
    ar_lat, ar_bw = _fit(nbytes, ar_t)
    latency = max(lat - 2 * message_s, 0.0)
    return Network(latency_s=latency, bandwidth_Bps=bw, allreduce_latency_s=ar_lat,
                   allreduce_bandwidth_Bps=ar_bw, pingpong_bytes=tuple(map(float, sizes)),
                   pingpong_s=tuple(float(t) for t in half_t),
                   allreduce_bytes=tuple(map(float, sizes)),
                   allreduce_s=tuple(float(t) for t in ar_t))


def _fit(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """t = latency + size / bandwidth: the latency from the smallest size, the bandwidth from
    the largest against the smallest (the difference of the two largest, used before, swung
    by 6x between runs on a busy machine)."""
    bw = (sizes[-1] - sizes[0]) / max(times[-1] - times[0], 1e-12)
    return float(times[0]), float(bw)




def with_stack_cpu(comm: Communicator, network: Network | None, grid: CalibrationGrid = FULL
                   ) -> Network | None:
    """``network`` with its ``cpu_ns_per_byte`` measured (``stack_cpu``) as ``grid`` says."""
    if network is None:
        return None
    return dataclasses.replace(network, cpu_ns_per_byte=stack_cpu(
        comm, network.bandwidth_Bps, work_s=grid.stack_work_s, rounds=grid.stack_rounds))


def stack_cpu(comm: Communicator, bandwidth_Bps: float, *, work_s: float = FULL.stack_work_s,
              rounds: int = FULL.stack_rounds) -> float:
    """CPU nanoseconds per byte that a message costs each end, beyond its fixed cost: ranks
    0 and 1 run the same work in chunks, calling MPI between them as a layer does, once alone
    and once while they exchange ``nbytes`` each way; the work's slowdown is 2 ``nbytes``
    times the cost (each rank sends and receives). The exchange must end within the work, or
    only part of the bytes would be charged: the size halves until it does. Every rank
    returns the same."""
    if comm.size < 2:
        return 0.0
    work = np.ones(1 << 18)

    def chunk() -> None:
        np.multiply(work, 1.0000001, out=work)

    t = time.perf_counter()
    for _ in range(20):
        chunk()
    chunks = int(comm.bcast(int(np.clip(work_s / ((time.perf_counter() - t) / 20),
                                        50, 20000))))
    nbytes = int(comm.bcast(int(np.clip(0.5 * bandwidth_Bps * work_s, 2**20, 2**27))))
    peer = 1 - comm.rank if comm.rank < 2 else None
    while True:
        send = np.zeros(nbytes // 8)
        recv = np.empty_like(send)
        slowdowns, late = [], 0
        for r in range(rounds):
            seconds = {}
            for moving in (True, False) if r % 2 else (False, True):
                seconds[moving], ended = _timed_work(comm, chunk, chunks, peer, send, recv,
                                                     moving)
                late += moving and not ended
            slowdowns.append(seconds[True] - seconds[False])
        both = comm.allgather((float(np.median(slowdowns)), late))
        if max(n for _, n in both[:2]) <= rounds // 2 or nbytes <= 2**20:
            slow = max(0.0, (both[0][0] + both[1][0]) / 2)
            return slow / (2 * send.nbytes) * 1e9
        nbytes //= 2


def _timed_work(comm: Communicator, chunk: Callable[[], None], chunks: int, peer: int | None,
                send: np.ndarray, recv: np.ndarray, moving: bool) -> tuple[float, bool]:
    """Seconds of ``chunks`` chunks with MPI called between them, the exchange in flight or
    a one-value message pending (the same calls either way); and whether it ended in time."""
    tick = np.zeros(1)
    comm.barrier()
    reqs = []
    if peer is not None:
        reqs = [comm.irecv(recv, peer, 11), comm.isend(send, peer, 11)] if moving else \
            [comm.irecv(tick.copy(), peer, 12)]
    ended = False
    t = time.perf_counter()
    for _ in range(chunks):
        chunk()
        ended = comm.progress(reqs) or ended
    seconds = time.perf_counter() - t
    if peer is not None and not moving:
        reqs.append(comm.isend(tick, peer, 12))
    comm.waitall(reqs, "the measurement of the link's CPU time",
                 None if peer is None else [peer])
    return seconds, ended
