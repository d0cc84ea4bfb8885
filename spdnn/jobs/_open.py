"""Opening a job: options checked on rank 0 (the verdict agreed), the kernels' threads set,
the grid chosen, the network opened under its plan."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.errors import SpdnnError
from spdnn.io.arrays import SOURCE, from_memory, signature
from spdnn.io.loaders import Dataset, Share, keep_share, load_dataset
from spdnn.io.paths import check_outputs
from spdnn.kernels import products as kernels
from spdnn.model.network import Network
from spdnn.model.options import RunOptions, candidate_plans, check_run_options, kernel_threads
from spdnn.optim import state_arrays
from spdnn.runtime.grid import Grid
from spdnn.runtime.memory_budget import Budget
from spdnn.runtime.session import Opened, open_network


def open_job(comm: Communicator, network: str | os.PathLike | Network, run: RunOptions,
             batch: int,
             files: Sequence[tuple[str, str | None]] = (),
             dirs: Sequence[tuple[str, str | None]] = (), verbose: bool = False,
             training: bool = False, can_stream: bool = False,
             challenge: bool = False,
             data: Callable[[Grid, np.ndarray, int], int] | None = None,
             lsh_tables: int = 0, lsh_layer: int = -1, optimizer: Any = None,  # noqa: ANN401
             dropout: bool = False) -> Opened:
    """Check ``run`` and the output paths, set the threads, choose the grid, open the
    network (a bundle's path, or a ``Network`` every rank holds) on every rank. The kernels
    are not loaded yet: they load once its inputs are checked (``spdnn.kernels.loading``).
    ``can_stream``: an inference that may run block by block (``Opened.stream``);
    ``challenge``: one in Graph Challenge chunks (the memory it will need); ``data``: this
    rank's input bytes for its grid and features, counted before loading (``Budget.data``);
    ``lsh_tables``: the hash tables ``--lsh`` will build, over layer ``lsh_layer`` (from 0);
    ``optimizer``: the training's optimizer config (its state per value, its update's cost
    under ``replicas='auto'``); ``dropout``: whether it
    draws masks. Collective."""
    if not isinstance(network, Network):
        network = os.fspath(network)

    def check() -> None:
        check_run_options(run)
        plans = [("--plan", p) for p in candidate_plans(run) if isinstance(p, str)]
        source = [("--network", network)] if isinstance(network, str) else []
        check_outputs(files, dirs, inputs=source + plans)
        kernels.backend()  # an unknown SPDNN_KERNELS value is an error now, not mid-run

    def threads() -> None:
        cores, n = os.cpu_count() or 1, kernel_threads(run)
        if n > cores:
            raise SpdnnError(f"--threads {n}: more than the {cores} cores of this "
                             "node (threads per rank x ranks per node should not exceed them)")
        try:
            kernels.set_threads(n)
        except ValueError as exc:
            raise SpdnnError(f"--threads: {exc}") from None

    comm.check(lambda: check() if comm.rank == 0 else None)
    comm.check(threads)
    plans = candidate_plans(run)
    plan, replicas = plans[0] if plans else None, run.replicas
    baseline = None
    if len(plans) > 1 or replicas == "auto":
        from spdnn.cost.autogrid import choose_grid
        from spdnn.runtime import memory_report

        if isinstance(network, Network) or not all(isinstance(p, str) for p in plans):
            comm.agree("replicas='auto' compares plan files for a network file: give paths")
        # measured before the choice reads the network: the grid it picks is judged, and
        # then checked, against the same baseline
        baseline = memory_report.measure_baseline(run.dtype, node_ranks=comm.node_size(),
                                                  training=training)
        plan, replicas = choose_grid(comm, network=network, plans=plans,
                                     replicas=run.replicas, calibration=run.calibration,
                                     cluster=run.cluster, batch=batch, dtype=run.dtype,
                                     verbose=verbose, memory_limit=run.memory_limit,
                                     baseline=baseline, optimizer=optimizer)
    if training and run.stream_layers is not None:
        comm.agree("stream_layers (--stream-layers) is for inference: training holds every "
                   "layer")
    if not training and not can_stream and run.stream_layers is not None:
        comm.agree("stream_layers (--stream-layers) does not apply with --lsh: its tables "
                   "need the whole layer")
    budget = Budget(limit=run.memory_limit, batch=batch, training=training,
                    can_stream=can_stream, stream_layers=run.stream_layers,
                    challenge=challenge, data=data, lsh_tables=lsh_tables,
                    lsh_layer=lsh_layer, dropout=dropout,
                    optimizer_arrays=1 if optimizer is None else state_arrays(optimizer),
                    baseline=baseline)
    return open_network(comm, network, plan, run.dtype, replicas, run.exchange, warm=False,
                        budget=budget, dry_run=run.dry_run)


def open_data(comm: Communicator, data: Any, dtype: str,  # noqa: ANN401
              features: np.ndarray, n_in: int, share: Share = None, *,
              evaluate: bool = False) -> Dataset:
    """A data source by name (``digits``, ``npz:FILE``, ...) read from its files, or data in
    memory that every rank holds alike (spdnn.io.arrays), with this rank's feature columns
    of the network's ``n_in`` (and only ``share`` of the samples, when given: a training
    replica's; ``evaluate``: only the split an evaluation reads, spdnn.io.loaders.
    load_dataset). Collective."""
    if isinstance(data, str):
        return comm.check(lambda: load_dataset(data, dtype, features=features, share=share,
                                               evaluate=evaluate))
    found = comm.check(lambda: from_memory(data, dtype, features=features, n_in=n_in))
    signatures = comm.allgather(signature(found))
    if any(s != signatures[0] for s in signatures):
        comm.agree("data in memory differs between ranks (in its shapes or labels): every rank "
                   "must pass the same arrays")
    return keep_share(found, share)


def data_name(data: Any) -> str:  # noqa: ANN401
    """How messages name a data source."""
    return data if isinstance(data, str) else SOURCE
