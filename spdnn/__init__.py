"""spdnn: hypergraph-partitioned sparse DNN training and inference on MPI ranks.

Public API: networks (generate, load, save), plans (load, save; ``partition.partition`` makes
them), data sets, ``train`` and ``infer`` on the ranks of an MPI job with their option records
and results, and the errors. MPI itself is imported only when ``train`` or ``infer`` runs, so
that importing spdnn does not start the message-passing library. Importing it changes no thread
setting (BLAS, OpenMP, numba): the ``spdnn`` command pins one thread per rank, the library
leaves that to the caller (docs/running.md).
"""

# name -> the module that defines it, imported on first use (PEP 562): ``import spdnn`` stays
# light, so the command line can take Ctrl-C from its first moment (spdnn.cli.entry).
_HOMES = {
    "infer": "spdnn.api", "predict": "spdnn.api", "train": "spdnn.api",
    "InputError": "spdnn.errors", "OptionError": "spdnn.errors", "SpdnnError": "spdnn.errors",
    "NETWORK_FORMAT": "spdnn.io.bundle", "NetworkBundle": "spdnn.io.bundle",
    "load_network": "spdnn.io.bundle", "save_network": "spdnn.io.bundle",
    "from_torch": "spdnn.io.pytorch", "to_torch": "spdnn.io.pytorch",
    "Dataset": "spdnn.io.loaders", "load_dataset": "spdnn.io.loaders",
    "PLAN_FORMAT": "spdnn.io.planfile", "load_plan": "spdnn.io.planfile",
    "save_plan": "spdnn.io.planfile",
    "local_network": "spdnn.model.generate", "radixnet": "spdnn.model.generate",
    "random_network": "spdnn.model.generate",
    "Layer": "spdnn.model.network", "Network": "spdnn.model.network",
    "Plan": "spdnn.model.plan", "PlanStats": "spdnn.model.plan",
    "plan_statistics": "spdnn.model.plan",
    "InferResult": "spdnn.model.records", "RunOptions": "spdnn.model.options",
    "TrainOptions": "spdnn.model.options", "TrainResult": "spdnn.model.records",
    "TrafficReport": "spdnn.model.records", "TimingReport": "spdnn.model.records",
    # these two need scikit-learn (the sklearn extra)
    "SparseMLPClassifier": "spdnn.estimators", "SparseMLPRegressor": "spdnn.estimators",
}


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value: object = version("spdnn")
        except PackageNotFoundError:  # run from a source tree that was never installed
            value = "0+unknown"
    elif name in _HOMES:
        import importlib

        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'spdnn' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES, "__version__"])


__all__ = [
    "NETWORK_FORMAT",
    "InferResult",
    "RunOptions",
    "TrainOptions",
    "TrainResult",
    "TrafficReport",
    "TimingReport",
    "infer",
    "predict",
    "local_network",
    "radixnet",
    "random_network",
    "train",
    "PLAN_FORMAT",
    "Dataset",
    "InputError",
    "OptionError",
    "Layer",
    "Network",
    "NetworkBundle",
    "Plan",
    "PlanStats",
    "SparseMLPClassifier",
    "SparseMLPRegressor",
    "SpdnnError",
    "load_dataset",
    "load_network",
    "load_plan",
    "plan_statistics",
    "save_network",
    "save_plan",
    "from_torch",
    "to_torch",
]
