"""spdnn: hypergraph-partitioned sparse DNN training and inference over MPI.

Public API: the network model, its file formats, the generators and the serial reference.
"""

from . import threads  # noqa: F401  (must run before numpy is imported)
from .bundle import NETWORK_FORMAT, NetworkBundle, load_network, save_network
from .datasets import Dataset, load_dataset
from .errors import InputError, SpdnnError
from .network import Layer, Network

__version__ = "0.1.0"

__all__ = [
    "NETWORK_FORMAT",
    "Dataset",
    "InputError",
    "Layer",
    "Network",
    "NetworkBundle",
    "SpdnnError",
    "load_dataset",
    "load_network",
    "save_network",
]
