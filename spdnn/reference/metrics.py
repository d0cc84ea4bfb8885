"""The reference's predictions and scores: accuracy, precision@k, the Graph Challenge's
categories."""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from spdnn.model.batching import columns
from spdnn.model.labels import MultiLabels, precision_at
from spdnn.model.network import Network
from spdnn.model.ops import activate, output, top_k
from spdnn.model.reports import ChallengeResult
from spdnn.reference.passes import forward


def predict(net: Network, x: np.ndarray, batch_size: int = 1024, *,
            bfloat16: bool = False) -> np.ndarray:
    """Output block for samples x (samples x features), as (samples x outputs)."""
    outs = []
    for start in range(0, x.shape[0], batch_size):
        zs, _ = forward(net, columns(x.astype(net.dtype, copy=False),
                                     slice(start, start + batch_size)), bfloat16=bfloat16)
        outs.append(output(zs[-1], net.output_function).T)
    return np.concatenate(outs) if outs else np.zeros((0, net.sizes[-1]))


def accuracy(net: Network, x: np.ndarray, y: np.ndarray, *, bfloat16: bool = False) -> float:
    return float(np.mean(np.argmax(predict(net, x, bfloat16=bfloat16), axis=1) == y)) \
        if len(y) else float("nan")


def precisions(net: Network, x: np.ndarray | sp.csr_matrix, y: MultiLabels,
               batch_size: int = 1024) -> tuple[float, float]:
    """P@1 and P@5 on label sets."""
    tops = [top_k(predict(net, x[start:start + batch_size]).T, 5)
            for start in range(0, x.shape[0], batch_size)]
    top = np.concatenate(tops) if tops else np.zeros((0, 5), dtype=np.int64)
    return precision_at(y, top, 1), precision_at(y, top, 5)


def challenge_infer(net: Network, images: sp.csr_matrix) -> ChallengeResult:
    """Y <- h(W Y + b) through every layer (hidden activation and cap on all layers).

    When no bias is positive an all-zero sample stays zero, so such columns are dropped as they
    die (the result is the same; the work shrinks).
    """
    x = np.ascontiguousarray(images.T.toarray(), dtype=net.dtype)
    ids = np.arange(images.shape[0])
    can_drop = all(float(layer.bias.max(initial=0)) <= 0 for layer in net.layers)
    t0 = time.perf_counter()
    for layer in net.layers:
        x = activate(layer.weight @ x + layer.bias[:, None], net.cap)
        if can_drop:
            alive = np.any(x != 0, axis=0)
            if not alive.all():
                x = np.ascontiguousarray(x[:, alive])
                ids = ids[alive]
    seconds = time.perf_counter() - t0
    cats = ids[np.any(x != 0, axis=0)] + 1
    return ChallengeResult(np.sort(cats), seconds, images.shape[0], net.nnz)
