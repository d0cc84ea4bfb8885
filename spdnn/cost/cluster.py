"""The network a step runs on: a cluster description (``spdnn-cluster/1``), which overrides
the network part of a calibration, and the ``Machine`` that joins the two for the cost model
(link and gradient-sum times within and across nodes).

Cluster (``spdnn-cluster/1``)::

    {"format": "spdnn-cluster/1", "name": "...", "ranks_per_node": 64,
     "intra_node": {"latency_us": 0.4, "bandwidth_GBps": 8.0},
     "inter_node": {"latency_us": 1.3, "bandwidth_GBps": 23.0, "cpu_ns_per_byte": 0.0},
     "node_memory_bandwidth_GBps": 330.0, "node_memory_GB": 256, "sources": ["..."],
     "assumptions": "..."}

``inter_node.bandwidth_GBps`` is one node's injection bandwidth, shared by its ranks;
``intra_node`` is per rank pair. Optional: ``inter_node.cpu_ns_per_byte``, the CPU time each
end spends per byte that crosses nodes, which no transfer overlaps: TCP's stack copies and
processes every byte on the cores that compute (``spdnn calibrate`` measures it between two
ranks on two nodes); over RDMA a NIC moves the bytes and it is 0, the default. Optional:
``node_memory_bandwidth_GBps``, a node's sustained memory bandwidth; a message or all-reduce
within a node then gets at most its share of it, each byte moved costing a read and a write
(without it, the pairs' bandwidth is assumed to hold for every rank of the node at once).
Optional: ``node_memory_GB``, a node's memory: ``--replicas auto`` then considers only grids
whose predicted peak per rank fits its share.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np

from spdnn.cost.machine import Calibration, Network, load_calibration
from spdnn.io.jsonfiles import ClusterFile
from spdnn.io.jsonread import read


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    ranks_per_node: int
    intra: Network
    inter: Network  # bandwidth: one node's injection bandwidth
    sources: tuple[str, ...]
    assumptions: str
    memory_bandwidth_Bps: float | None = None  # a node's, shared by its ranks' copies
    memory_bytes: float | None = None  # a node's memory, shared by its ranks

    @property
    def rank_memory(self) -> int | None:
        """Bytes a rank may hold: the node's memory over its ranks (None: not given)."""
        return None if self.memory_bytes is None else int(self.memory_bytes
                                                          // self.ranks_per_node)

    def intra_bandwidth(self, active_per_node: int) -> float:
        """A rank pair's bandwidth within a node while ``active_per_node`` ranks copy at once:
        the pair's own, or the rank's share of the node's memory bandwidth (a read and a
        write per byte), whichever is less."""
        bw = self.intra.bandwidth_Bps
        if self.memory_bandwidth_Bps is None:
            return bw
        return min(bw, self.memory_bandwidth_Bps / (2 * max(1, active_per_node)))


def load_cluster(path: str | os.PathLike) -> Cluster:
    """A cluster description (``spdnn-cluster/1``, ``spdnn.io.jsonfiles.ClusterFile``)."""
    f = read(path, ClusterFile)
    links = [Network(latency_s=link.latency_us * 1e-6, bandwidth_Bps=link.bandwidth_GBps * 1e9,
                     allreduce_latency_s=link.latency_us * 1e-6,
                     allreduce_bandwidth_Bps=link.bandwidth_GBps * 1e9,
                     cpu_ns_per_byte=getattr(link, "cpu_ns_per_byte", 0.0))
             for link in (f.intra_node, f.inter_node)]
    memory = f.node_memory_bandwidth_GBps
    return Cluster(name=f.name or os.path.basename(os.fspath(path)),
                   ranks_per_node=f.ranks_per_node, intra=links[0], inter=links[1],
                   sources=tuple(f.sources), assumptions=f.assumptions,
                   memory_bandwidth_Bps=None if memory is None else memory * 1e9,
                   memory_bytes=None if f.node_memory_GB is None else f.node_memory_GB * 1e9)


@dataclass(frozen=True)
class Machine:
    """A calibration and, optionally, a cluster whose network replaces the measured one."""

    calibration: Calibration
    cluster: Cluster | None = None

    def check(self) -> None:
        if self.cluster is None and self.calibration.network is None:
            raise ValueError("the calibration has no network part (it was measured on one "
                             "rank): give a cluster description, or calibrate on 2 ranks")

    @property
    def ranks_per_node(self) -> int:
        return self.cluster.ranks_per_node if self.cluster else 2**62

    def compute_scale(self, active: int, warm: np.ndarray | float = 1.0, batch: int = 256
                      ) -> np.ndarray:
        """Real steps over kernel tables with ``active`` ranks running on a node and ``batch``
        samples per rank: measured alone and with all calibrated ranks at once (the slowest
        rank), linear in between, the latter beyond (more ranks per node than calibrated:
        assumed no worse than those); from reference steps that run in cache and from one
        that does not, blended by ``warm``."""
        rt, ranks = self.calibration.scales_at(batch), self.calibration.ranks
        share = 0.0 if active <= 1 or ranks <= 1 else min(1.0, (active - 1) / (ranks - 1))
        hot = rt["compute_scale_alone"] + (rt["compute_scale_all"] - rt["compute_scale_alone"]) \
            * share
        cold = rt["compute_scale_cold_alone"] + (rt["compute_scale_cold_all"]
                                                 - rt["compute_scale_cold_alone"]) * share
        return np.asarray(warm * hot + (1 - np.asarray(warm)) * cold, float)

    def link(self, nbytes: np.ndarray, same_node: np.ndarray, active_per_node: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """Latency and transfer seconds of messages of ``nbytes`` within or across nodes
        (across: the node's injection bandwidth shared by its active ranks; within: at most
        a rank's share of the node's memory bandwidth, when the cluster gives it)."""
        if self.cluster is None:
            net = self.calibration.network
            assert net is not None
            return np.full(same_node.shape, net.latency_s), net.transfer(nbytes)
        intra, inter = self.cluster.intra, self.cluster.inter
        share = inter.bandwidth_Bps / max(1, active_per_node)
        within = np.maximum(intra.transfer(nbytes),
                            nbytes / self.cluster.intra_bandwidth(active_per_node))
        return (np.where(same_node, intra.latency_s, inter.latency_s),
                np.where(same_node, within, nbytes / share))

    @property
    def stack_s_per_byte(self) -> float:
        """Each end's CPU seconds per byte crossing nodes (0 without a cluster: every rank is
        then on one node, where the copies are charged as such)."""
        return 0.0 if self.cluster is None else self.cluster.inter.cpu_ns_per_byte * 1e-9

    def gradient_sum_stages(self, parts: int, replicas: int, active_per_node: int
                            ) -> list[tuple[Network, int, float]]:
        """The gradient sum over ``replicas`` as MPI is assumed to run it, node-aware (MPICH's
        SMP all-reduce: within each node, across nodes, within again), in its bandwidth-optimal
        form: (network, ranks, share of the bytes) per stage. Within a node the members of a
        replica group sum the whole gradient; across nodes each sums its 1/members slice with
        one member per node, every rank of a node at once through the node's port."""
        members = max(1, min(replicas, self.ranks_per_node // max(parts, 1)))
        nodes = -(-replicas // members)
        stages = [(self.allreduce_network(False, active_per_node), members, 1.0)]
        if nodes > 1:
            stages.append((self.allreduce_network(True, active_per_node), nodes, 1.0 / members))
        return stages

    def allreduce_network(self, spans_nodes: bool, active_per_node: int) -> Network:
        """The network of an all-reduce within or across nodes; its ``cpu_ns_per_byte`` is
        the stack's across nodes, else 0 (within a node the copies are the sum's own)."""
        if self.cluster is None:
            assert self.calibration.network is not None
            return replace(self.calibration.network, cpu_ns_per_byte=0.0)
        net = self.cluster.inter if spans_nodes else self.cluster.intra
        bw = net.bandwidth_Bps / max(1, active_per_node) if spans_nodes else \
            self.cluster.intra_bandwidth(active_per_node)
        return Network(latency_s=net.latency_s, bandwidth_Bps=bw,
                       allreduce_latency_s=net.latency_s, allreduce_bandwidth_Bps=bw,
                       cpu_ns_per_byte=net.cpu_ns_per_byte if spans_nodes else 0.0)


def load_machine(calibration: str, cluster: str | None = None) -> Machine:
    """A calibration file and optional cluster file, checked to predict more than one rank."""
    from spdnn.errors import InputError

    machine = Machine(load_calibration(calibration), load_cluster(cluster) if cluster else None)
    try:
        machine.check()
    except ValueError as exc:
        raise InputError(calibration, str(exc)) from None
    return machine


def allreduce_seconds(nbytes: float, ranks: int, net: Network, add_ns_per_byte: float,
                      measured_ranks: int = 0) -> float:
    """Time of an all-reduce of ``nbytes`` per rank over ``ranks`` ranks: from the network's
    measured curve when it has one (taken over ``measured_ranks``; for other counts scaled by
    the steps of recursive doubling), else from its latency and bandwidth."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = math.ceil(math.log2(ranks))
    curve = net.allreduce(nbytes) if measured_ranks > 1 else None
    if curve is not None:
        return curve * steps / math.ceil(math.log2(measured_ranks))
    lat, bw = net.allreduce_latency_s, net.allreduce_bandwidth_Bps
    doubling = steps * (lat + nbytes / bw + nbytes * add_ns_per_byte * 1e-9)
    frac = (ranks - 1) / ranks
    rabenseifner = 2 * steps * lat + 2 * frac * nbytes / bw + frac * nbytes * add_ns_per_byte * 1e-9
    return min(doubling, rabenseifner)


def allreduce_latency(net: Network, ranks: int) -> float:
    return 0.0 if ranks <= 1 else math.ceil(math.log2(ranks)) * net.allreduce_latency_s
