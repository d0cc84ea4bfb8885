"""spdnn: hypergraph-partitioned sparse DNN training and inference on MPI ranks.

Public API: the network model and its file format, data sets, plans, the optimizer settings and
the errors. The MPI runtime (``spdnn.session``, ``spdnn.training``, ``spdnn.inference``) is
imported on demand, so that importing spdnn does not start the message-passing library.
"""

from . import threads  # noqa: F401  (must run before numpy is imported)
from .bundle import NETWORK_FORMAT, NetworkBundle, load_network, save_network
from .datasets import Dataset, load_dataset
from .errors import InputError, SpdnnError
from .network import Layer, Network
from .optim import SGDConfig
from .plan import PLAN_FORMAT, Plan, PlanStats, load_plan, plan_statistics, save_plan

__version__ = "0.1.0"

__all__ = [
    "NETWORK_FORMAT",
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
