"""spdnn-partition: one hypergraph over the neurons of all layers, partitioned with KaHyPar under
a per-layer balance constraint, written as a plan file (spdnn.model.plan)."""

# name -> the module that defines it, imported on first use (PEP 562): ``spdnn-partition``
# pins one BLAS thread before numpy loads (spdnn.cli.thread_pools), which an eager import here would
# precede.
_HOMES = {
    "partition": "api",
    "OBJECTIVES": "hypergraph", "Hypergraph": "hypergraph", "build_hypergraph": "hypergraph",
    "km1": "hypergraph", "read_partition": "hypergraph", "write_hmetis": "hypergraph",
    "BASELINES": "options", "METHODS": "options", "PartitionOptions": "options",
    "baseline_owners": "baselines", "partition_network": "methods",
}


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'partition' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "BASELINES",
    "METHODS",
    "OBJECTIVES",
    "PartitionOptions",
    "Hypergraph",
    "baseline_owners",
    "build_hypergraph",
    "km1",
    "partition",
    "partition_network",
    "read_partition",
    "write_hmetis",
]
