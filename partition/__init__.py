"""spdnn-partition: one hypergraph over the neurons of all layers, partitioned with KaHyPar under
a per-layer balance constraint, written as a plan file (spdnn.model.plan)."""

from .api import partition
from .hypergraph import OBJECTIVES, Hypergraph, build_hypergraph, km1, read_partition, write_hmetis
from .methods import BASELINES, METHODS, baseline_owners, partition_network

__all__ = [
    "BASELINES",
    "METHODS",
    "OBJECTIVES",
    "Hypergraph",
    "baseline_owners",
    "build_hypergraph",
    "km1",
    "partition",
    "partition_network",
    "read_partition",
    "write_hmetis",
]
