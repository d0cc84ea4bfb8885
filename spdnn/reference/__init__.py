"""The serial reference engine: forward, backward and the optimizers on one process, clear
rather than fast.

Every distributed result is tested against this package, so nothing on the distributed path
imports it; it shares only the pointwise pieces (``ops``), the optimizer (``optim``) and the
sample order (``batching``) with the runtime. Semantics: docs/formats.md.
"""

from spdnn.reference.loop import train
from spdnn.reference.lsh import lsh_tables, sampled_backward
from spdnn.reference.metrics import accuracy, challenge_infer, precisions, predict
from spdnn.reference.passes import (
    Gradients,
    HiddenSampler,
    backward,
    forward,
    layer_gradients,
    sampled_products,
)
from spdnn.reference.topology import near_columns, update_topology

__all__ = [
    "Gradients",
    "HiddenSampler",
    "accuracy",
    "backward",
    "challenge_infer",
    "forward",
    "layer_gradients",
    "lsh_tables",
    "near_columns",
    "precisions",
    "predict",
    "sampled_backward",
    "sampled_products",
    "train",
    "update_topology",
]
