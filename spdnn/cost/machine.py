"""What a machine costs: the calibration ``spdnn calibrate`` measures (kernels, the runtime's
fixed costs, the network between two ranks) and a cluster description that overrides the
network part. Both are small JSON files, declared as typed structures in
``spdnn.io.jsonfiles`` and validated field by field when read; the calibration's fields, and
what each measures, are described in docs/formats.md ("Calibration"). One concern: the two
machine files and their lookup tables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spdnn.io.jsonfiles import CalibrationFile
from spdnn.io.jsonread import read

CALIBRATION_FORMAT = "spdnn-calibration/2"
KERNELS = ("forward", "backward", "gradient")
TABLE_KEYS = KERNELS + tuple(f"{k}_warm" for k in KERNELS)
RUNTIME = ("layer_forward_s", "layer_backward_s", "step_s", "message_s", "exchange_layer_s",
           "pack_ns_per_byte", "update_ns_per_value", "elementwise_ns_per_value",
           "collective_s", "compute_scale_alone", "compute_scale_all",
           "compute_scale_cold_alone", "compute_scale_cold_all", "cache_bytes")
# Optional runtime fields (absent from calibrations of 2026-11-23/24): their default.
RUNTIME_OPTIONAL = {"compute_scale_spread": 0.0, "gather_ns_per_value": 0.0,
                    "round_ns_per_value": 0.0}
NETWORK = ("latency_s", "bandwidth_Bps", "allreduce_latency_s", "allreduce_bandwidth_Bps",
           "cpu_ns_per_byte")


@dataclass(frozen=True)
class DenseTable:
    """ns per nonzero x sample of the three products of a dense layer (the runtime hands
    those to BLAS), per layer size (nonzeros) and batch; bilinear in log2 of both, clamped."""

    nnz: tuple[int, ...]
    batches: tuple[int, ...]
    ns: dict[str, np.ndarray]  # kernel -> (len(nnz), len(batches))

    def seconds(self, kernel: str, nnz: np.ndarray, batch: int) -> np.ndarray:
        nnz = np.asarray(nnz, float)
        xb = _position(self.batches, np.array([max(batch, 1)], float))
        xn = _position(self.nnz, np.maximum(nnz, 1.0))
        per = np.zeros(xn.shape)
        for n_idx, n_w in _corners(xn, len(self.nnz)):
            for b_idx, b_w in _corners(xb, len(self.batches)):
                per = per + n_w * b_w * self.ns[kernel][n_idx, b_idx]
        return nnz * batch * per * 1e-9

    def to_json(self) -> dict[str, Any]:
        return {"nnz": list(self.nnz), "batches": list(self.batches),
                **{k: self.ns[k].round(4).tolist() for k in KERNELS}}


@dataclass(frozen=True, kw_only=True)
class KernelTable:
    """ns per nonzero x sample of the three local products, on a grid of batch sizes, X-buffer
    rows and reuse (nonzeros per buffer row they read); looked up by trilinear interpolation
    in log2 of all three (clamped to the grid)."""

    batches: tuple[int, ...]
    inputs: tuple[int, ...]
    reuses: tuple[int, ...]
    ns: dict[str, np.ndarray]  # kernel -> (len(reuses), len(inputs), len(batches))
    dense: DenseTable | None = None  # dense layers (absent from files before 2026-11-25)

    def seconds(self, kernel: str, nnz: np.ndarray, batch: int, inputs: np.ndarray,
                reuse: np.ndarray | None = None) -> np.ndarray:
        """Time of ``kernel`` (a key of ``ns``: ``forward``, ``forward_warm``, ...) over ``nnz``
        nonzeros (per rank) with ``batch`` samples, reading a buffer of ``inputs`` rows
        ``reuse`` times each (default: nnz / inputs)."""
        nnz = np.asarray(nnz, float)
        inputs = np.maximum(np.asarray(inputs, float), 1.0)
        if reuse is None:
            reuse = nnz / inputs
        table = self.ns[kernel]
        xb = _position(self.batches, np.array([max(batch, 1)], float))
        xi = _position(self.inputs, inputs)
        xr = _position(self.reuses, np.maximum(np.asarray(reuse, float), 2.0**-20))
        per = np.zeros(np.broadcast(xi, xr).shape)
        for r_idx, r_w in _corners(xr, len(self.reuses)):
            for i_idx, i_w in _corners(xi, len(self.inputs)):
                for b_idx, b_w in _corners(xb, len(self.batches)):
                    per = per + r_w * i_w * b_w * table[r_idx, i_idx, b_idx]
        return nnz * batch * per * 1e-9


def _corners(x: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The two grid indices around fractional positions ``x`` and their weights."""
    lo = np.floor(x).astype(int)
    frac = x - lo
    return [(lo, 1 - frac), (np.minimum(lo + 1, n - 1), frac)]


def _position(grid: tuple[int, ...], values: np.ndarray) -> np.ndarray:
    """Fractional index of ``values`` on ``grid`` in log2, clamped to the grid."""
    g = np.log2(np.array(grid, float))
    v = np.clip(np.log2(values), g[0], g[-1])
    return np.interp(v, g, np.arange(len(g), dtype=float))


@dataclass(frozen=True, kw_only=True)
class Network:
    """Point-to-point latency (s) and per-rank bandwidth (bytes/s), and the same for the
    all-reduce's steps; optionally the measured ping-pong curve (message bytes, half a round
    trip in seconds), which replaces ``bytes / bandwidth``: through shared memory the rate
    grows with the message, several-fold from 128 KiB to 16 MiB; and the
    measured all-reduce curve (bytes per rank, seconds) over the calibrated ranks."""

    latency_s: float
    bandwidth_Bps: float
    allreduce_latency_s: float
    allreduce_bandwidth_Bps: float
    pingpong_bytes: tuple[float, ...] = ()
    pingpong_s: tuple[float, ...] = ()
    allreduce_bytes: tuple[float, ...] = ()
    allreduce_s: tuple[float, ...] = ()
    cpu_ns_per_byte: float = 0.0  # each end's CPU per byte crossing nodes (TCP's stack)

    def allreduce(self, nbytes: float) -> float | None:
        """Seconds of a blocking all-reduce of ``nbytes`` per rank over the calibrated ranks,
        from the measured curve (None without one)."""
        if len(self.allreduce_bytes) < 2:
            return None
        return float(_curve(self.allreduce_bytes, self.allreduce_s, np.asarray(nbytes, float),
                            self.allreduce_bandwidth_Bps, from_zero=False))

    def transfer(self, nbytes: np.ndarray) -> np.ndarray:
        """Seconds a message of ``nbytes`` takes beyond the latency: the ping-pong curve
        interpolated linearly (past its end at its last segment's rate), else the bandwidth."""
        nbytes = np.asarray(nbytes, float)
        if len(self.pingpong_bytes) < 2:
            return nbytes / self.bandwidth_Bps
        return _curve(self.pingpong_bytes, self.pingpong_s, nbytes, self.bandwidth_Bps,
                      from_zero=True)


def _curve(sizes: tuple[float, ...], seconds: tuple[float, ...], nbytes: np.ndarray,
           bandwidth: float, from_zero: bool) -> np.ndarray:
    """A measured time curve interpolated linearly (past its end at its last segment's rate;
    ``from_zero``: less its first point, the time beyond the latency)."""
    size, t = np.array(sizes), np.array(seconds)
    t = np.maximum.accumulate(t - t[0] if from_zero else t)  # a noisy dip is not faster
    rate = max((t[-1] - t[-2]) / (size[-1] - size[-2]), 1.0 / bandwidth * 1e-3)
    inside = np.interp(nbytes, size, t)
    return np.where(nbytes > size[-1], t[-1] + (nbytes - size[-1]) * rate, inside)


@dataclass(frozen=True)
class Structure:
    """A RadiX-Net layer's kernel times over a random layer's of the same shape, per batch
    size, and its ``spdnn.cost.workload.locality`` (forward, backward): how much faster products
    run whose neighbouring rows share columns."""

    batches: tuple[int, ...]
    ratio: dict[str, tuple[float, ...]]  # kernel -> per batch
    gap: tuple[float, float]

    def factor(self, kernel: str, batch: int, gap: float) -> float:
        """Time factor of ``kernel`` on a layer of locality ``gap`` (0: random, 1x)."""
        ref = self.gap[1 if kernel == "backward" else 0]
        if ref <= 0 or gap <= 0:
            return 1.0
        rho = float(np.interp(np.log2(max(batch, 1)), np.log2(np.array(self.batches, float)),
                              np.array(self.ratio[kernel])))
        return 1.0 + (rho - 1.0) * min(gap / ref, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"batches": list(self.batches), **{k: list(v) for k, v in self.ratio.items()},
                "gap_forward": self.gap[0], "gap_backward": self.gap[1]}


SCALE_KEYS = ("alone", "all", "cold_alone", "cold_all")


@dataclass(frozen=True)
class Scales:
    """Real training steps over kernel-table predictions (``runtime.compute_scale_*``), per
    batch size of the reference steps."""

    batches: tuple[int, ...]
    values: dict[str, tuple[float, ...]]  # SCALE_KEYS -> per batch

    def at(self, batch: int) -> dict[str, float]:
        g = np.log2(np.array(self.batches, float))
        x = float(np.clip(np.log2(max(batch, 1)), g[0], g[-1]))
        return {f"compute_scale_{k}": float(np.interp(x, g, np.array(v)))
                for k, v in self.values.items()}

    def to_json(self) -> dict[str, Any]:
        return {"batches": list(self.batches), **{k: list(v) for k, v in self.values.items()}}


@dataclass(frozen=True, kw_only=True)
class Calibration:
    host: str
    ranks: int
    backend: str
    kernels: dict[str, KernelTable]  # dtype name -> table
    runtime: dict[str, float]
    network: Network | None
    structure: Structure | None = None
    scales: Scales | None = None
    # ns per stored value of each optimizer's update, by name (empty in older files)
    updates: dict[str, float] = field(default_factory=dict)

    def table(self, dtype: str) -> KernelTable:
        """``dtype``'s kernel tables; a file without them gives float32's (else its first)."""
        return self.kernels.get(dtype) or self.kernels.get("float32") \
            or next(iter(self.kernels.values()))

    def round_ns(self) -> float:
        """ns per weight of a bfloat16 step's rounded copy of the master weights: measured,
        or (a file that did not measure it) an element-wise pass's."""
        return self.runtime.get("round_ns_per_value") or self.runtime["elementwise_ns_per_value"]

    def update_ns(self, optimizer: str) -> float:
        """ns per stored value of ``optimizer``'s update: measured, or SGD's in a file that
        measured only SGD's."""
        return self.updates.get(optimizer, self.runtime["update_ns_per_value"])

    def scales_at(self, batch: int) -> dict[str, float]:
        """The four compute scales for ``batch`` samples per rank (the file's single values
        when it has none per batch)."""
        if self.scales is None:
            return {f"compute_scale_{k}": self.runtime[f"compute_scale_{k}"] for k in SCALE_KEYS}
        return self.scales.at(batch)

    def to_json(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, "host": self.host, "ranks": self.ranks,
                "backend": self.backend,
                "kernels": {d: {"batches": list(t.batches), "inputs": list(t.inputs),
                                "reuses": list(t.reuses),
                                **{k: t.ns[k].round(4).tolist() for k in TABLE_KEYS},
                                **({} if t.dense is None else {"dense": t.dense.to_json()})}
                            for d, t in self.kernels.items()},
                "runtime": {**self.runtime,
                            **({"updates_ns_per_value": dict(self.updates)} if self.updates
                               else {})},
                "structure": None if self.structure is None else self.structure.to_json(),
                **({} if self.scales is None else {"scales": self.scales.to_json()}),
                "network": None if self.network is None else {
                    **{k: getattr(self.network, k) for k in NETWORK},
                    "pingpong": {"bytes": list(self.network.pingpong_bytes),
                                 "seconds": list(self.network.pingpong_s)},
                    **({} if not self.network.allreduce_bytes else {"allreduce": {
                        "bytes": list(self.network.allreduce_bytes),
                        "seconds": list(self.network.allreduce_s)}})}}


def load_calibration(path: str | os.PathLike) -> Calibration:
    """A calibration file (``spdnn-calibration/2``), validated field by field
    (``spdnn.io.jsonfiles.CalibrationFile``)."""
    f = read(path, CalibrationFile)
    kernels = {}
    for dtype, t in f.kernels.items():
        dense = None if t.dense is None else DenseTable(
            nnz=tuple(t.dense.nnz), batches=tuple(t.dense.batches),
            ns={k: np.array(getattr(t.dense, k), float) for k in KERNELS})
        kernels[dtype] = KernelTable(batches=tuple(t.batches), inputs=tuple(t.inputs),
                                     reuses=tuple(t.reuses),
                                     ns={k: np.array(getattr(t, k), float) for k in TABLE_KEYS},
                                     dense=dense)
    runtime = {k: float(getattr(f.runtime, k)) for k in (*RUNTIME, *RUNTIME_OPTIONAL)}
    network = None
    if f.network is not None:
        n, ar = f.network, f.network.allreduce
        network = Network(latency_s=n.latency_s, bandwidth_Bps=n.bandwidth_Bps,
                          allreduce_latency_s=n.allreduce_latency_s,
                          allreduce_bandwidth_Bps=n.allreduce_bandwidth_Bps,
                          pingpong_bytes=tuple(n.pingpong.bytes),
                          pingpong_s=tuple(n.pingpong.seconds),
                          allreduce_bytes=tuple(ar.bytes) if ar else (),
                          allreduce_s=tuple(ar.seconds) if ar else (),
                          cpu_ns_per_byte=n.cpu_ns_per_byte)
    s, sc = f.structure, f.scales
    structure = None if s is None else Structure(
        tuple(s.batches), {k: tuple(getattr(s, k)) for k in KERNELS},
        (s.gap_forward, s.gap_backward))
    scales = None if sc is None else Scales(tuple(sc.batches),
                                            {k: tuple(getattr(sc, k)) for k in SCALE_KEYS})
    return Calibration(host=f.host, ranks=f.ranks, backend=f.backend, kernels=kernels,
                       runtime=runtime, network=network, structure=structure, scales=scales,
                       updates={k: float(v) for k, v in f.runtime.updates_ns_per_value.items()})
