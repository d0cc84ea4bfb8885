"""``spdnn calibrate``: measure what the cost model needs on this host (spdnn.machine).

Every rank measures the kernels and the runtime's fixed costs at the same time, as they run in
a job (memory bandwidth and caches are shared), and the mean over ranks is kept; ranks 0 and 1
then measure point-to-point latency and bandwidth (ping-pong), and all ranks the all-reduce.
Run it with as many ranks per node as the jobs it will predict (one per core).
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile
import time
from collections.abc import Callable

import numpy as np

from . import kernels
from .bundle import save_network
from .comm import Communicator
from .generate import fixed_fan_in
from .machine import KERNELS, TABLE_KEYS, Calibration, KernelTable, Network, Structure
from .optim import SGD, SGDConfig, interleave

BATCHES = (8, 16, 32, 64, 128, 256, 512)
INPUTS = (256, 1024, 4096, 16384, 65536)
REUSES = (1, 4, 32)  # nonzeros per buffer row: a cut layer's ghosts .. a whole square layer
FAN_IN = 32
MAX_UNITS = 2**27  # nonzeros x samples per timed call, at most (time and memory)
SIZES = (8, 1024, 16384, 131072, 1048576, 4194304, 16777216)  # bytes: ping-pong, all-reduce


def _median_time(fn: Callable[[], object], reps: int, min_seconds: float = 0.0,
                 before: Callable[[], object] | None = None) -> float:
    """Median seconds of ``fn`` over ``reps`` calls, or more until ``min_seconds`` are spent
    (a shared machine's noise hits short calls hardest); ``before`` runs untimed before
    each call."""
    fn()  # warm: pages faulted in, code compiled
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - start < min_seconds and len(times) < 1000):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


class _Evict:
    """Writes a buffer larger than the last-level cache: a kernel then starts with cold
    caches, as in a real step, where the other layers' arrays have been through them."""

    def __init__(self, nbytes: int | None = None) -> None:
        self.buf = np.zeros((nbytes or _evict_bytes()) // 8)
        self.tick = 0.0

    def __call__(self) -> None:
        self.tick += 1.0
        self.buf.fill(self.tick)


def _evict_bytes() -> int:
    """1.5x the last-level cache (64 MiB if the CPU reports none), at most 512 MiB: past
    that, writing it would dominate the calibration's time."""
    return int(min(max(1.5 * cache_bytes(), 64 * 2**20), 512 * 2**20))


def _kernel_ns(w, x: np.ndarray, d: np.ndarray, reps: int,  # noqa: ANN001
               evict: _Evict) -> list[float]:
    """ns per nonzero x sample of the three products of one layer ``w`` on inputs ``x``,
    each call after ``evict`` (a no-op: warm caches)."""
    rows, b, dtype = w.shape[0], x.shape[1], x.dtype
    wt, order = kernels.transpose(w)
    z, h = np.empty((rows, b), dtype), np.empty((rows, b), dtype)
    g = np.empty((x.shape[0], b), dtype)
    gw, gb, bias = np.empty(w.nnz, dtype), np.empty(rows, dtype), np.zeros(rows, dtype)
    units = w.nnz * b * 1e-9
    return [_median_time(lambda: kernels.spmm_act(w, x, bias, None, z, h), reps, 0.01, evict)
            / units,
            _median_time(lambda: kernels.backward_products(wt, order, d, x, g, gw), reps, 0.01,
                         evict) / units,
            _median_time(lambda: kernels.sddmm(w, d, x, out=gw, bias_grad=gb), reps, 0.01,
                         evict) / units]


def kernel_table(dtype: str, rng: np.random.Generator, reps: int = 3) -> KernelTable:
    """ns per nonzero x sample of the forward product, the two backward products (one pass)
    and the weight gradient alone (first layer), on random fixed fan-in layers whose nonzeros
    read each of their input rows ``reuse`` times on average; each from cold caches (after
    writing a buffer larger than the last-level cache) and warm (called again and again).
    Cells that would pass ``MAX_UNITS`` per call (the largest buffers at the largest batches
    and reuses) copy the next lower reuse's value: per-nonzero costs fall with reuse, so these
    lean pessimistic."""
    ns = {k: np.zeros((len(REUSES), len(INPUTS), len(BATCHES))) for k in TABLE_KEYS}
    evict = _Evict()  # one buffer for the whole table
    x_all = rng.random(max(INPUTS) * max(BATCHES)).astype(dtype)
    d_all = rng.random(MAX_UNITS // FAN_IN).astype(dtype)
    for r, reuse in enumerate(REUSES):
        for j, n_in in enumerate(INPUTS):
            for i, b in enumerate(BATCHES):
                rows = max(8, reuse * n_in // FAN_IN)
                if r > 0 and rows * FAN_IN * b > MAX_UNITS:
                    for k in TABLE_KEYS:
                        ns[k][r, j, i] = ns[k][r - 1, j, i]
                    continue
                w = fixed_fan_in(rows, n_in, FAN_IN, rng, dtype)
                x = x_all[: n_in * b].reshape(n_in, b)
                d = d_all[: rows * b].reshape(rows, b)
                cold = _kernel_ns(w, x, d, reps, evict)
                warm = _kernel_ns(w, x, d, reps, lambda: None)
                for k, c, h in zip(KERNELS, cold, warm):
                    ns[k][r, j, i], ns[f"{k}_warm"][r, j, i] = c, h
    return KernelTable(BATCHES, INPUTS, REUSES, ns)


STRUCTURED = 16384  # neurons of the RadiX-Net layer timed against a random one
STRUCTURE_BATCHES = (8, 32, 128, 512)


def structure_ratios(dtype: str, rng: np.random.Generator, reps: int = 3) -> Structure:
    """A RadiX-Net layer's kernel times over those of a random layer of its shape (the mean of
    cold and warm caches), per batch size: what the tables, built on random columns, miss on
    layers whose neighbouring rows share columns (``spdnn.workload.locality``)."""
    from .generate import radixnet
    from .workload import locality

    structured = radixnet(STRUCTURED, 1, seed=0, dtype=dtype).layers[0].weight
    random = fixed_fan_in(STRUCTURED, STRUCTURED, FAN_IN, rng, dtype)
    evict = _Evict()
    ratio: dict[str, list[float]] = {k: [] for k in KERNELS}
    for b in STRUCTURE_BATCHES:
        x = rng.random((STRUCTURED, b)).astype(dtype)
        d = rng.random((STRUCTURED, b)).astype(dtype)
        times = [np.add(_kernel_ns(w, x, d, reps, evict), _kernel_ns(w, x, d, reps, lambda: None))
                 for w in (structured, random)]
        for k, r in zip(KERNELS, times[0] / times[1]):
            ratio[k].append(float(r))
    gap = locality([(structured.indptr, structured.indices, structured.shape)])[0]
    return Structure(STRUCTURE_BATCHES, {k: tuple(v) for k, v in ratio.items()},
                     (float(gap[0]), float(gap[1])))


def cache_bytes() -> int:
    """The largest cache this CPU reports (0 when it reports none)."""
    largest = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = [e for e in os.listdir(base) if e.startswith("index")]
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            largest = max(largest, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return largest


def _tiny_step_times(layers: int, dtype: str, reps: int) -> tuple[float, float]:
    """Forward and whole-step seconds of a tiny network (8 neurons per layer, batch 1) on
    this rank alone: the runtime's fixed costs per layer and per step."""
    from .network import Layer, Network
    from .session import open_network

    rng = np.random.default_rng(layers)
    net_layers = [Layer(fixed_fan_in(8, 8, 2, rng, dtype), np.zeros(8, dtype))
                  for _ in range(layers)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.npz")
        save_network(Network(tuple(net_layers)), path)
        run = open_network(Communicator.self_only(), path, None, dtype, exchange="dense")
    dnet = run.dnet
    x = np.ones((8, 1), dtype)
    y = np.zeros(1, np.int64)
    opt = SGD(SGDConfig(0.001, 0.9), dnet.parameters())

    def step() -> None:
        fwd = dnet.forward(x)
        _, _, gw, gb = dnet.backward(fwd, y, "cross_entropy", 1)
        opt.step(interleave(gw, gb))
        dnet.sync()

    forward = _median_time(lambda: [dnet.forward(x) for _ in range(20)], reps) / 20
    whole = _median_time(lambda: [step() for _ in range(20)], reps) / 20
    dnet.grid.free()
    return forward, whole


# Reference networks (widths of 3 fan-in 32 layers, batch sizes): in cache, and far beyond it.
WARM_REFERENCES = (((1024, 1024, 1024), (32, 256)), ((4096, 4096, 4096), (32,)))
COLD_REFERENCES = (((16384, 16384, 16384), (256,)),)


REFERENCE_ROUNDS = 3


class _References:
    """Reference networks opened on this rank alone (one model part), to time real training
    steps: what the kernel tables miss in a real step (caches shared with the other buffers,
    chunked calls) shows up against their prediction."""

    def __init__(self, dtype: str, references: tuple) -> None:
        from .generate import random_network
        from .plan import network_patterns
        from .session import open_network
        from .workload import workload

        self.cases = []
        for sizes, batches in references:
            net = random_network(list(sizes), FAN_IN, seed=1, n_classes=10, dtype=dtype)
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "reference.npz")
                save_network(net, path)
                run = open_network(Communicator.self_only(), path, None, dtype, exchange="dense")
            opt = SGD(SGDConfig(0.001, 0.9), run.dnet.parameters())
            self.cases.append((run.dnet, opt, workload(network_patterns(net), run.plan),
                               batches))

    def steps(self, reps: int = 5) -> list[tuple[object, int, float]]:
        """(workload, batch, median seconds of a step) per reference network and batch."""
        return [(work, batch, _step_time(dnet, opt, batch, reps))  # >= 0.5 s each
                for dnet, opt, work, batches in self.cases for batch in batches]

    def free(self) -> None:
        for dnet, *_ in self.cases:
            dnet.grid.free()


def _step_time(dnet, opt: SGD, batch: int, reps: int) -> float:  # noqa: ANN001
    x = np.ones((dnet.sizes[0], batch), dnet.dtype)
    y = np.zeros(batch, np.int64)

    def step() -> None:
        fwd = dnet.forward(x)
        _, _, gw, gb = dnet.backward(fwd, y, "cross_entropy", batch)
        opt.step(interleave(gw, gb))
        dnet.sync()

    return _median_time(step, reps, min_seconds=0.5)


def compute_scale(steps: list[tuple[object, int, float]], tables: dict[str, KernelTable],
                  runtime: dict[str, float], dtype: str, running: int = 1) -> float:
    """Measured over predicted compute of the reference steps (the median ratio), measured
    with ``running`` ranks at once (sharing the last-level cache)."""
    from .costmodel import Machine, predict

    ones = dict.fromkeys(("compute_scale_alone", "compute_scale_all",
                          "compute_scale_cold_alone", "compute_scale_cold_all"), 1.0)
    shared = {**runtime, **ones, "cache_bytes": runtime["cache_bytes"] / running}
    machine = Machine(Calibration("", 1, "", tables, shared, None))
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

    message = _median_time(lambda: [pair() for _ in range(200)], reps) / 400
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

    exchange_layer = max(_median_time(lambda: [chunked() for _ in range(100)], reps)
                         - _median_time(lambda: [whole() for _ in range(100)], reps), 0.0) / 100
    big = rng.random((4096, 256)).astype(dtype)
    rows = np.sort(rng.choice(4096, 1024, replace=False))
    out = np.empty((1024, 256), dtype)
    pack = _median_time(lambda: np.take(big, rows, axis=0, out=out), reps) / out.nbytes * 1e9
    zz = rng.standard_normal(big.shape).astype(dtype)
    elementwise = _median_time(lambda: kernels.apply_slope(big, zz, None), reps) / big.size * 1e9
    params = [rng.random(2**20).astype(dtype), rng.random(1024).astype(dtype)]
    grads = [p.copy() for p in params]
    opt = SGD(SGDConfig(0.001, 0.9), params)
    opt.step(grads)
    update = _median_time(lambda: opt.step(grads), reps) / (2**20 + 1024) * 1e9
    vec = np.zeros(64, dtype)
    collective = _median_time(lambda: [me.allreduce(vec) for _ in range(100)], reps) / 100
    step = max(float(step0) - 4 * collective, 0.0)  # negative only by noise
    return {"layer_forward_s": layer_f, "layer_backward_s": layer_b, "step_s": step,
            "message_s": message, "exchange_layer_s": exchange_layer,
            "pack_ns_per_byte": pack, "update_ns_per_value": update,
            "elementwise_ns_per_value": elementwise, "collective_s": collective,
            "cache_bytes": float(cache_bytes())}


def network_costs(comm: Communicator, message_s: float, reps: int = 20) -> Network | None:
    """Latency and bandwidth between ranks 0 and 1 (ping-pong), and of the all-reduce over
    every rank; None on one rank."""
    if comm.size < 2:
        return None
    half, ar = [], []
    for size in SIZES:  # the median of single round trips: robust to a busy machine
        buf = np.zeros(size // 8, np.float64)
        comm.barrier()
        trips = []
        for _ in range(reps):
            t = time.perf_counter()
            if comm.rank == 0:
                comm.waitall([comm.isend(buf, 1, 9)])
                comm.waitall([comm.irecv(buf, 1, 9)])
            elif comm.rank == 1:
                comm.waitall([comm.irecv(buf, 0, 9)])
                comm.waitall([comm.isend(buf, 0, 9)])
            trips.append(time.perf_counter() - t)
        half.append(float(np.median(trips)) / 2)
        comm.barrier()
        sums = []
        for _ in range(reps):
            t = time.perf_counter()
            comm.waitall([comm.iallreduce_sum(buf)])
            sums.append(time.perf_counter() - t)
        ar.append(float(np.median(sums)))
    half_t, ar_t = comm.bcast((half, ar))
    sizes = np.array(SIZES, float)
    lat, bw = _fit(sizes, np.array(half_t))
    ar_lat, ar_bw = _fit(sizes, np.array(ar_t))
    latency = max(lat - 2 * message_s, 0.0)
    return Network(latency, bw, ar_lat, ar_bw, tuple(float(s) for s in SIZES),
                   tuple(float(t) for t in half_t))


def _fit(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """t = latency + size / bandwidth: the latency from the smallest size, the bandwidth from
    the largest against the smallest (the difference of the two largest, used before, swung
    by 6x between runs on a busy machine)."""
    bw = (sizes[-1] - sizes[0]) / max(times[-1] - times[0], 1e-12)
    return float(times[0]), float(bw)


def reference_scales(comm: Communicator, dtype: str, tables: dict[str, KernelTable],
                     runtime: dict[str, float]) -> dict[str, float]:
    """The four compute scales (warm / cold reference networks, rank 0 alone / every rank at
    once), each the median of interleaved rounds (the host's speed drifts), and their spread:
    the largest relative distance of a round from its median."""
    rounds: dict[str, list[float]] = {}
    for suffix, refs in (("", WARM_REFERENCES), ("_cold", COLD_REFERENCES)):
        ref = _References(dtype, refs)
        for _ in range(REFERENCE_ROUNDS):
            comm.barrier()
            alone = compute_scale(ref.steps(), tables, runtime, dtype) if comm.rank == 0 else 0.0
            comm.barrier()
            together = compute_scale(ref.steps(), tables, runtime, dtype, comm.size)
            rounds.setdefault(f"compute_scale{suffix}_alone", []).append(
                float(comm.bcast(alone)))
            rounds.setdefault(f"compute_scale{suffix}_all", []).append(
                float(comm.allreduce(np.array([together]))[0] / comm.size))
        ref.free()
    out = {k: float(np.median(v)) for k, v in rounds.items()}
    out["compute_scale_spread"] = max(float(np.max(np.abs(np.array(v) / out[k] - 1)))
                                      for k, v in rounds.items())
    return out


def calibrate(comm: Communicator, dtypes: tuple[str, ...] = ("float32", "float64"),
              log: Callable[[str], None] | None = None) -> Calibration:
    """Measure on every rank of ``comm``; every rank returns the same calibration."""
    kernels.warm_up()
    rng = np.random.default_rng(comm.rank)
    say = log or (lambda _msg: None)
    tables = {}
    for dt in dtypes:
        say(f"kernels, {dt}: {len(KERNELS)} products x {len(REUSES)} reuses x {len(INPUTS)} "
            f"input sizes x {len(BATCHES)} batch sizes")
        comm.barrier()
        tables[dt] = kernel_table(dt, rng)
    say(f"a RadiX-Net layer against a random one, {dtypes[0]}: structured columns")
    comm.barrier()
    mine = structure_ratios(dtypes[0], rng)
    structure = Structure(mine.batches, {k: tuple(float(x) for x in comm.allreduce(
        np.array(v)) / comm.size) for k, v in mine.ratio.items()}, mine.gap)
    say("fixed costs of the runtime (per layer, step, message) and element-wise work")
    comm.barrier()
    runtime = runtime_costs(dtypes[0], rng)
    # The mean over ranks: all measured at once, as in a job.
    for dt, t in tables.items():
        tables[dt] = KernelTable(t.batches, t.inputs, t.reuses,
                                 {k: comm.allreduce(v) / comm.size for k, v in t.ns.items()})
    keys = sorted(runtime)
    mean = comm.allreduce(np.array([runtime[k] for k in keys])) / comm.size
    runtime = dict(zip(keys, (float(v) for v in mean)))
    say(f"real steps of reference networks in and beyond the cache, {REFERENCE_ROUNDS} rounds: "
        "rank 0 alone, then every rank at once")
    runtime.update(reference_scales(comm, dtypes[0], tables, runtime))
    if comm.size > 1:
        say(f"network: ping-pong between ranks 0 and 1, all-reduce over {comm.size} ranks")
    network = network_costs(comm, runtime["message_s"])
    host = f"{socket.gethostname()} ({platform.processor() or platform.machine()})"
    return Calibration(host, comm.size, kernels.backend(), tables, runtime, network, structure)


def run_calibrate(comm: Communicator, output: str, dtype: str) -> int:
    """``spdnn calibrate``: measure, then rank 0 writes the file (checked before measuring)."""
    import json

    from .atomic import write_text
    from .options import check_outputs

    comm.check(lambda: check_outputs([("--output", output)]) if comm.rank == 0 else None)
    start = time.perf_counter()

    def log(msg: str) -> None:
        if comm.rank == 0:
            print(f"[{time.perf_counter() - start:6.1f} s] {msg}", flush=True)

    dtypes = ("float32", "float64") if dtype == "both" else (dtype,)
    cal = calibrate(comm, dtypes, log)
    comm.check(lambda: write_text(output, json.dumps(cal.to_json(), indent=1) + "\n")
               if comm.rank == 0 else None)
    if comm.rank == 0:
        net = cal.network
        where = "no network part (1 rank: give spdnn-partition model a --cluster file)" \
            if net is None else (f"ping-pong latency {net.latency_s * 1e6:.1f} us beyond the "
                                 f"{cal.runtime['message_s'] * 1e6:.1f} us of software per "
                                 f"message, {net.bandwidth_Bps / 1e9:.1f} GB/s")
        print(f"wrote {output}: {comm.size} rank(s), backend {cal.backend}, "
              f"{cal.runtime['layer_forward_s'] * 1e6:.0f} + "
              f"{cal.runtime['layer_backward_s'] * 1e6:.0f} us fixed per layer (forward + "
              f"backward); {where}; {time.perf_counter() - start:.0f} s", flush=True)
        spread = cal.runtime["compute_scale_spread"]
        print(f"the host's speed moved up to {spread:.0%} between the {REFERENCE_ROUNDS} rounds "
              "of reference steps: predictions from this file carry at least that much noise"
              + ("; calibrate again when the host is quieter" if spread > 0.15 else ""),
              flush=True)
    return 0
