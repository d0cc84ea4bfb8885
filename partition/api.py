"""``partition.partition``: a plan for a network, from Python (``spdnn-partition`` runs the
same search). The network may be a ``spdnn.Network`` in memory or a bundle file."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal

from spdnn.model.network import Network
from spdnn.model.plan import Plan, network_patterns

from .methods import partition_network

Method = Literal["hypergraph", "block", "cyclic", "random"]
Objective = Literal["train", "infer"]


def partition(network: Network | str | os.PathLike, *, parts: int,
              method: Method = "hypergraph", epsilon: float = 0.03, seed: int | None = 0,
              objective: Objective = "train", backend: str = "auto",
              time_limit: float | None = None, jobs: int = 1, threads: int = 1,
              log: Callable[[str], None] | None = None) -> Plan:
    """A plan that gives each of ``parts`` ranks its neurons of every layer, each layer within
    ``epsilon`` of balance, with the fewest rows exchanged per ``objective`` step (``train``:
    forward + backward; ``infer``: forward). The plan carries the network's fingerprint and
    its statistics (``plan.meta["stats"]``); save it with ``spdnn.save_plan``."""
    if isinstance(network, Network):
        patterns, fingerprint = network_patterns(network), network.fingerprint()
    else:
        from .inputs import load_network_patterns

        bundle, patterns = load_network_patterns(os.fspath(network))
        fingerprint = bundle.fingerprint()
    return partition_network(patterns, parts, method, epsilon, seed, backend, fingerprint, log,
                             objective=objective, threads=threads, time_limit=time_limit,
                             jobs=jobs)
