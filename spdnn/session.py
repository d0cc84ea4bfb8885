"""Opening a distributed run and writing its results: the network bundle, the plan and this
rank's part, checked against each other on every rank; the trained network and metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import encoding, kernels
from .atomic import write_text
from .bundle import NetworkBundle, save_network
from .comm import Communicator
from .distributed import DistributedNetwork
from .errors import InputError, SpdnnError
from .grid import Grid
from .network import Layer, Network
from .plan import Plan, load_plan


@dataclass(frozen=True)
class Opened:
    bundle: NetworkBundle
    plan: Plan
    dnet: DistributedNetwork

    @property
    def nnz(self) -> int:
        """Stored weights of the whole network (from the file's headers)."""
        return sum(self.bundle.nnz(k) for k in range(1, self.bundle.n_layers + 1))


def open_network(comm: Communicator, network: str, plan_path: str | None,
                 dtype: Any = None, replicas: int = 1, exchange: str = "auto") -> Opened:
    """Open the bundle and plan on every rank, check they fit this job (``replicas`` x the
    plan's parts = ranks), split the ranks into the grid and load my rows; rows travel as
    ``exchange`` says (spdnn.encoding.MODES). Collective."""
    bundle = comm.check(lambda: NetworkBundle(network))

    def get_plan() -> Plan:
        if replicas < 1:
            raise SpdnnError(f"--replicas must be at least 1, not {replicas}")
        if plan_path is None:
            if replicas == 1 and comm.size > 1:
                raise SpdnnError(f"--plan is required with {comm.size} ranks (make one with "
                                 "spdnn-partition)")
            if comm.size != replicas:
                raise SpdnnError(f"--replicas {replicas} without a plan need mpirun -n "
                                 f"{replicas}, this job has {comm.size} rank(s) (with more "
                                 "ranks than replicas, give --plan)")
            return Plan(1, tuple(np.zeros(n, dtype=np.int32) for n in bundle.sizes),
                        {"method": "single"})
        plan = load_plan(plan_path)
        if plan.nparts * replicas != comm.size:
            if replicas == 1:
                raise InputError(plan_path, f"plan is for P={plan.nparts} ranks but this job "
                                            f"has {comm.size} (mpirun -n {plan.nparts})")
            raise InputError(plan_path, f"--replicas {replicas} of this plan's {plan.nparts} "
                                        f"part(s) need mpirun -n {plan.nparts * replicas}, "
                                        f"this job has {comm.size} ranks")
        plan.check_for(bundle.sizes, None, plan_path)
        return plan

    plan = comm.check(get_plan)
    grid = Grid.make(comm, plan.nparts)
    dnet = DistributedNetwork.load(bundle, plan, grid, dtype)
    dnet.set_exchange(exchange)
    comm.check(lambda: plan.check_for(bundle.sizes, dnet.fingerprint, plan_path or network))
    kernels.warm_up()
    encoding.warm_up()
    return Opened(bundle, plan, dnet)


def gather_network(dnet: DistributedNetwork) -> Network | None:
    """The whole network on rank 0 of each replica (None elsewhere), layer by layer."""
    layers = []
    for layer in dnet.layers:
        w = layer.weight
        parts = dnet.comm.gather((layer.rows, np.diff(w.indptr), layer.global_columns(),
                                  w.data, layer.bias))
        if parts is None:
            continue
        rows, counts, cols, data, bias = (np.concatenate(a) for a in zip(*parts))
        n_out, n_in = dnet.sizes[layer.index], dnet.sizes[layer.index - 1]
        order = np.argsort(np.repeat(rows, counts).astype(np.int64) * n_in + cols,
                           kind="stable")
        indptr = np.zeros(n_out + 1, dtype=np.int64)
        np.add.at(indptr, rows + 1, counts)
        b = np.empty(n_out, dtype=bias.dtype)
        b[rows] = bias
        w = sp.csr_matrix((data[order], cols[order], np.cumsum(indptr)), shape=(n_out, n_in))
        layers.append(Layer(w, b))
    if dnet.comm.rank != 0:
        return None
    return Network(tuple(layers), dnet.meta["activation"], dnet.cap, dnet.output_activation)


def save_trained(comm: Communicator, dnet: DistributedNetwork, path: str,
                 extra: dict[str, Any]) -> None:
    net = gather_network(dnet) if dnet.grid.replica == 0 else None
    if net is not None:
        kept = {k: v for k, v in dnet.meta.items()
                if k not in ("activation", "cap", "output_activation")}
        net = Network(net.layers, net.activation, net.cap, net.output_activation,
                      {**kept, **extra})
    comm.check(lambda: save_network(net, path) if net is not None else None)


def write_json(comm: Communicator, path: str | None, payload: dict[str, Any]) -> None:
    if path:
        comm.check(lambda: write_text(path, json.dumps(payload, indent=2, sort_keys=True,
                                                        default=float) + "\n")
                   if comm.rank == 0 else None)
