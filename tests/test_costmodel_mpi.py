"""The cost model counts what the runtime sends: per layer, direction and axis, the messages,
rows, bytes and gradient-sum values of one training step equal the runtime's own counts, for
every grid of the communicator (run under mpiexec -n 1..4; a serial test runs 8 ranks); and the
calibration times its reference steps as the model reads them (rank 0 alone, the slowest rank
of all)."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn.comm.mpi import Communicator
from spdnn.cost.workload import workload
from spdnn.model.plan import network_patterns
from tests.helpers import small_network
from tests.test_replicas_mpi import _open, grids

pytestmark = pytest.mark.mpi


def check_counts(comm: Communicator, tmp, batch: int = 13) -> list[tuple[int, int, str]]:
    """One SGD step's forward and backward on every grid and plan method; returns what was
    checked."""
    net = small_network((20, 30, 24, 6), fan_in=5, seed=7)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 20))
    y = rng.integers(0, 6, batch)
    done = []
    for parts, replicas in grids(comm.size):
        for method in ("hypergraph", "block"):
            run = _open(comm, tmp, net, parts, replicas, method, name=f"c{parts}x{replicas}")
            dnet = run.dnet
            mine = np.arange(batch)[dnet.grid.share(batch)]
            xs = np.ascontiguousarray(x[mine][:, dnet.input_rows].T)
            dnet.backward(dnet.forward(xs), y[mine], "cross_entropy", batch)
            t = dnet.traffic.total(comm)
            want = workload(network_patterns(net), run.plan).counts(batch, replicas,
                                                                    dnet.dtype.itemsize)
            got = {"forward_messages": t.forward_messages, "forward_rows": t.forward_rows,
                   "forward_bytes": t.forward_bytes, "backward_messages": t.backward_messages,
                   "backward_rows": t.backward_rows, "backward_bytes": t.backward_bytes,
                   "gradient_values": t.grad_values,
                   "gradient_bytes": t.grad_values * dnet.dtype.itemsize}
            for key, values in want.items():
                assert got[key].tolist() == values, (parts, replicas, method, key)
            if parts > 1:
                assert sum(want["forward_messages"]) > 0
            dnet.grid.free()
            done.append((parts, replicas, method))
    return done


def test_predicted_counts_equal_the_runtime_counts(mpi_tmp_path):
    with Communicator() as comm:
        done = check_counts(comm, mpi_tmp_path)
    assert len(done) == 2 * len(grids(comm.size))


def test_reference_steps_time_rank_0_alone_and_the_slowest_rank_together(monkeypatch):
    """Calibration's reference steps, sampled in turns: ``alone`` is rank 0's step, ``together``
    the slowest rank's of each step (a synchronised step waits for it), the same on every
    rank; before 2026-11-25 the mean over ranks hid a slow core."""
    from types import SimpleNamespace

    # Internal: the reference steps are timed inside spdnn calibrate only.
    from spdnn.cost import _calibrate_runtime as cr

    with Communicator() as comm:
        slow = comm.size > 1 and comm.rank == comm.size - 1
        # A clock that only the step moves: 2 ms a step, 30 ms on the slow rank. Real sleeps
        # were flaky with 4 ranks sharing 2 cores (a descheduled rank overslept).
        clock = [0.0]

        def step() -> None:
            clock[0] += 0.03 if slow else 0.002

        monkeypatch.setattr(cr, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
        monkeypatch.setattr(cr, "_training_step", lambda dnet, opt, batch: step)
        ref = cr._References("float32", (((32, 32, 32), (4, 8)),))
        alone, together = ref.paired_steps(comm, min_seconds=0.05)
        ref.free()
        assert [b for _, b, _ in alone] == [b for _, b, _ in together] == [4, 8]
        every = comm.allgather([(b, t) for _, b, t in alone + together])
    assert all(mine == every[0] for mine in every)
    assert [t for _, _, t in alone] == pytest.approx([0.002, 0.002])
    slowest = 0.03 if comm.size > 1 else 0.002
    assert [t for _, _, t in together] == pytest.approx([slowest, slowest])


def test_the_link_cpu_measurement_agrees_on_every_rank():
    """``spdnn calibrate``'s CPU time per byte of the link: the same non-negative figure on
    every rank (measured by ranks 0 and 1 while the others idle), 0 on one rank."""
    from spdnn.cost import _calibrate_link as cl

    with Communicator() as comm:
        c = cl.stack_cpu(comm, 1e9, work_s=0.02, rounds=3)
        every = comm.allgather(c)
    assert all(x == every[0] for x in every)
    assert np.isfinite(c) and c >= 0.0
    if comm.size == 1:
        assert c == 0.0


def test_the_link_cpu_is_the_slowdown_per_byte_at_each_end(monkeypatch):
    """The arithmetic, on a clock the test controls: work of 0.1 s, slowed by 2 x bytes x c
    while the exchange is in flight, at 1.5 ns a byte; an exchange that does not end within
    the work halves the size until it does (here from 125 MB down to 4 MB or less)."""
    from spdnn.cost import _calibrate_link as cl

    sizes = []

    def timed(comm, chunk, chunks, peer, send, recv, moving):  # noqa: ANN001, ANN202
        nbytes = send.nbytes
        sizes.append(nbytes)
        return 0.1 + (2 * nbytes * 1.5e-9 if moving and peer is not None else 0.0), \
            nbytes <= 4_000_000

    monkeypatch.setattr(cl, "_timed_work", timed)
    with Communicator() as comm:
        c = cl.stack_cpu(comm, 1e9)
    if comm.size == 1:
        assert c == 0.0
        return
    assert c == pytest.approx(1.5)  # on every rank: only ranks 0 and 1 exchange
    assert max(sizes) > 100_000_000 and min(sizes) <= 4_000_000
