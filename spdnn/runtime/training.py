"""Distributed minibatch training: the serial run's batches, losses and updates on P ranks.

Sample order (``batching``), losses (``ops``) and the optimizer (``optim``) are the ones the
serial reference uses, so P ranks compute what one process computes. With replicas, each
minibatch is cut into contiguous slices, one per replica; the loss is a mean over the whole
minibatch, so the gradient summed over the replicas is the serial one, and every replica
applies the identical update.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from spdnn.comm.mpi import AgreedError, Communicator
from spdnn.io.checkpoint_format import manifest_path
from spdnn.io.loaders import Dataset
from spdnn.kernels.lsh import LshSpec, fill_rows, is_rebuild_step
from spdnn.kernels.update import PARALLEL
from spdnn.lossy.compress import CompressSpec
from spdnn.lossy.critical import CriticalSet
from spdnn.lossy.state import LossyState, load_lossy
from spdnn.model.batching import batch_order, n_batches
from spdnn.model.clipping import clip_coefficient, clip_report, scale, squared_norm
from spdnn.model.counters import Dropout
from spdnn.model.labels import as_labels, is_targets
from spdnn.model.reports import EpochReport
from spdnn.model.schedule import Schedule, planned
from spdnn.model.sparsity import SparseUpdate
from spdnn.optim import Optimizer, SavedState, interleave, make, settings
from spdnn.runtime.accounting import Counters
from spdnn.runtime.checkpoint import Position, save_checkpoint
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.inference import evaluate, evaluate_loss, local_inputs, precisions
from spdnn.runtime.lsh_layer import use_lsh
from spdnn.runtime.sample_shares import SampleFeed
from spdnn.runtime.topology import TopologyUpdates, UpdateRecord


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    epochs: int
    batch_size: int
    optimizer: Any  # an optimizer's config (spdnn.optim): SGDConfig, AdamConfig, ...
    seed: int = 0
    shuffle: bool = True
    loss: Literal["cross_entropy", "mse"] = "cross_entropy"
    max_steps: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    compress: CompressSpec = CompressSpec()  # of the gradient sums over replicas
    critical_set: float | None = None  # train between full passes on this fraction
    refresh: int = 2  # epochs between full passes (with critical_set)
    lsh: LshSpec | None = None  # LSH-selected neurons of the output layer (SLIDE)
    rehash: int = 50  # steps before the first rebuild of the LSH tables
    schedule: Schedule = Schedule()  # of the rate; its T is set from the data (planned)
    clip_grad_norm: float | None = None  # the gradients' L2 norm over all ranks, at most
    dropout: Dropout | None = None  # on the hidden layers' outputs (spdnn.model.counters)
    early_stopping: int | None = None  # epochs without a lower loss, at most
    min_delta: float = 0.0  # a loss is lower when below the lowest by more than this
    validation_split: float | None = None  # recorded: a resume must hold out the same
    sparse_update: SparseUpdate | None = None  # topology updates (spdnn.runtime.topology)
    replanner: Any = None  # with sparse_update.replan: spdnn.runtime.replan.find_replanner()

    def settings(self) -> dict[str, Any]:
        """The run settings a checkpoint records (the options that declare a checkpoint
        field, spdnn.schema, as this run resolved them; None: unset), to refuse a resume
        that would not continue this run."""
        lsh = {"lsh": self.lsh.text() if self.lsh else None, "rehash": self.rehash}
        drop = {"dropout": list(self.dropout.rates) if self.dropout else None}
        sparse = self.sparse_update.settings() if self.sparse_update else {"sparse_update": None}
        return {"batch_size": self.batch_size, "seed": self.seed, "shuffle": self.shuffle,
                **lsh, **settings(self.optimizer), **self.schedule.settings(),
                "clip_grad_norm": self.clip_grad_norm, **drop,
                "validation_split": self.validation_split, **sparse}

    def planned(self, n_samples: int) -> TrainConfig:
        """This config with its schedule's T (and its topology updates') set for
        ``n_samples`` training samples."""
        schedule = planned(self.schedule, self.epochs, n_samples, self.batch_size,
                           self.optimizer.lr)
        sparse = self.sparse_update and replace(self.sparse_update, total=schedule.total)
        return replace(self, schedule=schedule, sparse_update=sparse)


def train(comm: Communicator, dnet: DistributedNetwork, data: Dataset, cfg: TrainConfig,
          position: Position | None = None, state: SavedState | None = None,
          lossy: LossyState | None = None,
          on_epoch: Callable[[EpochReport], None] | None = None,
          on_step: Callable[[int, int], None] | None = None,
          on_finish: Callable[[list, list], None] | None = None,
          on_best: Callable[[EpochReport], None] | None = None,
          on_update: Callable[[UpdateRecord], None] | None = None) -> list[EpochReport]:
    """Minibatch training; returns one report per epoch run (all ranks get the same reports).

    ``state``: the optimizer's state of a resumed run. ``on_finish(optimizer state arrays,
    this rank's input arrays)`` (e.g. saving the trained network) runs before the final
    checkpoint; the checkpoint is written even when it fails, and the other way round.
    ``lossy``: the compressors' residuals and the critical set of a resumed run. With
    validation samples, ``on_best(report)`` runs (collectively) after each epoch whose
    validation loss is the lowest so far; ``early_stopping`` ends the job after that many
    epochs without a loss (validation, else training) lower by more than ``min_delta``.
    With ``cfg.sparse_update``, each topology update's record goes to ``on_update``."""
    pos = position or Position()
    grid = dnet.grid
    if len(data.y_train) == 0:
        raise AgreedError(f"{data.name}: no training samples")
    if not cfg.schedule.total:
        cfg = comm.check(lambda: cfg.planned(len(data.y_train)))
    opt = make(cfg.optimizer, dnet.parameters(), state, parallel=PARALLEL)
    x_local = local_inputs(dnet, data.x_train, data.name, data.features)
    xt_local = local_inputs(dnet, data.x_test, data.name, data.features) \
        if data.x_test is not None and data.x_validation is None else None
    xv_local = local_inputs(dnet, data.x_validation, data.name, data.features) \
        if data.x_validation is not None else None
    reports = []
    n = len(data.y_train)
    # a replica that holds only its share of the samples fetches the others' (runtime.sample_shares)
    feed = SampleFeed(x_local, data.train_rows if grid.replicas > 1 else None, n, grid,
                      n_features=data.n_features)
    dnet.sums.set_compression(cfg.compress, cfg.seed, (grid.world.rank,))
    if cfg.lsh is not None:
        use_lsh(dnet, cfg.lsh, cfg.seed)
        dnet.sums.compressors[-1] = None  # its compact gradients are summed exactly
    crit = CriticalSet(n, cfg.critical_set, cfg.refresh) if cfg.critical_set else None
    if lossy is not None:
        lossy.apply(dnet, crit)
    if cfg.dropout is not None and dnet.cap is not None:
        # a kept value scaled by 1 / (1 - p) may equal the cap below it: the fold must not
        # take such an entry for one whose slope is 0 (a zero still is: dropped or z <= 0)
        for layer in dnet.layers:
            layer.exchange.cap = None

    share = grid.share(cfg.batch_size)
    updates = TopologyUpdates(dnet, opt, cfg.sparse_update, cfg.replanner,
                              share.stop - share.start) if cfg.sparse_update else None

    def checkpoint() -> None:
        save_checkpoint(comm, dnet, SavedState.of(opt), pos, str(cfg.checkpoint_dir),
                        cfg.settings(), crit)

    best, since = math.inf, 0
    while pos.epoch < cfg.epochs:
        t0 = time.perf_counter()
        before = Counters.now(dnet)
        pairs_before = dnet.sampled.active_pairs if dnet.sampled is not None else 0
        total_loss, correct, seen, steps = 0.0, 0, 0, 0
        norms: list[float] = []
        full = crit is None or crit.full(pos.epoch)
        order = crit.order(pos.epoch, cfg.seed, cfg.shuffle) if crit is not None else \
            batch_order(n, pos.epoch, cfg.seed, cfg.shuffle)
        per_epoch = n_batches(len(order), cfg.batch_size)
        stop = False
        # from the first batch not done (a resumed run starts mid-epoch); ``mine``: this
        # replica's slice of the serial batch, ``block`` its samples (features x slice)
        for b, idx, mine, block in feed.steps(order, cfg.batch_size, pos.batch):
            value, ok = _step(dnet, cfg, data, block, opt, pos, idx, mine,
                              crit if crit is not None and full else None, norms)
            total_loss += value * len(idx)
            correct += ok
            seen += len(idx)
            steps += 1
            pos.step += 1
            pos.batch = b + 1
            if updates is not None and updates.update.due(pos.step):
                record = updates.apply(pos.step, block, data.y_train[mine], len(idx), cfg.loss,
                                       None if cfg.dropout is None else
                                       (cfg.dropout, pos.step - 1, mine))
                if on_update is not None:
                    on_update(record)
            if pos.batch == per_epoch:
                if crit is not None and full:
                    crit.end_pass(grid.data)
                pos.epoch, pos.batch = pos.epoch + 1, 0
            if on_step:
                on_step(b + 1, per_epoch)
            stop = cfg.max_steps is not None and pos.step >= cfg.max_steps
            if cfg.checkpoint_dir and cfg.checkpoint_every and \
                    pos.step % cfg.checkpoint_every == 0 and not stop:
                checkpoint()
            if stop:
                break
        report = _report(comm, dnet, cfg, data, xt_local, xv_local, pos, _EpochCount(
            t0=t0, before=before, pairs_before=pairs_before, total_loss=total_loss,
            correct=correct, seen=seen, steps=steps, per_epoch=per_epoch, norms=norms))
        reports.append(report)
        if on_epoch:
            on_epoch(report)
        # the validation loss, else (with early stopping) the epoch's training loss, as
        # scikit-learn's MLP watches one or the other
        watched = report.validation_loss if report.validation_loss is not None else \
            report.loss if cfg.early_stopping is not None else None
        if watched is not None:
            since = 0 if watched < best - cfg.min_delta else since + 1
            if watched < best:
                best = watched
                if on_best is not None and report.validation_loss is not None:
                    on_best(report)
            if cfg.early_stopping is not None and since >= cfg.early_stopping:
                stop = True
        if stop:
            break
    # the largest segment fetched, with its send and receive copies (runtime.sample_shares)
    fetched = 3 * feed.fetched_bytes
    held = [a for s in opt.state for a in s.values()]
    _finish((lambda: on_finish(held, [x_local, xt_local, fetched])) if on_finish else None,
            checkpoint if cfg.checkpoint_dir else None)
    return reports


def _step(dnet: DistributedNetwork, cfg: TrainConfig, data: Dataset, block: np.ndarray,
          opt: Optimizer, pos: Position, idx: np.ndarray, mine: np.ndarray,
          crit: CriticalSet | None, norms: list[float]) -> tuple[float, int]:
    """One optimizer step on the serial batch ``idx``, of which this replica computes ``mine`` (its
    samples: ``block``, features x len(mine)): the
    forward pass (only the outputs LSH retrieves, when sampled), the backward pass with the
    gradient sums, the loss checked finite, the update. Returns the batch's mean loss and
    correct predictions, over every replica; ``crit``: record each sample's loss there;
    ``norms``: the gradient's norm before clipping, appended (with clipping)."""
    grid = dnet.grid
    if dnet.sampled is not None and is_rebuild_step(
            pos.step, cfg.rehash, cfg.checkpoint_every if cfg.checkpoint_dir else None):
        dnet.sampled.rebuild()
    fill = fill_rows(cfg.seed, pos.step, len(idx), cfg.lsh.random, dnet.sizes[-1])[
        grid.share(len(idx))] if cfg.lsh is not None and cfg.lsh.random else None
    output = dnet.sampled is not None and dnet.sampled.output
    fwd = dnet.forward(block, sampled=dnet.sampled is not None,  # labels join the output's
                       labels=as_labels(data.y_train[mine], dnet.sizes[-1]) if output else None,
                       fill=fill, dropout=None if cfg.dropout is None else
                       (cfg.dropout, pos.step, mine))
    per_sample = np.empty(len(mine)) if crit is not None else None
    dnet.sums.step = pos.step  # compressors draw by step: a resume draws the same
    value, ok, gw, gb = dnet.backward(fwd, data.y_train[mine], cfg.loss, len(idx), per_sample)
    if crit is not None and per_sample is not None:
        crit.record(mine, per_sample)
    if grid.replicas > 1:
        value, ok = grid.data.allreduce(np.array([value, ok], dtype=np.float64))
        ok = int(ok)
    if not np.isfinite(value):
        kept = (f"; the last good checkpoint is kept in {cfg.checkpoint_dir}"
                if cfg.checkpoint_dir and manifest_path(cfg.checkpoint_dir).is_file() else "")
        raise AgreedError(f"non-finite loss ({value}) at epoch {pos.epoch + 1}, step "
                          f"{pos.step + 1}: the weights or activations overflowed "
                          f"{dnet.dtype} (a lower --lr may help){kept}")
    grads = interleave(gw, gb)
    if cfg.clip_grad_norm is not None:
        # each rank squares its own rows' complete gradients (summed over the replicas, which
        # hold the same): one scalar over the model axis
        norm = math.sqrt(grid.model.allreduce_scalar(squared_norm(grads)))
        norms.append(norm)
        scale(grads, clip_coefficient(norm, cfg.clip_grad_norm))
    opt.lr = cfg.schedule.rate(pos.step, cfg.optimizer.lr)
    opt.step(grads)
    dnet.weights_updated()
    return float(value), int(ok)


@dataclass(frozen=True, kw_only=True)
class _EpochCount:
    """What the loop counted over one epoch (or the part of it this run did)."""

    t0: float
    before: Counters
    pairs_before: float
    total_loss: float
    correct: int
    seen: int
    steps: int
    per_epoch: int
    norms: list[float]


def _report(comm: Communicator, dnet: DistributedNetwork, cfg: TrainConfig, data: Dataset,
            xt_local: Any, xv_local: Any, pos: Position, c: _EpochCount) -> EpochReport:
    """The epoch's line: its loss and accuracies, speed, what it moved, and the validation
    samples' loss and accuracy, else the test split's accuracy (P@1 and P@5 on label sets).
    Collective."""
    seconds = comm.allreduce_scalar(time.perf_counter() - c.t0, "max")
    moved = Counters.now(dnet).minus(c.before).total(comm)
    active = None
    if dnet.sampled is not None:  # every rank's pairs, over the samples of all replicas
        pairs = comm.allreduce_scalar(float(dnet.sampled.active_pairs - c.pairs_before))
        active = pairs / max(c.seen, 1)
    test = p5 = None
    targets = is_targets(data.y_train)  # real-valued: no accuracy
    shared = data.test_rows is not None  # the replica holds only its share of the split
    if xt_local is not None and data.multi_label:
        test, p5 = precisions(dnet, xt_local, data.y_test, shared=shared)
    elif xt_local is not None and not targets:
        test = evaluate(dnet, xt_local, data.y_test, shared=shared)
    validation = {}
    if xv_local is not None:
        vl, va = evaluate_loss(dnet, xv_local, data.y_validation, cfg.loss)
        validation = {"validation_loss": vl, "validation_accuracy": None if targets else va}
    return EpochReport(
        epoch=pos.epoch if pos.batch == 0 else pos.epoch + 1, steps=pos.step,
        loss=c.total_loss / max(c.seen, 1),
        train_accuracy=None if targets else c.correct / max(c.seen, 1),
        test_accuracy=test, seconds=seconds, samples_per_second=c.seen / max(seconds, 1e-12),
        megabytes_sent=moved.sent / 1e6, epoch_steps=c.steps, epoch_batches=c.per_epoch,
        samples=c.seen, model_values=moved.model_values,
        gradient_values=moved.gradient_values, gradient_megabytes=moved.gradient_bytes / 1e6,
        compression_ratio=moved.ratio(cfg.compress), select_seconds=moved.select_seconds,
        precision_at_1=test if p5 is not None else None, precision_at_5=p5,
        active_outputs=active, **clip_report(c.norms, cfg.clip_grad_norm), **validation)


def _finish(*steps: Callable[[], None] | None) -> None:
    """Run every step (saving the network, the final checkpoint) even when one fails; then
    raise the first failure."""
    failed: list[AgreedError] = []
    for step in steps:
        try:
            if step:
                step()
        except AgreedError as exc:
            failed.append(exc)
    if failed:
        raise failed[0]


def resumed_lossy(dnet: DistributedNetwork, directory: str, cfg: TrainConfig, n_samples: int,
                  allow_changes: bool = False) -> LossyState | None:
    """The compressors' residuals and the critical set of a checkpoint (None when this run
    uses neither and the checkpoint holds neither)."""
    crit = CriticalSet(n_samples, cfg.critical_set, cfg.refresh) if cfg.critical_set else None
    return load_lossy(dnet, directory, cfg.compress, crit, allow_changes)
