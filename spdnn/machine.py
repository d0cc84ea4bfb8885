"""What a machine costs: the calibration ``spdnn calibrate`` measures (kernels, the runtime's
fixed costs, the network between two ranks) and a cluster description that overrides the
network part. Both are small JSON files, validated field by field when read.

Calibration (``spdnn-calibration/1``)::

    {"format": "spdnn-calibration/1", "host": "...", "ranks": 2, "backend": "numba",
     "kernels": {"float32": K, "float64": K},
     "runtime": {"layer_forward_s", "layer_backward_s", "step_s", "message_s",
                 "exchange_layer_s", "pack_ns_per_byte", "update_ns_per_value",
                 "elementwise_ns_per_value", "collective_s",
                 "compute_scale_alone", "compute_scale_all"},
     "network": {"latency_s", "bandwidth_Bps", "allreduce_latency_s",
                 "allreduce_bandwidth_Bps"} or null}

where K = {"batches": [...], "inputs": [...], "forward": T, "backward": T, "gradient": T} and
T[j][i] is ns per stored nonzero x sample at inputs[j] buffer rows and batches[i] samples.
``compute_scale_alone`` / ``_all``: measured over predicted kernel time of real training steps
of reference networks, with one rank running and with every calibrated rank running at once
(what isolated kernel loops miss: caches shared with a step's other buffers, contention).

Cluster (``spdnn-cluster/1``)::

    {"format": "spdnn-cluster/1", "name": "...", "ranks_per_node": 64,
     "intra_node": {"latency_us": 0.4, "bandwidth_GBps": 8.0},
     "inter_node": {"latency_us": 1.3, "bandwidth_GBps": 23.0},
     "sources": ["..."], "assumptions": "..."}

``inter_node.bandwidth_GBps`` is one node's injection bandwidth, shared by its ranks;
``intra_node`` is per rank pair.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InputError

CALIBRATION_FORMAT = "spdnn-calibration/1"
CLUSTER_FORMAT = "spdnn-cluster/1"
KERNELS = ("forward", "backward", "gradient")
RUNTIME = ("layer_forward_s", "layer_backward_s", "step_s", "message_s", "exchange_layer_s",
           "pack_ns_per_byte", "update_ns_per_value", "elementwise_ns_per_value",
           "collective_s", "compute_scale_alone", "compute_scale_all")
NETWORK = ("latency_s", "bandwidth_Bps", "allreduce_latency_s", "allreduce_bandwidth_Bps")


@dataclass(frozen=True)
class KernelTable:
    """ns per nonzero x sample of the three local products, on a grid of batch sizes and
    X-buffer rows; looked up by bilinear interpolation in log2 of both (clamped)."""

    batches: tuple[int, ...]
    inputs: tuple[int, ...]
    ns: dict[str, np.ndarray]  # kernel -> (len(inputs), len(batches))

    def seconds(self, kernel: str, nnz: np.ndarray, batch: int, inputs: np.ndarray
                ) -> np.ndarray:
        """Time of ``kernel`` over ``nnz`` nonzeros (per rank) with ``batch`` samples."""
        table = self.ns[kernel]
        xb = _position(self.batches, np.array([max(batch, 1)], float))
        xi = _position(self.inputs, np.maximum(np.asarray(inputs, float), 1.0))
        i0, fb = np.floor(xb).astype(int), xb - np.floor(xb)
        j0, fi = np.floor(xi).astype(int), xi - np.floor(xi)
        i1 = np.minimum(i0 + 1, len(self.batches) - 1)
        j1 = np.minimum(j0 + 1, len(self.inputs) - 1)
        per = ((1 - fi) * ((1 - fb) * table[j0, i0] + fb * table[j0, i1])
               + fi * ((1 - fb) * table[j1, i0] + fb * table[j1, i1]))
        return np.asarray(nnz, float) * batch * per * 1e-9


def _position(grid: tuple[int, ...], values: np.ndarray) -> np.ndarray:
    """Fractional index of ``values`` on ``grid`` in log2, clamped to the grid."""
    g = np.log2(np.array(grid, float))
    v = np.clip(np.log2(values), g[0], g[-1])
    return np.interp(v, g, np.arange(len(g), dtype=float))


@dataclass(frozen=True)
class Network:
    """Point-to-point latency (s) and per-rank bandwidth (bytes/s), and the same for the
    all-reduce's steps."""

    latency_s: float
    bandwidth_Bps: float
    allreduce_latency_s: float
    allreduce_bandwidth_Bps: float


@dataclass(frozen=True)
class Calibration:
    host: str
    ranks: int
    backend: str
    kernels: dict[str, KernelTable]  # dtype name -> table
    runtime: dict[str, float]
    network: Network | None

    def table(self, dtype: str) -> KernelTable:
        return self.kernels.get(dtype) or next(iter(self.kernels.values()))

    def to_json(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, "host": self.host, "ranks": self.ranks,
                "backend": self.backend,
                "kernels": {d: {"batches": list(t.batches), "inputs": list(t.inputs),
                                **{k: t.ns[k].round(4).tolist() for k in KERNELS}}
                            for d, t in self.kernels.items()},
                "runtime": dict(self.runtime),
                "network": None if self.network is None else dict(vars(self.network))}


@dataclass(frozen=True)
class Cluster:
    name: str
    ranks_per_node: int
    intra: Network
    inter: Network  # bandwidth: one node's injection bandwidth
    sources: tuple[str, ...]
    assumptions: str


def _number(path: str, where: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(path, f"{where} must be a finite number (got {value!r})")
    if value < 0 or (positive and value == 0):
        raise InputError(path, f"{where} must be {'> 0' if positive else '>= 0'} (got {value})")
    return float(value)


def _field(path: str, obj: Any, key: str, where: str = "") -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(path, f"missing field {where + key!r}")
    return obj[key]


def _read_json(path: str | os.PathLike, fmt: str) -> tuple[str, dict]:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            if os.fstat(f.fileno()).st_size > 16 * 2**20:
                raise InputError(path, "larger than 16 MiB: not a machine description")
            data = json.load(f)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise InputError(path, f"not a {fmt} file (its 'format' field must be {fmt!r})")
    return path, data


def load_calibration(path: str | os.PathLike) -> Calibration:
    path, data = _read_json(path, CALIBRATION_FORMAT)
    kernels = {}
    raw = _field(path, data, "kernels")
    if not isinstance(raw, dict) or not raw or not set(raw) <= {"float32", "float64"}:
        raise InputError(path, "'kernels' must map float32 and/or float64 to tables")
    for dtype, t in raw.items():
        axes = []
        for axis in ("batches", "inputs"):
            v = _field(path, t, axis, f"kernels.{dtype}.")
            if not (isinstance(v, list) and 1 <= len(v) <= 64 and all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)
                    and v == sorted(set(v))):
                raise InputError(path, f"kernels.{dtype}.{axis} must be increasing integers >= 1")
            axes.append(tuple(v))
        ns = {}
        for k in KERNELS:
            v = _field(path, t, k, f"kernels.{dtype}.")
            arr = np.array(v, dtype=object)
            if arr.shape != (len(axes[1]), len(axes[0])):
                raise InputError(path, f"kernels.{dtype}.{k} must be {len(axes[1])} rows of "
                                       f"{len(axes[0])} numbers")
            ns[k] = np.array([[_number(path, f"kernels.{dtype}.{k}", x, positive=True)
                               for x in row] for row in v])
        kernels[dtype] = KernelTable(axes[0], axes[1], ns)
    rt = _field(path, data, "runtime")
    runtime = {k: _number(path, f"runtime.{k}", _field(path, rt, k, "runtime.")) for k in RUNTIME}
    net = _field(path, data, "network")
    network = None
    if net is not None:
        vals = {k: _number(path, f"network.{k}", _field(path, net, k, "network."),
                           positive=k.endswith("Bps")) for k in NETWORK}
        network = Network(**vals)
    ranks = _field(path, data, "ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise InputError(path, "'ranks' must be an integer >= 1")
    return Calibration(str(data.get("host", "?")), ranks, str(data.get("backend", "?")),
                       kernels, runtime, network)


def load_cluster(path: str | os.PathLike) -> Cluster:
    path, data = _read_json(path, CLUSTER_FORMAT)
    rpn = _field(path, data, "ranks_per_node")
    if isinstance(rpn, bool) or not isinstance(rpn, int) or not 1 <= rpn <= 2**20:
        raise InputError(path, f"ranks_per_node must be an integer from 1 to 2**20 (got {rpn!r})")
    links = []
    for name in ("intra_node", "inter_node"):
        link = _field(path, data, name)
        lat = _number(path, f"{name}.latency_us",
                      _field(path, link, "latency_us", f"{name}."))
        bw = _number(path, f"{name}.bandwidth_GBps",
                     _field(path, link, "bandwidth_GBps", f"{name}."), positive=True)
        links.append(Network(lat * 1e-6, bw * 1e9, lat * 1e-6, bw * 1e9))
    sources = data.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise InputError(path, "'sources' must be a list of strings")
    return Cluster(str(data.get("name", os.path.basename(path))), rpn, links[0], links[1],
                   tuple(sources), str(data.get("assumptions", "")))
