"""The reference's passes: forward (optionally sampled hidden rows), backward and the layers'
gradients, on whole layers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.kernels.hashing import HashFunctions, Tables
from spdnn.kernels.lsh import (
    apply_cap,
    forced,
)
from spdnn.kernels.ranges import concat_ranges, segment_ids
from spdnn.model.labels import MultiLabels, is_targets
from spdnn.model.network import Network
from spdnn.model.ops import loss_and_gradient, output
from spdnn.optim import RowGrad
from spdnn.reference.bfloat16 import rounded, rounded_weight


def sampled_products(w: sp.csr_matrix, d: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dW[e] = d[i_e] . x[j_e] on W's pattern, row by row."""
    out = np.empty(w.nnz, dtype=np.result_type(d, x))
    for i in range(w.shape[0]):
        lo, hi = w.indptr[i], w.indptr[i + 1]
        out[lo:hi] = x[w.indices[lo:hi]] @ d[i]
    return out


@dataclass(frozen=True)
class HiddenSampler:
    """``--lsh`` on a hidden layer: its tables, and the seed of its cap."""

    hashes: HashFunctions
    tables: Tables
    seed: int = 0

    def pairs(self, net: Network, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The layer's active pairs for inputs ``h`` (CSR over samples): the buckets hit."""
        spec, n_out = self.hashes.spec, net.sizes[self.hashes.spec.layer]
        ptr, act, mass, hits = self.tables.retrieve(self.hashes.codes_of_columns(h), n_out,
                                                    *forced(None, None, h.dtype, h.shape[1]))
        if spec.max_active:
            ptr, act, mass, hits = apply_cap(ptr, act, mass, hits, act, spec, n_out, self.seed,
                                             lambda samples, keys: (samples, keys))
        return ptr, act


def forward(net: Network, x0: np.ndarray, sampler: HiddenSampler | None = None, *,
            bfloat16: bool = False) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pre-activations Z_1..Z_L and activations X_0..X_{L-1} (X_0 = x0, n_0 x B); with a
    ``sampler``, its layer's Z is computed on the active pairs only, zero elsewhere.
    ``bfloat16``: the weights, X_0 and every activation rounded to bfloat16, each Z summed
    exactly and rounded once to float32 (docs/formats.md, "bfloat16")."""
    return _forward(net, x0, sampler, bfloat16=bfloat16)[:2]


def _forward(net: Network, x0: np.ndarray, sampler: HiddenSampler | None,
             masks: list | None = None, bfloat16: bool = False) -> tuple:
    """``forward``'s blocks and the sampled layer's neuron of each active pair (or None);
    ``masks[k - 1]``: dropout's factors of hidden layer k's outputs (None: none)."""
    zs: list[np.ndarray] = []
    xs: list[np.ndarray] = [rounded(x0) if bfloat16 else x0]
    act = None
    for k, layer in enumerate(net.layers, start=1):
        if bfloat16:
            w = rounded_weight(layer.weight).astype(np.float64)
            zs.append((w @ xs[-1].astype(np.float64) + layer.bias[:, None]).astype(np.float32))
            if k < net.n_layers:
                xs.append(rounded(net.hidden(k).apply(zs[-1])))
            continue
        if sampler is not None and k == sampler.hashes.spec.layer:
            ptr, act = sampler.pairs(net, xs[-1])
            s = segment_ids(ptr)
            z = np.zeros((layer.n_out, x0.shape[1]), dtype=xs[-1].dtype)
            z[act, s] = np.asarray(layer.weight[act].multiply(xs[-1][:, s].T).sum(axis=1)
                                   ).ravel() + layer.bias[act]
        else:
            z = layer.weight @ xs[-1] + layer.bias[:, None]
        zs.append(z)
        if k < net.n_layers:
            xs.append(net.hidden(k).apply(z))
            if masks is not None and masks[k - 1] is not None:
                xs[-1] *= masks[k - 1]
    return zs, xs, act


@dataclass
class Gradients:
    weights: list[np.ndarray]  # one array per layer, aligned with W_k.data
    biases: list[np.ndarray]
    loss: float
    correct: int
    pairs: int = 0  # active pairs of the LSH layer, when sampled


def backward(net: Network, x0: np.ndarray, y: np.ndarray, loss: str,
             sampler: HiddenSampler | None = None, masks: list | None = None, *,
             bfloat16: bool = False) -> Gradients:
    """Loss and gradients of all parameters for one batch (x0: n_0 x B, y: B labels). With
    a ``sampler``, its layer's gradients are those of the rows active for some sample
    (RowGrad): its error is zero off the active pairs, where its Z is zero. ``masks``:
    dropout's factors per hidden layer (``_forward``). ``bfloat16``: as ``forward``'s, and
    every error block rounded to bfloat16 before it is multiplied (float32 gradients)."""
    zs, xs, act = _forward(net, x0, sampler, masks, bfloat16)
    h = net.output_function
    out = output(zs[-1], h)
    value, grad = loss_and_gradient(out, y, loss)
    pred = np.argmax(out, axis=0)
    correct = 0 if is_targets(y) else \
        int(np.sum(y.contains(pred) if isinstance(y, MultiLabels) else pred == y))
    h.backward(grad, zs[-1], out)
    delta = grad
    gw, gb = [np.empty(0)] * net.n_layers, [np.empty(0)] * net.n_layers
    if bfloat16:
        _bfloat16_backward(net, zs, xs, rounded(delta), gw, gb)
        return Gradients(gw, gb, value, correct)
    _backward_from(net, zs, xs, delta, net.n_layers - 1, gw, gb, masks)
    if act is not None:  # the pairs the forward pass retrieved
        k = sampler.hashes.spec.layer - 1
        w = net.layers[k].weight
        union = np.unique(act)  # the rows active for some sample
        counts = np.diff(w.indptr)[union]
        gw[k] = RowGrad(w.indptr[union], gw[k][concat_ranges(w.indptr[union], counts)], counts)
        gb[k] = RowGrad(union, gb[k][union])
        return Gradients(gw, gb, value, correct, len(act))
    return Gradients(gw, gb, value, correct)


def _backward_from(net: Network, zs: list[np.ndarray], xs: list[np.ndarray],
                   delta: np.ndarray, top: int, gw: list, gb: list,
                   masks: list | None = None) -> None:
    """Gradients of layers ``top`` down to the first, from the error block of layer ``top``
    (through dropout's ``masks`` where given)."""
    for k in range(top, -1, -1):
        w = net.layers[k].weight
        gw[k] = sampled_products(w, delta, xs[k])
        gb[k] = delta.sum(axis=1)
        if k > 0:
            delta = w.T @ delta
            net.hidden(k).backward(delta, zs[k - 1])
            if masks is not None and masks[k - 1] is not None:
                delta *= masks[k - 1]


def _bfloat16_backward(net: Network, zs: list[np.ndarray], xs: list[np.ndarray],
                       delta: np.ndarray, gw: list, gb: list) -> None:
    """``_backward_from`` at bfloat16's rounding points: the rounded weights, each layer's
    error rounded before it is multiplied, W^T delta summed exactly and rounded to float32,
    the slopes read from the rounded outputs h: ReLU's 0 < h < the cap rounded (the slope of
    Z rounded, as the cap and 0 bound the rounding), the others' their formula of h in
    float32 (tanh's 1 - h^2, sigmoid's (1 - h) h; ``Activation.BFLOAT16``)."""
    cap = None if net.cap is None else float(rounded(np.array([net.cap]))[0])
    for k in range(net.n_layers - 1, -1, -1):
        w = rounded_weight(net.layers[k].weight)
        wide = delta.astype(np.float64)
        gw[k] = sampled_products(w.astype(np.float64), wide, xs[k].astype(np.float64)
                                 ).astype(np.float32)
        gb[k] = wide.sum(axis=1).astype(np.float32)
        if k > 0:
            g = (w.astype(np.float64).T @ wide).astype(np.float32)
            h, act = xs[k], net.hidden(k)
            if act.zeros:
                g *= (h > 0) & ((h < cap) if cap is not None else True)
            else:
                g *= act.slope_of(zs[k - 1], h)
            delta = rounded(g)


def layer_gradients(net: Network, x0: np.ndarray, y: np.ndarray, loss: str,
                    masks: list | None = None) -> list[np.ndarray]:
    """dL/dW of every layer as a dense array (n_out x n_in), the pattern's entries and every
    other: what RigL scores its growth by."""
    zs, xs, _ = _forward(net, x0, None, masks)
    out = output(zs[-1], net.output_function)
    delta = loss_and_gradient(out, y, loss)[1]
    net.output_function.backward(delta, zs[-1], out)
    dense = [np.empty(0)] * net.n_layers
    for k in range(net.n_layers - 1, -1, -1):
        dense[k] = delta @ xs[k].T
        if k > 0:
            delta = net.layers[k].weight.T @ delta
            net.hidden(k).backward(delta, zs[k - 1])
            if masks is not None and masks[k - 1] is not None:
                delta *= masks[k - 1]
    return dense
