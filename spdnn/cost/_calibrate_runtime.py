"""The runtime's fixed costs and the reference steps that scale the kernel tables to real
steps. Part of ``spdnn calibrate`` (the network: ``_calibrate_link``)."""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.cost._calibrate_grid import CalibrationGrid
from spdnn.cost._calibrate_kernels import FAN_IN, cache_bytes, median_time
from spdnn.cost.machine import SCALE_KEYS, Calibration, KernelTable, Scales
from spdnn.io.bundle import save_network
from spdnn.kernels import products as kernels
from spdnn.kernels import rounding
from spdnn.kernels.update import PARALLEL
from spdnn.model.generate import fixed_fan_in
from spdnn.optim import Optimizer, SGDConfig, interleave, load_kernels, make


def _tiny_step_times(layers: int, dtype: str, reps: int) -> tuple[float, float]:
    """Forward and whole-step seconds of a tiny network (8 neurons per layer, batch 1) on
    this rank alone: the runtime's fixed costs per layer and per step."""
    from spdnn.model.network import Layer, Network
    from spdnn.runtime.session import open_network

    rng = np.random.default_rng(layers)
    net_layers = [Layer(fixed_fan_in(8, 8, 2, rng, dtype), np.zeros(8, dtype))
                  for _ in range(layers)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.npz")
        save_network(Network(layers=tuple(net_layers)), path)
        run = open_network(Communicator.self_only(), path, None, dtype, exchange="dense")
    dnet = run.dnet
    x = np.ones((8, 1), dtype)
    step = _training_step(dnet, _sgd(dnet.parameters()), 1)
    forward = median_time(lambda: [dnet.forward(x) for _ in range(20)], reps) / 20
    whole = median_time(lambda: [step() for _ in range(20)], reps) / 20
    dnet.grid.free()
    return forward, whole


class _References:
    """Reference networks opened on this rank alone (one model part), to time real training
    steps: what the kernel tables miss in a real step (caches shared with the other buffers,
    chunked calls) shows up against their prediction."""

    def __init__(self, dtype: str, references: tuple) -> None:
        from spdnn.cost.workload import workload
        from spdnn.model.generate import random_network
        from spdnn.model.plan import network_patterns
        from spdnn.runtime.session import open_network

        self.cases = []
        for sizes, batches in references:
            net = random_network(list(sizes), FAN_IN, seed=1, head=10, dtype=dtype)
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "reference.npz")
                save_network(net, path)
                run = open_network(Communicator.self_only(), path, None, dtype, exchange="dense")
            opt = _sgd(run.dnet.parameters())
            self.cases.append((run.dnet, opt, workload(network_patterns(net), run.plan),
                               batches))

    def paired_steps(self, comm: Communicator, min_seconds: float = 0.5
                     ) -> tuple[list[tuple[object, int, float]], list[tuple[object, int, float]]]:
        """(workload, batch, median seconds of a step) per reference network and batch, on
        rank 0 alone and on every rank at once (the slowest rank of each step: a step that
        synchronises its ranks waits for it), sampled in turns (alone, together, alone, ...)
        for at least ``min_seconds`` each. Every rank returns the same lists.

        Why in turns: the model needs the ratio of the two, and this host's speed moves by
        10-40% within seconds; timed one after the other, the ratio came out anywhere from
        0.9 to 1.6 between calibrations. Why the slowest rank: one core of this virtual
        machine often runs 10-35% slower than the other for seconds at a time (other tenants
        share its physical core), and the mean over ranks hid it."""
        alone, together = [], []
        for dnet, opt, work, batches in self.cases:
            for batch in batches:
                step = _training_step(dnet, opt, batch)
                step()  # warm: pages faulted in, code compiled
                t = time.perf_counter()
                step()
                first = comm.bcast(time.perf_counter() - t)
                pairs = int(np.clip(math.ceil(min_seconds / max(first, 1e-6)), 5, 500))
                solo, both = [], []
                for _ in range(pairs):
                    comm.barrier()
                    if comm.rank == 0:
                        t = time.perf_counter()
                        step()
                        solo.append(time.perf_counter() - t)
                    comm.barrier()
                    t = time.perf_counter()
                    step()
                    both.append(time.perf_counter() - t)
                slowest = np.max(np.array(comm.allgather(both)), axis=0)
                alone.append((work, batch, float(comm.bcast(np.median(solo) if solo else 0.0))))
                together.append((work, batch, float(np.median(slowest))))
        return alone, together

    def free(self) -> None:
        for dnet, *_ in self.cases:
            dnet.grid.free()


def _sgd(params: list[np.ndarray]) -> Optimizer:
    """SGD with momentum 0.9 over ``params``, on the fused kernels where training runs them."""
    load_kernels(("sgd",), (params[0].dtype.type,), parallel=PARALLEL)
    return make(SGDConfig(0.001, 0.9), params, parallel=PARALLEL)


def _training_step(dnet, opt: Optimizer, batch: int) -> Callable[[], None]:  # noqa: ANN001
    """One SGD step of ``dnet`` on a constant batch, as the training loop runs it."""
    x = np.ones((dnet.sizes[0], batch), dnet.dtype)
    y = np.zeros(batch, np.int64)

    def step() -> None:
        fwd = dnet.forward(x)
        _, _, gw, gb = dnet.backward(fwd, y, "cross_entropy", batch)
        opt.step(interleave(gw, gb))

    return step


def compute_scale(steps: list[tuple[object, int, float]], tables: dict[str, KernelTable],
                  runtime: dict[str, float], dtype: str, running: int = 1) -> float:
    """Measured over predicted compute of the reference steps (the median ratio), measured
    with ``running`` ranks at once (sharing the last-level cache)."""
    from spdnn.cost.cluster import Machine
    from spdnn.cost.costmodel import predict

    ones = dict.fromkeys(("compute_scale_alone", "compute_scale_all",
                          "compute_scale_cold_alone", "compute_scale_cold_all"), 1.0)
    shared = {**runtime, **ones, "cache_bytes": runtime["cache_bytes"] / running}
    machine = Machine(Calibration(host="", ranks=1, backend="", kernels=tables, runtime=shared,
                                  network=None))
    ratios = []
    for work, batch, seconds in steps:
        p = predict(work, machine, batch, 1, dtype)  # type: ignore[arg-type]
        fixed = p.seconds - p.compute_kernels
        ratios.append(max(seconds - fixed, 1e-9) / max(p.compute_kernels, 1e-9))
    return float(np.median(ratios))


def runtime_costs(dtype: str, rng: np.random.Generator, reps: int = 5) -> dict[str, float]:
    """Fixed costs of the Python runtime and the element-wise work, on this rank alone."""
    # Straight lines through forward and whole-step times of 2..18 tiny layers: the slopes
    # are the fixed costs per layer, the whole step's intercept the cost per step.
    counts = np.array([2, 6, 10, 18])
    times = np.array([_tiny_step_times(int(n), dtype, reps) for n in counts])
    layer_f, _ = np.polyfit(counts, times[:, 0], 1)
    slope, step0 = np.polyfit(counts, times[:, 1], 1)
    layer_f = max(float(layer_f), 0.0)
    layer_b = max(float(slope) - layer_f, 0.0)
    me = Communicator.self_only()
    tiny = np.zeros(1, np.float64)
    got = np.zeros(1, np.float64)

    def pair() -> None:
        reqs = [me.irecv(got, 0, 7), me.isend(tiny, 0, 7)]
        me.waitall(reqs)

    message = median_time(lambda: [pair() for _ in range(200)], reps) / 400
    # A layer that exchanges runs its owned product in chunks, progressing the messages.
    w = fixed_fan_in(64, 64, 4, rng, dtype)
    x = np.ones((64, 1), dtype)
    z = np.empty((64, 1), dtype)
    bias = np.zeros(64, dtype)

    def chunked() -> None:
        pending = [me.irecv(got, 0, 8)]
        for r in range(8):
            kernels.spmm(w, x, bias, z, (8 * r, 8 * r + 8))
            me.progress(pending)
        me.waitall([me.isend(tiny, 0, 8)] + pending)

    def whole() -> None:
        kernels.spmm(w, x, bias, z)
        pair()

    exchange_layer = max(median_time(lambda: [chunked() for _ in range(100)], reps)
                         - median_time(lambda: [whole() for _ in range(100)], reps), 0.0) / 100
    big = rng.random((4096, 256)).astype(dtype)
    rows = np.sort(rng.choice(4096, 1024, replace=False))
    out = np.empty((1024, 256), dtype)
    pack = median_time(lambda: np.take(big, rows, axis=0, out=out), reps) / out.nbytes * 1e9
    zz = rng.standard_normal(big.shape).astype(dtype)
    elementwise = median_time(lambda: kernels.apply_slope(big, zz, None), reps) / big.size * 1e9
    params = [rng.random(2**20).astype(dtype), rng.random(1024).astype(dtype)]
    grads = [p.copy() for p in params]
    opt = _sgd(params)
    opt.step(grads)
    update = median_time(lambda: opt.step(grads), reps) / (2**20 + 1024) * 1e9
    vec = np.zeros(64, dtype)
    collective = median_time(lambda: [me.allreduce(vec) for _ in range(100)], reps) / 100
    step = max(float(step0) - 4 * collective, 0.0)  # negative only by noise
    return {"layer_forward_s": layer_f, "layer_backward_s": layer_b, "step_s": step,
            "message_s": message, "exchange_layer_s": exchange_layer,
            "pack_ns_per_byte": pack, "update_ns_per_value": update,
            "elementwise_ns_per_value": elementwise, "collective_s": collective,
            "cache_bytes": float(cache_bytes())}


def update_costs(dtype: str, rng: np.random.Generator, reps: int = 5) -> dict[str, float]:
    """ns per stored value of each optimizer's update (spdnn.optim.OPTIMIZERS, at its
    defaults), over 2**20 weights and 1,024 biases: what the replay charges a step's update."""
    from spdnn.kernels.update import PARALLEL
    from spdnn.optim import OPTIMIZERS, config_of, load_kernels, make

    load_kernels(tuple(OPTIMIZERS), (np.dtype(dtype).type,), parallel=PARALLEL)
    params = [rng.random(2**20).astype(dtype), rng.random(1024).astype(dtype)]
    grads = [p.copy() for p in params]
    out = {}
    for name in OPTIMIZERS:
        opt = make(config_of(name), [p.copy() for p in params], parallel=PARALLEL)
        opt.step(grads)  # its state made
        out[name] = median_time(lambda opt=opt: opt.step(grads), reps) / (2**20 + 1024) * 1e9
    return out


def round_cost(rng: np.random.Generator, reps: int = 5) -> float:
    """ns per weight of rounding the float32 master weights to the products' bfloat16 copy
    (2**20 weights): what a bfloat16 step adds to every update."""
    kernels.warm_up_bfloat16()
    master = rng.standard_normal(2**20).astype(np.float32)
    copy = np.empty(master.size, np.uint16)
    return median_time(lambda: rounding.round_weights(master, copy), reps) / master.size * 1e9


def reference_scales(comm: Communicator, dtype: str, tables: dict[str, KernelTable],
                     runtime: dict[str, float], grid: CalibrationGrid
                     ) -> tuple[dict[str, float], Scales]:
    """The four compute scales (warm / cold reference networks, rank 0 alone / the slowest of
    every rank at once) per reference batch size of ``grid``, each the median of rounds (the
    host's speed drifts); and as ``runtime`` values, the median over the batches and the spread: the
    largest relative distance of a round from its median. Every rank computes the same
    (``paired_steps`` shares the times)."""
    rounds: dict[tuple[str, int], list[float]] = {}
    for cls, refs in (("", grid.warm_references), ("cold_", grid.cold_references)):
        ref = _References(dtype, refs)
        for _ in range(grid.reference_rounds):
            solo, both = ref.paired_steps(comm, grid.reference_seconds)
            for key, steps, running in (("alone", solo, 1), ("all", both, comm.size)):
                for batch in grid.reference_batches:
                    rounds.setdefault((cls + key, batch), []).append(compute_scale(
                        [s for s in steps if s[1] == batch], tables, runtime, dtype, running))
        ref.free()
    median = {k: float(np.median(v)) for k, v in rounds.items()}
    batches = grid.reference_batches
    scales = Scales(batches, {k: tuple(median[k, b] for b in batches) for k in SCALE_KEYS})
    out = {f"compute_scale_{k}": float(np.median(v)) for k, v in scales.values.items()}
    out["compute_scale_spread"] = max(float(np.max(np.abs(np.array(v) / median[k] - 1)))
                                      for k, v in rounds.items())
    return out, scales
