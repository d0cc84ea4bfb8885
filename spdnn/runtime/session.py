"""Opening a distributed run and writing its results: the network bundle, the plan and this
rank's part, checked against each other on every rank; the trained network and metrics."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.comm.mpi import AgreedError, Communicator
from spdnn.errors import InputError, SpdnnError
from spdnn.io.atomic import write_text
from spdnn.io.bundle import ACTIVATION_KEYS, VALUES_KEY, NetworkBundle, NetworkWriter
from spdnn.io.planfile import load_plan
from spdnn.kernels import products as kernels
from spdnn.kernels.loading import load_kernels
from spdnn.model.activations import BY_NAME
from spdnn.model.csr import as_dtype, stored_itemsize
from spdnn.model.network import Layer, Network
from spdnn.model.plan import Plan
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.grid import Grid
from spdnn.runtime.layer_stream import LayerStream, choose_blocks
from spdnn.runtime.local_layer import LocalLayer
from spdnn.runtime.memory_budget import Budget, DryRun, check, dry_run_report


@dataclass(frozen=True)
class Opened:
    """An opened job: its network loaded (``dnet``), or, for an inference whose weights pass
    the limit, to be streamed block by block (``stream``; ``dnet`` is None)."""

    bundle: NetworkBundle | InMemory
    plan: Plan
    dnet: DistributedNetwork | None
    stream: LayerStream | None = None

    @functools.cached_property
    def nnz(self) -> int:
        """Stored weights of the whole network (from the file's headers, read once)."""
        return sum(self.bundle.nnz(k) for k in range(1, self.bundle.n_layers + 1))


class InMemory:
    """A ``Network`` held by every rank, read through a bundle's interface (each rank keeps
    only its rows of it in the distributed network)."""

    path = "network"

    def __init__(self, network: Network) -> None:
        self._net = network.validate()
        self.n_layers = network.n_layers
        self.sizes = network.sizes
        self.meta = network.meta()

    def nnz(self, k: int) -> int:
        return self._net.layers[k - 1].weight.nnz

    def row_indices(self, k: int, rows: np.ndarray) -> Iterator[np.ndarray]:
        yield self._net.layers[k - 1].weight[rows].indices

    def check_unchanged(self) -> None:
        """A network in memory does not change under the job."""

    def bias(self, k: int) -> np.ndarray:
        return self._net.layers[k - 1].bias

    def rows(self, k: int, rows: np.ndarray, dtype: Any = None,  # noqa: ANN401
             fingerprint: Any = None) -> Layer:  # noqa: ANN401
        layer = self._net.layers[k - 1]
        w = layer.weight
        if fingerprint is not None:
            fingerprint.add(w.indptr, w.indices)
        mine = w[rows]
        return Layer.from_arrays(mine.indptr, mine.indices, mine.data, (len(rows), w.shape[1]),
                                 layer.bias[rows], self.path, f"layer {k}", dtype, min_rows=0)


def open_network(comm: Communicator, network: str | Network, plan_path: str | Plan | None,
                 dtype: Any = None, replicas: int = 1, exchange: str = "auto",
                 warm: bool = True, budget: Budget | None = None,
                 dry_run: bool = False) -> Opened:
    """Open the network (a bundle's path, or a ``Network`` every rank holds) and the plan (a
    path or a ``Plan``) on every rank, check they fit this job (``replicas`` x the plan's
    parts = ranks), split the ranks into the grid, check each rank's predicted memory against
    ``budget`` (``dry_run``: print it and raise ``DryRun``) and load my rows; rows travel as
    ``exchange`` says (spdnn.kernels.encoding.MODES); ``warm=False`` leaves the kernels to
    the job (``spdnn.kernels.loading``: a job checks its data first). Collective."""
    bundle = comm.check(lambda: InMemory(network) if isinstance(network, Network)
                        else NetworkBundle(network))
    if isinstance(dtype, str) and dtype == "bfloat16":
        comm.check(lambda: check_bfloat16_network(bundle))
    source = plan_path if isinstance(plan_path, str) else "plan"

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
        plan = plan_path if isinstance(plan_path, Plan) else load_plan(plan_path)
        if plan.parts * replicas != comm.size:
            if replicas == 1:
                raise InputError(source, f"plan is for P={plan.parts} ranks but this job "
                                            f"has {comm.size} (mpirun -n {plan.parts})")
            raise InputError(source, f"--replicas {replicas} of this plan's {plan.parts} "
                                        f"part(s) need mpirun -n {plan.parts * replicas}, "
                                        f"this job has {comm.size} ranks")
        plan.check_for(bundle.sizes, None, source)
        return plan

    plan = comm.check(get_plan)
    if isinstance(network, Network) or isinstance(plan_path, Plan):
        _same_everywhere(comm, network if isinstance(network, Network) else None,
                         plan if isinstance(plan_path, Plan) else None)
    grid = Grid.make(comm, plan.parts)
    if budget is not None:
        value_type = "float32" if dtype is None else dtype
        half = isinstance(value_type, str) and value_type == "bfloat16"
        itemsize = as_dtype(value_type).itemsize
        verdict = check(grid, bundle, plan, itemsize, budget,
                        stored=stored_itemsize(value_type))
        blocks = None
        if budget.can_stream and not half and (verdict.over or budget.stream_layers):
            reason = f"--stream-layers {budget.stream_layers}" if not verdict.over else \
                f"the weights pass {verdict.source}"
            blocks = choose_blocks(grid, verdict.shapes, limit=verdict.limit, itemsize=itemsize,
                                   max_layers=budget.stream_layers, reason=reason,
                                   challenge=budget.challenge, data=verdict.prediction.data)
        elif verdict.over:
            raise AgreedError(verdict.over)
        if dry_run:
            text = dry_run_report(comm, verdict.prediction, verdict.limit, budget)
            if blocks is not None and text:
                text += "\n" + blocks.describe()
            raise DryRun(text)
        if blocks is not None:
            where = source if plan_path is not None else bundle.path
            stream = LayerStream(bundle, plan, grid, dtype, exchange, blocks,
                                 planned=verdict.shapes, plan_source=where)
            return Opened(bundle, plan, None, stream)
    dnet = DistributedNetwork.load(bundle, plan, grid, dtype)
    dnet.set_exchange(exchange)
    comm.check(lambda: plan.check_for(bundle.sizes, dnet.fingerprint,
                                      source if plan_path is not None else bundle.path))
    if warm:
        load_kernels(dnet.dtype, bfloat16=dnet.bfloat16)
    return Opened(bundle, plan, dnet)


def check_bfloat16_network(bundle: Any) -> None:  # noqa: ANN401
    """What a bfloat16 run needs of its network and kernels, refused in one line: hidden
    activations whose slope needs no Z (``Activation.BFLOAT16``: a bfloat16 pass keeps no Z
    once the outputs are rounded) and the numba kernels (BLAS and scipy have no bfloat16)."""
    others = sorted({a for a in bundle.meta.get("activations", ())
                     if not BY_NAME[a.partition(":")[0]].BFLOAT16})
    if others:
        able = ", ".join(name for name, cls in BY_NAME.items() if cls.BFLOAT16)
        raise InputError(bundle.path, f"--dtype bfloat16 trains hidden layers of {able} only "
                                      f"yet (their slopes need no Z), not {', '.join(others)}")
    if kernels.active().compiled("bfloat16") is None:  # a backend without compiled kernels
        raise SpdnnError("--dtype bfloat16 needs the numba kernels (SPDNN_KERNELS=scipy "
                         "has no bfloat16 products)")


def _same_everywhere(comm: Communicator, network: Network | None, plan: Plan | None) -> None:
    """Objects in memory must be the same on every rank (a file is, by construction): a plan or
    network that differs between ranks would give them schedules that do not match."""
    import hashlib

    def digest(arrays: list[np.ndarray]) -> str:
        h = hashlib.sha256()
        for a in arrays:
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    mine = (None if network is None else digest(
                [a for lay in network.layers for a in (lay.weight.indptr, lay.weight.indices,
                                                       lay.weight.data, lay.bias)]),
            None if plan is None else digest([np.asarray(plan.parts), *plan.owners]))
    seen = comm.allgather(mine)
    for i, what in enumerate(("network", "plan")):
        if len({s[i] for s in seen}) > 1:
            comm.agree(f"the {what} given in memory differs between ranks: every rank must "
                       f"pass the same one (or a file)")


def gather_layer(dnet: DistributedNetwork, layer: LocalLayer) -> Layer | None:
    """One layer whole on rank 0 of each replica (None elsewhere). Collective over the
    replica. Its temporaries stay near twice the layer's own size: int32 columns, the rows put
    in order by one entry map, each row's columns sorted in place."""
    w = layer.weight
    n_out, n_in = dnet.sizes[layer.index], dnet.sizes[layer.index - 1]
    cols = layer.global_columns()
    if n_in < 2**31:
        cols = cols.astype(np.int32)
    parts = dnet.comm.gather((layer.rows, np.diff(w.indptr), cols, w.data, layer.bias))
    del cols
    if parts is None:
        return None
    rows, counts, cols, data, bias = (np.concatenate(a) for a in zip(*parts))
    del parts
    by_row = np.argsort(rows, kind="stable")
    if np.any(by_row != np.arange(len(rows))):  # rows not in order: move each row's entries
        starts = np.cumsum(counts) - counts
        moved = counts[by_row]
        entry = np.repeat(starts[by_row] - (np.cumsum(moved) - moved), moved)
        entry += np.arange(len(entry), dtype=entry.dtype)
        data, cols = data[entry], cols[entry]
        del entry
    indptr = np.zeros(n_out + 1, dtype=np.int64)
    indptr[rows[by_row] + 1] = counts[by_row]
    b = np.empty(n_out, dtype=bias.dtype)
    b[rows] = bias
    whole = sp.csr_matrix((data, cols, np.cumsum(indptr)), shape=(n_out, n_in), copy=False)
    whole.sort_indices()
    return Layer(whole, b)


def gather_network(dnet: DistributedNetwork) -> Network | None:
    """The whole network on rank 0 of each replica (None elsewhere), layer by layer."""
    layers = [gather_layer(dnet, layer) for layer in dnet.layers]
    if dnet.comm.rank != 0:
        return None
    return Network(layers=tuple(layers), activations=tuple(dnet.meta["activations"]),
                   cap=dnet.cap, output_activation=dnet.output_activation)


def whole_network(dnet: DistributedNetwork) -> Network:
    """The whole network on every rank: gathered on each replica's rank 0, then broadcast
    over the replica (every replica holds the same values). Collective."""
    return dnet.comm.bcast(gather_network(dnet))


def save_trained(comm: Communicator, dnet: DistributedNetwork, path: str,
                 extra: dict[str, Any]) -> None:
    """Write the network as it is now: rank 0 of replica 0 gathers one layer at a time and
    writes it before the next (it never holds more than one whole layer). Collective."""
    writes = dnet.grid.replica == 0 and dnet.comm.rank == 0
    # the trained weights in the run's arithmetic type: a network read from bfloat16 values is
    # not rounded back to them (a bfloat16 run's master weights are float32)
    kept = {k: v for k, v in dnet.meta.items() if k not in (*ACTIVATION_KEYS, VALUES_KEY)}
    if dnet.bfloat16:  # the float32 master weights of a run at bfloat16's rounding points
        extra = {**extra, "trained_dtype": "bfloat16"}
    meta = Network(layers=(), activations=tuple(dnet.meta["activations"]), cap=dnet.cap,
                   output_activation=dnet.output_activation, extra={**kept, **extra}).meta()
    writer = comm.check(lambda: NetworkWriter(path, dnet.sizes, meta) if writes else None)
    try:
        for layer in dnet.layers:
            whole = gather_layer(dnet, layer) if dnet.grid.replica == 0 else None
            comm.check(lambda whole=whole: writer.add(whole) if writer is not None else None)
            del whole
        comm.check(lambda: writer.close() if writer is not None else None)
    finally:
        if writer is not None:
            writer.abort()


def write_json(comm: Communicator, path: str | None, payload: dict[str, Any]) -> None:
    if path:
        comm.check(lambda: write_text(path, json.dumps(payload, indent=2, sort_keys=True,
                                                        default=float) + "\n")
                   if comm.rank == 0 else None)
