"""spdnn: hypergraph-partitioned sparse DNN training and inference on MPI ranks.

Public API: networks (generate, load, save), plans (load, save; ``partition.partition`` makes
them), data sets, ``train`` and ``infer`` on the ranks of an MPI job with their option records
and results, and the errors. MPI itself is imported only when ``train`` or ``infer`` runs, so
that importing spdnn does not start the message-passing library.
"""

from spdnn import threads  # noqa: F401  (must run before numpy is imported)
from spdnn.api import infer, train
from spdnn.errors import InputError, SpdnnError
from spdnn.io.bundle import NETWORK_FORMAT, NetworkBundle, load_network, save_network
from spdnn.io.datasets import Dataset, load_dataset
from spdnn.io.planfile import PLAN_FORMAT, load_plan, save_plan
from spdnn.model.generate import local_network, radixnet, random_network
from spdnn.model.network import Layer, Network
from spdnn.model.optim import SGDConfig
from spdnn.model.plan import Plan, PlanStats, plan_statistics
from spdnn.model.records import InferResult, RunOptions, TrainOptions, TrainResult

__version__ = "0.1.0"

__all__ = [
    "NETWORK_FORMAT",
    "InferResult",
    "RunOptions",
    "TrainOptions",
    "TrainResult",
    "infer",
    "local_network",
    "radixnet",
    "random_network",
    "train",
    "PLAN_FORMAT",
    "Dataset",
    "InputError",
    "Layer",
    "Network",
    "NetworkBundle",
    "Plan",
    "PlanStats",
    "SGDConfig",
    "SpdnnError",
    "load_dataset",
    "load_network",
    "load_plan",
    "plan_statistics",
    "save_network",
    "save_plan",
]
