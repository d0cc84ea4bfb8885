"""``partition.partition``: a plan for a network, from Python (``spdnn-partition`` runs the
same search, with the same options: partition/options.py). The network may be a
``spdnn.Network`` in memory or a bundle file."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Literal

from spdnn.errors import check_type
from spdnn.model.network import Network
from spdnn.model.plan import Plan, network_patterns

from .options import PartitionOptions

Method = Literal["sweep", "hypergraph", "block", "cyclic", "random"]
Objective = Literal["train", "infer"]


def partition(network: Network | str | os.PathLike, *, parts: int,
              method: Method = "sweep", epsilon: float = 0.03, seed: int | None = 0,
              objective: Objective = "train", backend: str = "auto",
              time_limit: float | None = None, reserve: float | None = None, jobs: int = 1,
              threads: int = 1, exact_sweeps: int = 0, shortcuts: bool = True,
              memory_limit: int | str | None = None, window_layers: int | None = None,
              log: Callable[[str], None] | None = None) -> Plan:
    """A plan that gives each of ``parts`` ranks its neurons of every layer, each layer within
    ``epsilon`` of balance, with the fewest rows exchanged per ``objective`` step (``train``:
    forward + backward; ``infer``: forward). The plan carries the network's fingerprint and
    its statistics (``plan.meta["stats"]``); save it with ``spdnn.save_plan``.

    ``time_limit``: seconds for this call, loading included; the search ends ``reserve``
    seconds before it, to leave time for saving the plan (default 2% of the limit, at least
    1 s). ``exact_sweeps``, ``shortcuts``, ``jobs``, ``threads``: as ``spdnn-partition``'s
    options. ``memory_limit`` (bytes, or text such as ``"8G"``) or ``window_layers``:
    partition in windows of consecutive layers that fit, read from the file as they advance
    (partition/windows.py); without either, the whole hypergraph at once."""
    start = time.monotonic()
    check_type("network", network, (str, os.PathLike, Network),
               "a network bundle's path or a spdnn.Network")
    options = PartitionOptions(
        method=method, epsilon=epsilon, seed=seed, objective=objective, backend=backend,
        time_limit=time_limit, reserve=reserve, jobs=jobs, threads=threads,
        exact_sweeps=exact_sweeps, shortcuts=shortcuts, memory_limit=memory_limit,
        window_layers=window_layers).checked(parts)
    if options.windowed:
        return _in_windows(network, parts, options, start, log)
    if isinstance(network, Network):
        patterns, fingerprint = network_patterns(network), network.fingerprint()
    else:
        from .inputs import load_network_patterns

        bundle, patterns = load_network_patterns(os.fspath(network))
        fingerprint = bundle.fingerprint()
    from .methods import partition_network

    return partition_network(patterns, parts, fingerprint=fingerprint, log=log,
                             exact_sweeps=options.exact_sweeps,
                             time_limit=options.search_seconds(time.monotonic() - start),
                             **options.search())


def _in_windows(network: Network | str | os.PathLike, parts: int, options: PartitionOptions,
                start: float, log: Callable[[str], None] | None) -> Plan:
    from spdnn.io.bundle import NetworkBundle

    from .groups import first_layer_grouped
    from .windows import PatternList, choose_windows, partition_windows

    options.check_windowed()
    if isinstance(network, Network):
        source, fingerprint = PatternList(network_patterns(network)), network.fingerprint()
    else:
        source = NetworkBundle(os.fspath(network))
        fingerprint = source.fingerprint()
    grouped = options.method == "sweep" and first_layer_grouped(source, parts, options.epsilon)
    windows = choose_windows(source, parts, limit=options.memory_limit or 2**62,
                             jobs=options.jobs, max_layers=options.window_layers,
                             method=options.method, grouped=grouped)
    return partition_windows(source, parts, windows, fingerprint=fingerprint, log=log,
                             time_limit=options.search_seconds(time.monotonic() - start),
                             **options.search()).plan
