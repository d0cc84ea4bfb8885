"""``partition.partition``: a plan for a network, from Python (``spdnn-partition`` runs the
same search). The network may be a ``spdnn.Network`` in memory or a bundle file."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from spdnn.model.network import Network
from spdnn.model.plan import Plan, network_patterns

from .methods import partition_network

Method = Literal["hypergraph", "block", "cyclic", "random"]
Objective = Literal["train", "infer"]


def partition(network: Network | str | os.PathLike, *, parts: int,
              method: Method = "hypergraph", epsilon: float = 0.03, seed: int | None = 0,
              objective: Objective = "train", backend: str = "auto",
              time_limit: float | None = None, jobs: int = 1, threads: int = 1,
              memory_limit: int | str | None = None, window_layers: int | None = None,
              log: Callable[[str], None] | None = None) -> Plan:
    """A plan that gives each of ``parts`` ranks its neurons of every layer, each layer within
    ``epsilon`` of balance, with the fewest rows exchanged per ``objective`` step (``train``:
    forward + backward; ``infer``: forward). The plan carries the network's fingerprint and
    its statistics (``plan.meta["stats"]``); save it with ``spdnn.save_plan``.

    ``memory_limit`` (bytes, or text such as ``"8G"``) or ``window_layers``: partition in
    windows of consecutive layers that fit, read from the file as they advance
    (partition/windows.py); without either, the whole hypergraph at once."""
    if memory_limit is not None or window_layers is not None:
        return _in_windows(network, parts, method=method, epsilon=epsilon, seed=seed,
                           objective=objective, backend=backend, time_limit=time_limit,
                           jobs=jobs, threads=threads, memory_limit=memory_limit,
                           window_layers=window_layers, log=log)
    if isinstance(network, Network):
        patterns, fingerprint = network_patterns(network), network.fingerprint()
    else:
        from .inputs import load_network_patterns

        bundle, patterns = load_network_patterns(os.fspath(network))
        fingerprint = bundle.fingerprint()
    return partition_network(patterns, parts, method=method, epsilon=epsilon, seed=seed,
                             backend=backend, fingerprint=fingerprint, log=log,
                             objective=objective, threads=threads, time_limit=time_limit,
                             jobs=jobs)


def _in_windows(network: Network | str | os.PathLike, parts: int, *, memory_limit: int | str | None,
                window_layers: int | None, **options: Any) -> Plan:
    from spdnn.errors import SpdnnError
    from spdnn.io.bundle import NetworkBundle
    from spdnn.memlimit import parse_bytes

    from .methods import check_options, normalize_seed
    from .windows import PatternList, choose_windows, partition_windows

    limit = parse_bytes(memory_limit) if isinstance(memory_limit, str) else memory_limit
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise SpdnnError(f"memory_limit must be a number of bytes, not {memory_limit!r}")
    if window_layers is not None and (not isinstance(window_layers, int) or window_layers < 1):
        raise SpdnnError(f"window_layers must be a positive integer, not {window_layers!r}")
    options["seed"] = normalize_seed(options["seed"])
    check_options(parts, **{k: options[k] for k in ("method", "epsilon", "objective", "backend",
                                                     "threads", "jobs", "time_limit")})
    if isinstance(network, Network):
        source, fingerprint = PatternList(network_patterns(network)), network.fingerprint()
    else:
        source = NetworkBundle(os.fspath(network))
        fingerprint = source.fingerprint()
    windows = choose_windows(source, parts, limit=limit or 2**62, jobs=options["jobs"],
                             max_layers=window_layers)
    return partition_windows(source, parts, windows, fingerprint=fingerprint, **options).plan
