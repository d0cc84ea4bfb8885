"""The serial reference engine: forward, backward and SGD on one process, clear rather than fast.

Every distributed result is tested against this module.

Semantics: ReLU (optionally capped) with ReLU'(z) = 1 only for 0 < z < cap; softmax
cross-entropy averaged over the batch, or MSE averaged over all outputs (as PyTorch's
defaults); SGD as ``torch.optim.SGD`` (momentum without dampening or Nesterov, weight decay on
every parameter, biases included); minibatches of B consecutive samples, in file order or in a
seeded per-epoch permutation, the last batch smaller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from .datasets import Dataset
from .network import Layer, Network

LOSSES = ("cross_entropy", "mse")


# --------------------------------------------------------------------------- pointwise pieces


def activate(z: np.ndarray, cap: float | None) -> np.ndarray:
    """h(z) = min(max(z, 0), cap), in place."""
    np.maximum(z, 0, out=z)
    if cap is not None:
        np.minimum(z, cap, out=z)
    return z


def activation_slope(z: np.ndarray, cap: float | None) -> np.ndarray:
    """h'(z): 1 where 0 < z < cap, else 0 (ReLU'(0) = 0, flat above the cap)."""
    mask = z > 0
    if cap is not None:
        mask &= z < cap
    return mask


def output_of(net: Network, z_last: np.ndarray) -> np.ndarray:
    if net.output_activation == "linear":
        return z_last.copy()
    return activate(z_last.copy(), net.cap)


def one_hot(y: np.ndarray, n_classes: int, dtype: Any) -> np.ndarray:
    """Targets in the column convention: (classes x batch)."""
    t = np.zeros((n_classes, len(y)), dtype=dtype)
    t[y, np.arange(len(y))] = 1
    return t


def loss_and_gradient(out: np.ndarray, y: np.ndarray, loss: str) -> tuple[float, np.ndarray]:
    """Loss of the output block (classes x batch) and its gradient w.r.t. that block."""
    n_out, batch = out.shape
    if loss == "cross_entropy":
        shifted = out - out.max(axis=0, keepdims=True)
        expo = np.exp(shifted)
        total = expo.sum(axis=0, keepdims=True)
        prob = expo / total
        value = float(np.mean(np.log(total[0]) - shifted[y, np.arange(batch)]))
        prob[y, np.arange(batch)] -= 1
        return value, prob / batch
    if loss == "mse":
        diff = out - one_hot(y, n_out, out.dtype)
        return float(np.mean(diff**2)), diff * (2.0 / diff.size)
    raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")


# --------------------------------------------------------------------------- forward / backward


def sampled_products(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dW[e] = d[i_e] . x[j_e] on W's pattern, row by row (clear, not fast)."""
    out = np.empty(w.nnz, dtype=np.result_type(d, x))
    for i in range(w.shape[0]):
        lo, hi = w.indptr[i], w.indptr[i + 1]
        out[lo:hi] = x[w.indices[lo:hi]] @ d[i]
    return out



def forward(net: Network, x0: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pre-activations Z_1..Z_L and activations X_0..X_{L-1} (X_0 = x0, n_0 x B)."""
    zs: list[np.ndarray] = []
    xs: list[np.ndarray] = [x0]
    for k, layer in enumerate(net.layers, start=1):
        z = layer.weight @ xs[-1] + layer.bias[:, None]
        zs.append(z)
        if k < net.n_layers:
            xs.append(activate(z.copy(), net.cap))
    return zs, xs


@dataclass
class Gradients:
    weights: list[np.ndarray]  # one array per layer, aligned with W_k.data
    biases: list[np.ndarray]
    loss: float
    correct: int


def backward(net: Network, x0: np.ndarray, y: np.ndarray, loss: str) -> Gradients:
    """Loss and gradients of all parameters for one batch (x0: n_0 x B, y: B labels)."""
    zs, xs = forward(net, x0)
    out = output_of(net, zs[-1])
    value, grad = loss_and_gradient(out, y, loss)
    correct = int(np.sum(np.argmax(out, axis=0) == y))
    delta = grad if net.output_activation == "linear" else grad * activation_slope(zs[-1], net.cap)
    gw: list[np.ndarray] = [np.empty(0)] * net.n_layers
    gb: list[np.ndarray] = [np.empty(0)] * net.n_layers
    for k in range(net.n_layers - 1, -1, -1):
        w = net.layers[k].weight
        gw[k] = sampled_products(w, delta, xs[k])
        gb[k] = delta.sum(axis=1)
        if k > 0:
            delta = (w.T @ delta) * activation_slope(zs[k - 1], net.cap)
    return Gradients(gw, gb, value, correct)


# --------------------------------------------------------------------------- SGD


@dataclass(frozen=True)
class SGDConfig:
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0


@dataclass
class SGD:
    """torch.optim.SGD on a flat list of parameter arrays, updated in place with one scratch
    array per parameter (no allocation per step)."""

    config: SGDConfig
    params: list[np.ndarray]
    buffers: list[np.ndarray | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.buffers:
            self.buffers = [None] * len(self.params)
        self._scratch = [np.empty_like(p) for p in self.params]

    def step(self, grads: list[np.ndarray]) -> None:
        c = self.config
        for i, (p, g) in enumerate(zip(self.params, grads)):
            d = self._scratch[i]
            if c.weight_decay:
                np.multiply(p, c.weight_decay, out=d)
                d += g
            else:
                np.copyto(d, g)
            if c.momentum:
                buf = self.buffers[i]
                if buf is None:
                    self.buffers[i] = d.copy()  # torch: the first buffer is the gradient
                else:
                    buf *= c.momentum
                    buf += d
                np.multiply(self.buffers[i], c.lr, out=d)
            else:
                d *= c.lr
            p -= d


def parameters(net: Network) -> list[np.ndarray]:
    """W_1.data, b_1, W_2.data, b_2, ... (views: updating them updates the network)."""
    out: list[np.ndarray] = []
    for layer in net.layers:
        out += [layer.weight.data, layer.bias]
    return out


# --------------------------------------------------------------------------- training loop


def batch_order(n_samples: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """One epoch's sample order: file order, or a permutation fixed by (seed, epoch)."""
    if not shuffle:
        return np.arange(n_samples)
    return np.random.default_rng([seed, epoch]).permutation(n_samples)


def batches(order: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def columns(x: np.ndarray, idx: np.ndarray | slice) -> np.ndarray:
    """Samples ``idx`` of a (samples x features) array as a contiguous (features x B) block."""
    return np.ascontiguousarray(x[idx].T)


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    loss: float
    train_accuracy: float
    test_accuracy: float | None
    seconds: float
    samples_per_second: float


def train(
    net: Network,
    data: Dataset,
    epochs: int,
    batch_size: int,
    sgd: SGDConfig,
    seed: int = 0,
    shuffle: bool = True,
    loss: str = "cross_entropy",
    max_steps: int | None = None,
    on_epoch: Callable[[EpochReport], None] | None = None,
) -> tuple[Network, list[EpochReport]]:
    """Train a copy of ``net``; return it and one report per epoch."""
    net = net.copy()
    params = parameters(net)
    opt = SGD(sgd, params)
    reports = []
    steps = 0
    x, y = data.x_train.astype(net.dtype, copy=False), data.y_train
    for epoch in range(epochs):
        t0 = time.perf_counter()
        total_loss, correct, seen = 0.0, 0, 0
        for idx in batches(batch_order(len(x), epoch, seed, shuffle), batch_size):
            g = backward(net, columns(x, idx), y[idx], loss)
            opt.step([a for pair in zip(g.weights, g.biases) for a in pair])
            total_loss += g.loss * len(idx)
            correct += g.correct
            seen += len(idx)
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        seconds = time.perf_counter() - t0
        test_acc = None
        if data.x_test is not None and data.y_test is not None:
            test_acc = accuracy(net, data.x_test, data.y_test)
        report = EpochReport(epoch + 1, total_loss / max(seen, 1), correct / max(seen, 1),
                             test_acc, seconds, seen / max(seconds, 1e-12))
        reports.append(report)
        if on_epoch:
            on_epoch(report)
        if max_steps is not None and steps >= max_steps:
            break
    return net, reports


def predict(net: Network, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """Output block for samples x (samples x features), as (samples x outputs)."""
    outs = []
    for start in range(0, len(x), batch_size):
        zs, _ = forward(net, columns(x.astype(net.dtype, copy=False),
                                     slice(start, start + batch_size)))
        outs.append(output_of(net, zs[-1]).T)
    return np.concatenate(outs) if outs else np.zeros((0, net.sizes[-1]))


def accuracy(net: Network, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(predict(net, x), axis=1) == y)) if len(y) else float("nan")


# --------------------------------------------------------------------------- Graph Challenge


@dataclass(frozen=True)
class ChallengeResult:
    categories: np.ndarray  # 1-based indices of inputs whose last activation row is nonzero
    seconds: float  # the inference loop alone
    n_inputs: int
    edges: int  # sum of nnz over layers

    @property
    def rate(self) -> float:
        """The official metric: inputs x edges / seconds."""
        return self.n_inputs * self.edges / max(self.seconds, 1e-12)


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


def with_values(net: Network, weights: list[np.ndarray], biases: list[np.ndarray]) -> Network:
    """The same network with new parameter values (patterns unchanged)."""
    layers = []
    for layer, w, b in zip(net.layers, weights, biases):
        m = layer.weight.copy()
        m.data = np.asarray(w, dtype=m.dtype)
        layers.append(Layer(m, np.asarray(b, dtype=m.dtype)))
    return replace(net, layers=tuple(layers))
