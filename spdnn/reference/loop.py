"""The reference's training loop: batches, the optimizer and its schedule, clipping, dropout,
validation, topology updates and LSH."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from spdnn.io.loaders import Dataset
from spdnn.kernels.hashing import HashFunctions
from spdnn.kernels.lsh import (
    LshSpec,
    fill_rows,
    is_rebuild_step,
    top_bias_rows,
)
from spdnn.model.batching import batch_order, batches, columns
from spdnn.model.clipping import clip_coefficient, clip_report, scale, squared_norm
from spdnn.model.counters import Dropout
from spdnn.model.labels import MultiLabels, as_labels, is_targets
from spdnn.model.network import Network
from spdnn.model.ops import loss_and_gradient, output
from spdnn.model.reports import EpochReport
from spdnn.model.schedule import Schedule, planned
from spdnn.model.sparsity import (
    SparseUpdate,
)
from spdnn.optim import interleave, make, parameters
from spdnn.reference.lsh import lsh_tables, sampled_backward
from spdnn.reference.metrics import accuracy, precisions
from spdnn.reference.passes import HiddenSampler, backward, forward
from spdnn.reference.topology import update_topology


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
    bfloat16: bool = False,
) -> tuple[Network, list[EpochReport]]:
    """Train a copy of ``net`` with the ``optimizer`` a config names (spdnn.optim);
    return it and one report per epoch. ``lsh``: SLIDE's sampled
    output layer, its tables rebuilt as ``is_rebuild_step`` says (``checkpoint_every``: the
    rebuilds of a run that writes checkpoints). ``schedule``: the rate of each step (its T
    set here), ``clip_grad_norm``: the gradients scaled as torch.nn.utils.clip_grad_norm_
    does; ``dropout``: its masks drawn by step, layer, neuron and sample index;
    ``sparse_update``: the topology updates (``update_topology``; its T set here, ``owners``
    a plan's for its growth near), each reported to ``on_update(step, per-layer counts)``.
    ``bfloat16``: the passes at bfloat16's rounding points on a float32 network (its master
    weights)."""
    if bfloat16 and (lsh is not None or dropout is not None or sparse_update is not None):
        raise ValueError("the reference's bfloat16 passes have no LSH, dropout or topology "
                         "updates")
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
                g = backward(net, columns(x, idx), y[idx], loss, masks=masks,
                             bfloat16=bfloat16)
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
                                         slice(None)), bfloat16=bfloat16)
            out = output(zs[-1], net.output_function)
            vl = loss_and_gradient(out, data.y_validation, loss)[0]
            va = None if is_targets(y) else \
                float(np.mean(np.argmax(out, axis=0) == data.y_validation))
            validation = {"validation_loss": float(vl), "validation_accuracy": va}
        elif data.x_test is not None and data.y_test is not None and not is_targets(y):
            if isinstance(data.y_test, MultiLabels):
                test_acc, p5 = precisions(net, data.x_test, data.y_test)
            else:
                test_acc = accuracy(net, data.x_test, data.y_test, bfloat16=bfloat16)
        report = EpochReport(epoch=epoch + 1, steps=steps, loss=total_loss / max(seen, 1),
                             train_accuracy=None if is_targets(y) else correct / max(seen, 1),
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
