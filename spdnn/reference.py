"""The serial reference engine: forward, backward and the optimizers on one process, clear
rather than fast.

Every distributed result is tested against this module, so nothing on the distributed path
imports it; it shares only the pointwise pieces (``ops``), the optimizer (``optim``) and the
sample order (``batching``) with the runtime. Semantics: docs/formats.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.io.loaders import Dataset
from spdnn.kernels.hashing import HashFunctions, Tables
from spdnn.kernels.lsh import (
    LshSpec,
    apply_cap,
    fill_rows,
    forced,
    is_rebuild_step,
    tail_pairs,
    tail_weights,
    top_bias_rows,
)
from spdnn.kernels.ranges import concat_ranges, segment_ids
from spdnn.model.batching import batch_order, batches, columns
from spdnn.model.clipping import clip_coefficient, clip_report, scale, squared_norm
from spdnn.model.counters import Dropout
from spdnn.model.labels import MultiLabels, as_labels, precision_at
from spdnn.model.network import Network
from spdnn.model.ops import activate, activation_slope, loss_and_gradient, output, top_k
from spdnn.model.optim import RowGrad, interleave, make, parameters
from spdnn.model.reports import ChallengeResult, EpochReport
from spdnn.model.schedule import Schedule, planned
from spdnn.model.sparsity import (
    SparseUpdate,
    changeable,
    drop_counts,
    grow_draws,
    grown_values,
    layer_draws,
)


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


def forward(net: Network, x0: np.ndarray, sampler: HiddenSampler | None = None
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pre-activations Z_1..Z_L and activations X_0..X_{L-1} (X_0 = x0, n_0 x B); with a
    ``sampler``, its layer's Z is computed on the active pairs only, zero elsewhere."""
    return _forward(net, x0, sampler)[:2]


def _forward(net: Network, x0: np.ndarray, sampler: HiddenSampler | None,
             masks: list | None = None) -> tuple:
    """``forward``'s blocks and the sampled layer's neuron of each active pair (or None);
    ``masks[k - 1]``: dropout's factors of hidden layer k's outputs (None: none)."""
    zs: list[np.ndarray] = []
    xs: list[np.ndarray] = [x0]
    act = None
    for k, layer in enumerate(net.layers, start=1):
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
             sampler: HiddenSampler | None = None, masks: list | None = None) -> Gradients:
    """Loss and gradients of all parameters for one batch (x0: n_0 x B, y: B labels). With
    a ``sampler``, its layer's gradients are those of the rows active for some sample
    (RowGrad): its error is zero off the active pairs, where its Z is zero. ``masks``:
    dropout's factors per hidden layer (``_forward``)."""
    zs, xs, act = _forward(net, x0, sampler, masks)
    out = output(zs[-1], net.output_activation, net.cap)
    value, grad = loss_and_gradient(out, y, loss)
    pred = np.argmax(out, axis=0)
    correct = int(np.sum(y.contains(pred) if isinstance(y, MultiLabels) else pred == y))
    delta = grad if net.output_activation == "linear" else grad * activation_slope(zs[-1], net.cap)
    gw, gb = [np.empty(0)] * net.n_layers, [np.empty(0)] * net.n_layers
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


def layer_gradients(net: Network, x0: np.ndarray, y: np.ndarray, loss: str,
                    masks: list | None = None) -> list[np.ndarray]:
    """dL/dW of every layer as a dense array (n_out x n_in), the pattern's entries and every
    other: what RigL scores its growth by."""
    zs, xs, _ = _forward(net, x0, None, masks)
    out = output(zs[-1], net.output_activation, net.cap)
    delta = loss_and_gradient(out, y, loss)[1]
    if net.output_activation != "linear":
        delta = delta * activation_slope(zs[-1], net.cap)
    dense = [np.empty(0)] * net.n_layers
    for k in range(net.n_layers - 1, -1, -1):
        dense[k] = delta @ xs[k].T
        if k > 0:
            delta = net.layers[k].weight.T @ delta
            net.hidden(k).backward(delta, zs[k - 1])
            if masks is not None and masks[k - 1] is not None:
                delta *= masks[k - 1]
    return dense


def update_topology(net: Network, opt: Any, update: SparseUpdate, step: int,  # noqa: ANN401
                    x0: np.ndarray, y: np.ndarray, loss: str, masks: list | None = None,
                    owners: tuple[np.ndarray, ...] | None = None) -> list[dict[str, int]]:
    """The topology update after optimizer step ``step`` (spdnn.model.sparsity), row by row
    or over the whole layer: ``net``'s layers and ``opt``'s parameters and state replaced.
    RigL scores on the batch ``x0``, ``y`` (with its dropout ``masks``) at the weights after
    the step. ``owners`` (a plan's, per layer of neurons) with ``update.locality``: the
    columns the row's rank holds before the update weigh W times (``near_columns``). Returns
    per layer the connections dropped and grown (entries that left, entries that came)."""
    fraction = update.fraction(step)
    scores = layer_gradients(net, x0, y, loss, masks) if update.mode == "rigl" else None
    layers, counts = list(net.layers), []
    for k, layer in enumerate(net.layers, start=1):
        w = layer.weight
        n_out, n_in = w.shape
        if not changeable(n_out, n_in, w.nnz):
            counts.append({"dropped": 0, "grown": 0})
            continue
        g = None if scores is None else scores[k - 1]
        near = near_columns(w, owners[k - 1], owners[k]) \
            if owners is not None and update.locality != 1 else None
        if g is not None and near is not None and update.scope == "row":
            g = np.abs(g)  # RigL's scores W times higher near (layer scope: _layer_choice)
            for i in range(n_out):
                g[i, near[i]] *= g.dtype.type(update.locality)
        kept, grown = (_layer_choice if update.scope == "layer" else _row_choice)(
            w, g, fraction, update, step, k, near)
        cols_out, vals_out, src_out, ptr = [], [], [], [0]
        left = came = 0
        for i in range(n_out):
            lo, hi = int(w.indptr[i]), int(w.indptr[i + 1])
            old = {int(w.indices[e]): e for e in range(lo, hi)}
            new = sorted(kept[i] | set(grown[i]))
            fresh = [j for j in new if j not in old]
            start = grown_values(update.seed, update.index(step), k, np.full(len(fresh), i),
                                 np.array(fresh, dtype=np.int64), n_in, n_out, update.mode,
                                 w.dtype)
            values = dict(zip(fresh, start))
            for j in new:
                cols_out.append(j)
                src_out.append(old.get(j, -1))
                vals_out.append(w.data[old[j]] if j in old else values[j])
            ptr.append(len(cols_out))
            left += len(set(old) - set(new))
            came += len(fresh)
        weight = sp.csr_matrix((np.array(vals_out, dtype=w.dtype),
                                np.array(cols_out, dtype=w.indices.dtype),
                                np.array(ptr, dtype=w.indptr.dtype)), shape=w.shape)
        layers[k - 1] = replace(layer, weight=weight)
        opt.resize(2 * (k - 1), weight.data, np.array(src_out, dtype=np.int64))
        counts.append({"dropped": left, "grown": came})
    object.__setattr__(net, "layers", tuple(layers))
    return counts


def near_columns(w: sp.csr_matrix, owner_in: np.ndarray, owner_out: np.ndarray
                 ) -> list[np.ndarray]:
    """Per row, the columns its rank holds: the inputs it owns and those its rows read."""
    held: dict[int, np.ndarray] = {}
    for r in np.unique(owner_out):
        mine = np.flatnonzero(owner_out == r)
        read = np.unique(np.concatenate([w.indices[w.indptr[i]:w.indptr[i + 1]] for i in mine]))
        held[int(r)] = np.union1d(np.flatnonzero(owner_in == r), read).astype(np.int64)
    return [held[int(owner_out[i])] for i in range(w.shape[0])]


def _row_choice(w: sp.csr_matrix, g: np.ndarray | None, fraction: float,
                update: SparseUpdate, step: int, k: int, near: list | None
                ) -> tuple[list[set], list[list]]:
    """Row scope: per row, the columns it keeps and the columns it grows."""
    kept_rows, grown_rows = [], []
    for i in range(w.shape[0]):
        lo, hi = int(w.indptr[i]), int(w.indptr[i + 1])
        cols, vals = w.indices[lo:hi].tolist(), w.data[lo:hi]
        c = int(drop_counts(np.array([hi - lo]), fraction)[0])
        order = sorted(range(hi - lo), key=lambda e: (abs(float(vals[e])), cols[e]))
        kept = {cols[e] for e in order[c:]}
        if g is not None:
            free = [j for j in range(w.shape[1]) if j not in kept]
            grown = sorted(free, key=lambda j: (-abs(float(g[i, j])), j))[:c]
        else:
            grown, attempt = [], 0
            while len(grown) < c:
                j = int(grow_draws(update.seed, update.index(step), k, np.array([i]), attempt,
                                   w.shape[1], None if near is None else near[i],
                                   update.locality)[0])
                attempt += 1
                if j not in kept and j not in grown:
                    grown.append(j)
        kept_rows.append(kept)
        grown_rows.append(grown)
    return kept_rows, grown_rows


def _layer_choice(w: sp.csr_matrix, g: np.ndarray | None, fraction: float,
                  update: SparseUpdate, step: int, k: int, near: list | None
                  ) -> tuple[list[set], list[list]]:
    """Layer scope: the whole layer's smallest |w| go (ties: row, then column), as many grow
    anywhere it holds no connection; per row, the columns it keeps and grows."""
    n_out, n_in = w.shape
    coo = w.tocoo()
    c = int(drop_counts(np.array([w.nnz]), fraction)[0])
    order = sorted(range(w.nnz), key=lambda e: (abs(float(coo.data[e])), int(coo.row[e]),
                                                int(coo.col[e])))
    held = {(int(coo.row[e]), int(coo.col[e])) for e in order[c:]}
    if g is not None:
        weight = np.ones((n_out, n_in))
        for i, cols in enumerate(near or []):
            weight[i, cols] = update.locality
        free = [(i, j) for i in range(n_out) for j in range(n_in) if (i, j) not in held]
        grown = sorted(free, key=lambda p: (-abs(float(g[p])) * weight[p], p[0], p[1]))[:c]
    else:
        grown, taken, attempt = [], set(), 0
        while len(grown) < c:
            pos = int(layer_draws(update.seed, update.index(step), k, attempt, 1, n_out,
                                  n_in)[0])
            attempt += 1
            p = divmod(pos, n_in)
            if p not in held and p not in taken:
                grown.append(p)
                taken.add(p)
    kept_rows: list[set] = [set() for _ in range(n_out)]
    grown_rows: list[list] = [[] for _ in range(n_out)]
    for i, j in held:
        kept_rows[i].add(j)
    for i, j in grown:
        grown_rows[i].append(j)
    return kept_rows, grown_rows


def lsh_tables(net: Network, hashes: HashFunctions) -> Tables:
    """Tables over every neuron of the LSH layer (its rows' current weights)."""
    w = net.layers[hashes.spec.layer - 1].weight
    return Tables.build(hashes.codes(w.indptr, w.indices, w.data))


def sampled_backward(net: Network, x0: np.ndarray, y: MultiLabels, hashes: HashFunctions,
                     tables: Tables, seed: int = 0, fill: np.ndarray | None = None,
                     top_rows: np.ndarray | None = None) -> tuple[Gradients, int]:
    """SLIDE's step on one batch: the last layer's active (neuron, sample) pairs are the
    buckets the samples' inputs hit plus their labels; softmax cross-entropy over those; the
    last layer's gradients only for the rows active for some sample (as RowGrad). Also the
    number of active pairs. ``fill``: random rows per sample, ``top_rows``: rows for every
    sample."""
    last = net.layers[-1]
    zs, xs = forward(net, x0)  # (the last layer's dense Z is not used)
    h = xs[-1]
    w, batch = last.weight, h.shape[1]
    ptr, act, mass, hits = tables.retrieve(hashes.codes_of_columns(h), net.sizes[-1],
                                           *forced(y, fill, h.dtype, batch, top_rows))
    if hashes.spec.max_active:
        ptr, act, mass, hits = apply_cap(ptr, act, mass, hits, act, hashes.spec, net.sizes[-1],
                                         seed, lambda samples, keys: (samples, keys))
    s = segment_ids(ptr)
    z = np.asarray(w[act].multiply(h[:, s].T).sum(axis=1)).ravel() + last.bias[act]
    gmax = np.full(batch, -np.inf)
    np.maximum.at(gmax, s, z)
    e = np.exp(z - gmax[s])
    if hashes.spec.estimate_tail:  # the random pairs stand for the outputs not retrieved
        rand = tail_pairs(hits, mass, act, np.zeros(0) if top_rows is None else top_rows,
                          hashes.spec.tables)
        weight = tail_weights(np.bincount(s[~rand], minlength=batch),
                              np.bincount(s[rand], minlength=batch), net.sizes[-1])
        e = np.where(rand, e * weight[s], e)
    total = np.bincount(s, weights=e, minlength=batch)
    target = np.bincount(s, weights=mass * (z - gmax[s]), minlength=batch)
    has = y.counts > 0
    value = float(np.sum(np.where(has, np.log(np.where(has, total, 1)) - target, 0))) / batch
    none = np.iinfo(np.int64).max
    best = np.full(batch, none)
    top = z == gmax[s]
    np.minimum.at(best, s[top], act[top])  # the lowest row among the largest
    correct = int(np.sum(y.contains(np.where(best == none, -1, best))))
    delta = (e / np.where(has, total, 1)[s] - mass) / batch
    delta[~has[s]] = 0
    d = sp.csr_matrix((delta, (act, s)), shape=(net.sizes[-1], batch)).toarray()
    union = np.unique(act)
    counts = np.diff(w.indptr)[union]
    gw, gb = [np.empty(0)] * net.n_layers, [np.empty(0)] * net.n_layers
    gw[-1] = RowGrad(concat_ranges(w.indptr[union], counts),
                     sampled_products(w, d, h)[concat_ranges(w.indptr[union], counts)])
    gb[-1] = RowGrad(union, d.sum(axis=1)[union])
    if net.n_layers > 1:
        below = w.T @ d
        net.hidden(net.n_layers - 1).backward(below, zs[-2])
        _backward_from(net, zs, xs, below, net.n_layers - 2, gw, gb)
    return Gradients(gw, gb, value, correct), len(act)


def train(
    net: Network,
    data: Dataset,
    epochs: int,
    batch_size: int,
    optimizer: Any,  # noqa: ANN401
    seed: int = 0,
    shuffle: bool = True,
    loss: str = "cross_entropy",
    max_steps: int | None = None,
    on_epoch: Callable[[EpochReport], None] | None = None,
    lsh: LshSpec | None = None,
    rehash: int = 50,
    checkpoint_every: int | None = None,
    schedule: Schedule | None = None,
    clip_grad_norm: float | None = None,
    dropout: Dropout | None = None,
    sparse_update: SparseUpdate | None = None,
    on_update: Callable[[int, list[dict[str, int]]], None] | None = None,
    owners: tuple[np.ndarray, ...] | None = None,
) -> tuple[Network, list[EpochReport]]:
    """Train a copy of ``net`` with the ``optimizer`` a config names (spdnn.model.optim);
    return it and one report per epoch. ``lsh``: SLIDE's sampled
    output layer, its tables rebuilt as ``is_rebuild_step`` says (``checkpoint_every``: the
    rebuilds of a run that writes checkpoints). ``schedule``: the rate of each step (its T
    set here), ``clip_grad_norm``: the gradients scaled as torch.nn.utils.clip_grad_norm_
    does; ``dropout``: its masks drawn by step, layer, neuron and sample index;
    ``sparse_update``: the topology updates (``update_topology``; its T set here, ``owners``
    a plan's for its growth near), each reported to ``on_update(step, per-layer counts)``."""
    net = net.copy()
    opt = make(optimizer, parameters(net.layers))
    schedule = planned(schedule or Schedule(), epochs, len(data.y_train), batch_size, optimizer.lr)
    if sparse_update is not None and not sparse_update.total:
        sparse_update = replace(sparse_update, total=schedule.total)
    reports = []
    steps = 0
    hashes = HashFunctions.make(lsh, net.sizes[lsh.layer - 1], seed) \
        if lsh is not None else None
    hidden = lsh is not None and lsh.layer < net.n_layers
    tables = top = None
    x, y = data.x_train.astype(net.dtype, copy=False), data.y_train
    n = x.shape[0]
    for epoch in range(epochs):
        t0 = time.perf_counter()
        total_loss, correct, seen, steps_before = 0.0, 0, 0, steps
        pairs = 0
        norms: list[float] = []
        for idx in batches(batch_order(n, epoch, seed, shuffle), batch_size):
            if hashes is not None and (is_rebuild_step(steps, rehash, checkpoint_every)
                                       or tables is None):
                tables = lsh_tables(net, hashes)
                top = top_bias_rows(net.layers[-1].bias, np.arange(net.sizes[-1]),
                                    lsh.top_bias, lambda a, b: (a, b))
            if hashes is not None and hidden:
                g = backward(net, columns(x, idx), y[idx], loss,
                             HiddenSampler(hashes, tables, seed))
                pairs += g.pairs
            elif hashes is not None:
                labels = as_labels(y[idx], net.sizes[-1])
                fill = fill_rows(seed, steps, len(idx), lsh.random, net.sizes[-1]) \
                    if lsh is not None and lsh.random else None
                g, active = sampled_backward(net, columns(x, idx), labels, hashes, tables, seed,
                                             fill, top)
                pairs += active
            else:
                masks = None if dropout is None else [
                    dropout.mask(steps, k, np.arange(net.sizes[k]), idx, net.dtype)
                    for k in range(1, net.n_layers)]
                g = backward(net, columns(x, idx), y[idx], loss, masks=masks)
            step_masks = masks if hashes is None else None
            grads = interleave(g.weights, g.biases)
            if clip_grad_norm is not None:
                norm = float(np.sqrt(squared_norm(grads)))
                norms.append(norm)
                scale(grads, clip_coefficient(norm, clip_grad_norm))
            opt.lr = schedule.rate(steps, optimizer.lr)
            opt.step(grads)
            total_loss += g.loss * len(idx)
            correct += g.correct
            seen += len(idx)
            steps += 1
            if sparse_update is not None and sparse_update.due(steps):
                counts = update_topology(net, opt, sparse_update, steps, columns(x, idx),
                                         y[idx], loss, step_masks, owners)
                if on_update is not None:
                    on_update(steps, counts)
            if max_steps is not None and steps >= max_steps:
                break
        seconds = time.perf_counter() - t0
        test_acc = p5 = None
        validation = {}
        if data.x_validation is not None:  # the test split is then scored after training
            zs, _ = forward(net, columns(data.x_validation.astype(net.dtype, copy=False),
                                         slice(None)))
            out = output(zs[-1], net.output_activation, net.cap)
            vl = loss_and_gradient(out, data.y_validation, loss)[0]
            va = float(np.mean(np.argmax(out, axis=0) == data.y_validation))
            validation = {"validation_loss": float(vl), "validation_accuracy": va}
        elif data.x_test is not None and data.y_test is not None:
            if isinstance(data.y_test, MultiLabels):
                test_acc, p5 = precisions(net, data.x_test, data.y_test)
            else:
                test_acc = accuracy(net, data.x_test, data.y_test)
        report = EpochReport(epoch=epoch + 1, steps=steps, loss=total_loss / max(seen, 1),
                             train_accuracy=correct / max(seen, 1),
                             test_accuracy=test_acc, seconds=seconds,
                                 samples_per_second=seen / max(seconds, 1e-12), megabytes_sent=0.0,
                             epoch_steps=steps - steps_before,
                                 epoch_batches=-(-n // batch_size), samples=seen,
                             precision_at_1=test_acc if p5 is not None else None,
                                 precision_at_5=p5,
                             active_outputs=pairs / max(seen, 1) if hashes else None,
                             **clip_report(norms, clip_grad_norm), **validation)
        reports.append(report)
        if on_epoch:
            on_epoch(report)
        if max_steps is not None and steps >= max_steps:
            break
    return net, reports


def predict(net: Network, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """Output block for samples x (samples x features), as (samples x outputs)."""
    outs = []
    for start in range(0, x.shape[0], batch_size):
        zs, _ = forward(net, columns(x.astype(net.dtype, copy=False),
                                     slice(start, start + batch_size)))
        outs.append(output(zs[-1], net.output_activation, net.cap).T)
    return np.concatenate(outs) if outs else np.zeros((0, net.sizes[-1]))


def accuracy(net: Network, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(predict(net, x), axis=1) == y)) if len(y) else float("nan")


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

