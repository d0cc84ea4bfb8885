"""``spdnn calibrate``: measure what the cost model needs on this host (spdnn.cost.machine).

Every rank measures the kernels and the runtime's fixed costs at the same time, as they run in
a job (memory bandwidth and caches are shared), and the mean over ranks is kept; ranks 0 and 1
measure point-to-point latency and bandwidth (ping-pong), and all ranks the all-reduce, four
times spread over the calibration (the median per message size); then ranks 0 and 1 the CPU
time a byte on the link costs each end (the slowdown of work while an exchange is in flight).
Run it with as many ranks per node as the jobs it will predict (one per core).
"""

from __future__ import annotations

import platform
import socket
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.cost._calibrate_grid import FULL, QUICK, CalibrationGrid
from spdnn.cost._calibrate_kernels import dense_table, kernel_table, structure_ratios
from spdnn.cost._calibrate_link import network_costs, network_sweep, with_stack_cpu
from spdnn.cost._calibrate_runtime import reference_scales, round_cost, runtime_costs, update_costs
from spdnn.cost.machine import KERNELS, Calibration, KernelTable, Structure
from spdnn.kernels import products as kernels
from spdnn.model.choices import VALUE_TYPES
from spdnn.model.csr import as_dtype

__all__ = ["FULL", "QUICK", "CalibrationGrid", "calibrate", "run_calibrate"]


def calibrate(comm: Communicator, dtypes: tuple[str, ...] = VALUE_TYPES,
              log: Callable[[str], None] | None = None, *, grid: CalibrationGrid = FULL
              ) -> Calibration:
    """Measure the cells of ``grid`` on every rank of ``comm``, kernel tables for each of
    ``dtypes``; every rank returns the same calibration. What does not depend on the value
    type (the structure, the runtime's costs, the reference steps) is measured in the first
    of them, float32 for bfloat16 (whose sums and optimizer state are float32): its tables
    are then measured too, as the reference steps are scaled against them."""
    kernels.warm_up()
    if "bfloat16" in dtypes:
        kernels.warm_up_bfloat16()
    base = as_dtype(dtypes[0]).name
    dtypes = tuple(dict.fromkeys((*dtypes, base)))
    rng = np.random.default_rng(comm.rank)
    say = log or (lambda _msg: None)
    sweeps = []  # the network, at moments spread over the calibration (its speed flips)

    def sweep() -> None:
        if comm.size > 1:
            sweeps.append(network_sweep(comm, grid.link_sizes))

    sweep()
    tables = {}
    for dt in dtypes:
        say(f"kernels, {dt}: {len(KERNELS)} products x {len(grid.reuses)} reuses x "
            f"{len(grid.inputs)} input sizes x {len(grid.batches)} batch sizes, and dense layers")
        comm.barrier()
        tables[dt] = replace(kernel_table(dt, rng, grid), dense=dense_table(dt, rng, grid))
    sweep()
    say(f"a RadiX-Net layer against a random one, {base}: structured columns")
    comm.barrier()
    mine = structure_ratios(base, rng, grid)
    structure = Structure(mine.batches, {k: tuple(float(x) for x in comm.allreduce(
        np.array(v)) / comm.size) for k, v in mine.ratio.items()}, mine.gap)
    say("fixed costs of the runtime (per layer, step, message) and element-wise work")
    comm.barrier()
    runtime = runtime_costs(base, rng)
    if "bfloat16" in dtypes:
        runtime["round_ns_per_value"] = round_cost(rng)
    sweep()
    # The mean over ranks: all measured at once, as in a job.
    for dt, t in tables.items():
        dense = t.dense if t.dense is None else replace(t.dense, ns={
            k: comm.allreduce(v) / comm.size for k, v in t.dense.ns.items()})
        tables[dt] = KernelTable(batches=t.batches, inputs=t.inputs, reuses=t.reuses,
                                 ns={k: comm.allreduce(v) / comm.size for k, v in t.ns.items()},
                                 dense=dense)
    keys = sorted(runtime)
    mean = comm.allreduce(np.array([runtime[k] for k in keys])) / comm.size
    runtime = dict(zip(keys, (float(v) for v in mean)))
    say("each optimizer's update")
    mine = update_costs(base, rng)
    names = sorted(mine)
    updates = dict(zip(names, (float(v) for v in comm.allreduce(
        np.array([mine[k] for k in names])) / comm.size)))
    rounds = grid.reference_rounds
    say(f"real steps of reference networks in and beyond the cache at batch "
        f"{' and '.join(map(str, grid.reference_batches))}, {rounds} round"
        f"{'s' * (rounds > 1)}: rank 0 alone and every rank at once, in turns")
    scalars, scales = reference_scales(comm, base, tables, runtime, grid)
    runtime.update(scalars)
    if comm.size > 1:
        say(f"network: ping-pong between ranks 0 and 1, all-reduce over {comm.size} ranks "
            f"(and {len(sweeps)} times before)")
    sweep()
    network = network_costs(comm, runtime["message_s"], sweeps, grid.link_sizes)
    if network is not None:
        say("network: the CPU time a byte costs each end of the link (ranks 0 and 1: work "
            "with and without an exchange in flight)")
        network = with_stack_cpu(comm, network, grid)
    if sweeps:
        size = grid.link_sizes[len(grid.link_sizes) // 2]
        mid = [h[grid.link_sizes.index(size)] for h, _ in sweeps]
        if max(mid) > 1.5 * min(mid):
            say(f"the network's speed moved between the {len(sweeps)} measurements: a "
                f"{size:,}-byte message took {min(mid) * 1e6:.0f}-{max(mid) * 1e6:.0f} us "
                "(the median is kept)")
    host = f"{socket.gethostname()} ({platform.processor() or platform.machine()})"
    return Calibration(host=host, ranks=comm.size, backend=kernels.backend(), kernels=tables,
                       runtime=runtime, network=network, structure=structure,
                       scales=scales, updates=updates)


def run_calibrate(comm: Communicator, output: str, dtypes: tuple[str, ...] = VALUE_TYPES, *,
                  grid: CalibrationGrid = FULL) -> int:
    """``spdnn calibrate``: measure ``grid`` with kernel tables for ``dtypes``, then rank 0
    writes the file (the output is checked before measuring)."""
    import json

    from spdnn.io.atomic import write_text
    from spdnn.io.paths import check_outputs

    comm.check(lambda: check_outputs([("--output", output)]) if comm.rank == 0 else None)
    start = time.perf_counter()

    def log(msg: str) -> None:
        if comm.rank == 0:
            print(f"[{time.perf_counter() - start:6.1f} s] {msg}", flush=True)

    cal = calibrate(comm, tuple(dict.fromkeys(dtypes)), log, grid=grid)
    comm.check(lambda: write_text(output, json.dumps(cal.to_json(), indent=1) + "\n")
               if comm.rank == 0 else None)
    if comm.rank == 0:
        net = cal.network
        where = "no network part (1 rank: give spdnn-partition model a --cluster file)" \
            if net is None else (f"ping-pong latency {net.latency_s * 1e6:.1f} us beyond the "
                                 f"{cal.runtime['message_s'] * 1e6:.1f} us of software per "
                                 f"message, {net.bandwidth_Bps / 1e9:.1f} GB/s, "
                                 f"{net.cpu_ns_per_byte:.2f} ns of CPU a byte at each end")
        print(f"wrote {output}: {comm.size} rank(s), backend {cal.backend}, "
              f"{cal.runtime['layer_forward_s'] * 1e6:.0f} + "
              f"{cal.runtime['layer_backward_s'] * 1e6:.0f} us fixed per layer (forward + "
              f"backward); {where}; {time.perf_counter() - start:.0f} s", flush=True)
        spread = cal.runtime["compute_scale_spread"]
        if grid.reference_rounds < 2:
            print("one round of reference steps: the host's drift is not measured (a quick "
                  "calibration; the full one measures it)", flush=True)
        else:
            print(f"the host's speed moved up to {spread:.0%} between the "
                  f"{grid.reference_rounds} rounds of reference steps: predictions from this "
                  "file carry at least that much noise"
                  + ("; calibrate again when the host is quieter" if spread > 0.15 else ""),
                  flush=True)
    return 0
