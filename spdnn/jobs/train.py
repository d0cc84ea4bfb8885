"""A training job: open the network under its plan, load the data, resume if asked, run SGD,
report traffic and timing, save the trained network, write the metrics."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from spdnn.comm.mpi import Communicator
from spdnn.errors import InputError, OptionError, SpdnnError
from spdnn.io.atomic import outputs_together
from spdnn.io.dataset import split_validation
from spdnn.io.loaders import check_fits
from spdnn.io.planfile import save_plan
from spdnn.kernels.loading import load_kernels
from spdnn.kernels.lsh import check_lsh_layer, parse_lsh
from spdnn.kernels.products import backend as kernels_backend
from spdnn.kernels.update import PARALLEL
from spdnn.lossy.compress import parse_compress
from spdnn.model.counters import Dropout
from spdnn.model.labels import is_targets
from spdnn.model.memory import replica_batch
from spdnn.model.network import Network
from spdnn.model.options import (
    RunOptions,
    TrainOptions,
    check_bfloat16_training,
    check_train_options,
    optimizer_config,
    schedule_of,
    sparse_update_of,
)
from spdnn.model.records import TrainResult
from spdnn.model.reports import EpochReport, short_sizes
from spdnn.model.sparsity import changeable
from spdnn.optim import describe, state_arrays
from spdnn.optim import load_kernels as load_updates
from spdnn.runtime import memory_report
from spdnn.runtime.accounting import (
    accounting,
    format_timing,
    format_traffic,
    plan_volume,
    timing,
)
from spdnn.runtime.checkpoint import adopt_topology, check_position, directory_lock, load_checkpoint
from spdnn.runtime.replan import find_replanner, plan_in_force
from spdnn.runtime.session import save_trained, whole_network, write_json
from spdnn.runtime.training import TrainConfig, resumed_lossy, train


def _config(opt: TrainOptions) -> TrainConfig:
    """The job's config from checked options (spdnn.model.options.check_train_options)."""
    check_train_options(opt)
    try:
        compress = parse_compress(opt.compress, opt.compress_min_values)
    except ValueError as exc:
        raise OptionError("compress", str(exc)) from None
    try:
        lsh = parse_lsh(opt.lsh, opt.lsh_max_active, opt.lsh_random, opt.lsh_top_bias,
                        opt.lsh_estimate_tail) if opt.lsh is not None else None
    except ValueError as exc:
        raise OptionError("lsh", str(exc)) from None
    sparse = sparse_update_of(opt)
    replanner = None
    if sparse is not None and sparse.replan != "never":
        replanner = find_replanner()
        if replanner is None:
            raise SpdnnError("--replan needs the partitioner's replanning (the partition "
                             "package's entry point spdnn.replanners: reinstall spdnn)")
    return TrainConfig(epochs=opt.epochs, batch_size=opt.batch_size,
                       optimizer=optimizer_config(opt), seed=opt.seed,
                       shuffle=opt.shuffle, loss=opt.loss, max_steps=opt.max_steps,
                       checkpoint_dir=None if opt.checkpoint_dir is None else
                       os.fspath(opt.checkpoint_dir),
                       checkpoint_every=opt.checkpoint_every, compress=compress,
                       critical_set=opt.critical_set, refresh=opt.refresh or 2, lsh=lsh,
                       rehash=opt.rehash, schedule=schedule_of(opt),
                       early_stopping=opt.early_stopping, min_delta=opt.min_delta,
                       validation_split=opt.validation_split,
                       clip_grad_norm=opt.clip_grad_norm, sparse_update=sparse,
                       replanner=replanner)


def _lossy_note(cfg: TrainConfig, replicas: int) -> str:
    note = ""
    if cfg.compress.enabled:
        note += f"; gradient sums compressed {cfg.compress.text()}" if replicas > 1 else \
            f"; --compress {cfg.compress.text()} has no effect with one replica (no sums)"
    if cfg.lsh is not None:
        note += f"; LSH {cfg.lsh.text()} (layer {cfg.lsh.layer}), rebuilt after {cfg.rehash} steps"
    if cfg.critical_set:
        note += f"; critical set {cfg.critical_set:g}, full pass every {cfg.refresh} epochs"
    return note


def run_training(comm: Communicator, network: str | os.PathLike | Network, data_spec: Any,
                 run: RunOptions, opt: TrainOptions, save: str | os.PathLike | None,
                 metrics_out: str | os.PathLike | None, verbose: bool,
                 on_epoch: Callable[[EpochReport], None] | None,
                 return_network: bool = False) -> TrainResult:
    """The job behind ``spdnn.train`` and ``spdnn train``. Collective."""
    from spdnn.jobs._open import data_name, open_data
    from spdnn.jobs.progress import Progress

    cfg = comm.check(lambda: _config(opt))
    comm.check(lambda: check_bfloat16_training(run, opt))
    save = None if save is None else os.fspath(save)
    metrics_out = None if metrics_out is None else os.fspath(metrics_out)
    job = open_training(comm, network, run, cfg, save, metrics_out, verbose, data_spec,
                        dropout=bool(opt.dropout), opt_best=opt.save_best,
                        opt_plan=opt.save_plan)
    sizes, dnet = job.bundle.sizes, job.dnet
    # each rank reads only its model part's input columns, and a replica only its share of the
    # samples (it fetches the others' as the batches need them: spdnn.runtime.sample_shares)
    grid = dnet.grid
    # a validation split is cut from every training sample (replicas then hold them all)
    data = open_data(comm, data_spec, run.dtype, dnet.input_rows, sizes[0],
                     (grid.replica, grid.replicas) if grid.replicas > 1
                     and opt.validation_split is None else None)
    if opt.validation_split is not None:
        data = comm.check(lambda: split_validation(data, opt.validation_split))
    comm.check(lambda: check_fits(data, sizes, data_name(data_spec)))
    if is_targets(data.y_train):
        comm.check(lambda: check_targets_train(opt))
    if cfg.sparse_update is not None:
        comm.check(lambda: check_changeable(job.bundle, network))
    comm.check(lambda: check_lsh_layer(cfg.lsh, sizes, loss=cfg.loss,
                                       activations=tuple(job.bundle.meta["activations"])))
    cfg = comm.check(lambda: cfg.planned(len(data.y_train)))  # the schedule's T
    cfg = comm.check(lambda: replace(cfg, dropout=Dropout.of(opt.dropout, len(sizes) - 2,
                                                             cfg.seed)))
    position, state, lossy = None, None, None
    if opt.resume:
        resume = os.fspath(opt.resume)
        if cfg.sparse_update is not None:  # the topology the checkpoint's run had reached
            comm.check(lambda: adopt_topology(dnet, resume))
        position, state = comm.check(lambda: load_checkpoint(
            dnet, resume, cfg.settings(), opt.resume_with_changes))
        lossy = comm.check(lambda: resumed_lossy(dnet, resume, cfg, len(data.y_train),
                                                 opt.resume_with_changes))
        comm.check(lambda: check_position(position, resume, cfg.batch_size, cfg.max_steps,
                                           len(data.y_train)))
        if position.epoch >= cfg.epochs or cfg.max_steps == position.step:
            if comm.rank == 0 and verbose:
                limit = f"--epochs {cfg.epochs}" if position.epoch >= cfg.epochs else \
                    f"--max-steps {cfg.max_steps}"
                print(f"{resume} is at step {position.step} (epoch {position.epoch + 1}, "
                      f"batch {position.batch}), already at {limit}: nothing to do; nothing "
                      "written", flush=True)
            return TrainResult(rank=comm.rank, epochs=(), ranks=comm.size,
                               parts=dnet.grid.parts,
                               replicas=dnet.grid.replicas,
                               plan_method=job.plan.meta.get("method"),
                               kernels=kernels_backend(),
                               network=whole_network(dnet) if return_network else None)
    if comm.rank == 0 and verbose:
        resumed = f", resumed at step {position.step}" if position else ""
        clip = f"; gradients clipped to norm {cfg.clip_grad_norm:g}" \
            if cfg.clip_grad_norm else ""
        grid = f" ({dnet.grid.parts} part(s) x {dnet.grid.replicas} replicas)" \
            if dnet.grid.replicas > 1 else ""
        print(f"training {short_sizes(sizes)} ({job.nnz:,} weights) on {data.name} "
              f"with {comm.size} rank(s){grid}, plan "
              f"{job.plan.meta.get('method', '?')}: {len(data.y_train):,} samples, batch "
              f"{cfg.batch_size}, {describe(cfg.optimizer)}{cfg.schedule.describe()}"
              f"{clip}{cfg.dropout.describe() if cfg.dropout else ''}"
              f"{cfg.sparse_update.describe() if cfg.sparse_update else ''}{resumed}"
              f"{_lossy_note(cfg, dnet.grid.replicas)}", flush=True)
    bars: list = []

    def on_step(done: int, total: int) -> None:
        """A progress bar (lines in a log) per epoch, on rank 0."""
        if not bars or done <= bars[-1].done:
            bars.append(Progress("  steps", total, enabled=comm.rank == 0 and verbose,
                                 unit="samples", per_item=cfg.batch_size))
            bars[-1].start = done  # timing starts after this step
        bars[-1].done = done
        bars[-1].update(done)
        if done == total:
            bars[-1].close()

    result: dict[str, Any] = {}

    def finish(optimizer_state: list, inputs: list) -> None:
        """Report the traffic, timing and memory and save the trained network, before the
        final checkpoint."""
        # the plan in force at the end; its statistics are the first topology's when it moved
        plan = dnet.plan if dnet.updates is None else replace(dnet.plan, meta={})
        volume = plan_volume(dnet.comm, plan, [lay.exchange.n_ghost for lay in dnet.layers])
        result["traffic"] = acc = accounting(
            comm, dnet.traffic, volume, dnet.dtype.itemsize, dnet.grid.data,
            dnet.updates.predicted() if dnet.updates is not None else None,
            forward_itemsize=dnet.stored.itemsize)
        result["timing"] = tm = timing(comm, dnet.timers)
        result["memory"] = mem = memory_report.report(
            comm, dnet, batch=replica_batch(cfg.batch_size, dnet.grid.replicas), training=True,
            optimizer=optimizer_state, optimizer_arrays=state_arrays(cfg.optimizer),
            dropout=cfg.dropout is not None,
            data=[*inputs, data.x_train, data.x_test])
        if save:  # before anything is printed (the output may be a closed pipe)
            save_trained(comm, dnet, save, {"trained_by": "spdnn train", "data": data.name})
        if opt.save_plan is not None:
            final = plan_in_force(dnet)
            comm.check(lambda: save_plan(final, opt.save_plan)
                       if final is not None and dnet.grid.replica == 0 else None)
        if comm.rank == 0 and verbose:
            print(format_traffic(acc, dnet.grid.parts, dnet.grid.replicas), flush=True)
            print(format_timing(tm), flush=True)
            print(memory_report.format_memory(mem), flush=True)
            if save:
                print(f"saved {save}")
            if opt.save_plan is not None:
                print(f"saved the plan in force to {os.fspath(opt.save_plan)}")

    def epoch_done(report: EpochReport) -> None:
        if verbose:
            print(report.line(), flush=True)
        if on_epoch is not None:
            on_epoch(report)

    load_kernels(dnet.dtype, bfloat16=dnet.bfloat16)
    load_updates((opt.optimizer,), (dnet.dtype.type,), parallel=PARALLEL)
    lock = directory_lock(comm, cfg.checkpoint_dir) if cfg.checkpoint_dir else nullcontext()
    best: list[EpochReport] = []

    def keep_best(report: EpochReport) -> None:
        best[:] = [report]
        if opt.save_best is not None:
            save_trained(comm, dnet, os.fspath(opt.save_best),
                         {"trained_by": "spdnn train", "data": data.name,
                          "epoch": report.epoch, "validation_loss": report.validation_loss})

    # --save, --save-plan and --metrics-out appear together or not at all
    together = [save, None if opt.save_plan is None else os.fspath(opt.save_plan),
                metrics_out]
    with outputs_together(together if comm.rank == 0 else []):
        updates: list[dict[str, Any]] = []
        with lock:
            reports = train(comm, dnet, data, cfg, position, state, lossy,
                            epoch_done if comm.rank == 0 else None, on_step, finish,
                            on_best=keep_best, on_update=lambda r: updates.append(r.as_dict()))
        if updates and comm.rank == 0 and verbose:
            first, last = updates[0], updates[-1]
            print(f"{len(updates)} topology update(s) from step {first['step']} to "
                  f"{last['step']}: {sum(u['dropped'] for u in updates):,} connections dropped, "
                  f"{sum(u['grown'] for u in updates):,} grown, "
                  f"{sum(u['seconds'] for u in updates):.2f} s; the plan moves "
                  f"{last['rows_per_step']:,} rows a step (before the first: "
                  f"{first['rows_before']:,})", flush=True)
        test = _tested_once(comm, dnet, data, verbose, reports, best, opt)
        out = TrainResult(rank=comm.rank, epochs=tuple(reports), ranks=comm.size,
                          parts=dnet.grid.parts,
                          replicas=dnet.grid.replicas, plan_method=job.plan.meta.get("method"),
                          kernels=kernels_backend(), traffic=result["traffic"],
                          timing=result["timing"], memory=result["memory"], test_accuracy=test,
                          topology_updates=tuple(updates),
                          network=whole_network(dnet) if return_network else None)
        write_json(comm, metrics_out, out.metrics())
    # rank 0 gives the outputs their names as the block ends: every rank returns once they
    # have them (a script's next call may read the trained network on any rank)
    comm.barrier()
    return out


def check_targets_train(opt: TrainOptions) -> None:
    """Real-valued targets (samples x outputs) train with the mse loss, without LSH."""
    if opt.loss != "mse":
        raise OptionError("loss", f"must be mse for real-valued targets (y as samples x "
                                  f"outputs), not {opt.loss}")
    if opt.lsh is not None:
        raise OptionError("lsh", "does not apply to real-valued targets: it samples the "
                                 "outputs of each sample's labels")


def check_changeable(bundle: Any, network: Any) -> None:  # noqa: ANN401
    """A topology update needs a layer that can change (one not dense)."""
    sizes = bundle.sizes
    if not any(changeable(sizes[k], sizes[k - 1], bundle.nnz(k))
               for k in range(1, len(sizes))):
        where = network if isinstance(network, (str, os.PathLike)) else "network"
        raise InputError(where, "every layer is dense: --sparse-update has no connection to "
                                "move")


def _tested_once(comm: Communicator, dnet: Any, data: Any, verbose: bool,  # noqa: ANN401
                 reports: list, best: list, opt: TrainOptions) -> float | None:
    """With a validation split: the test split scored once, on the trained network (rank 0
    says so, and which epoch was best)."""
    if data.x_validation is None:
        return None
    from spdnn.runtime.inference import evaluate, local_inputs

    test = None
    if data.x_test is not None and not is_targets(data.y_test):
        test = evaluate(dnet, local_inputs(dnet, data.x_test, data.name, data.features),
                        data.y_test)
    if comm.rank == 0 and verbose:
        stopped = opt.early_stopping is not None and reports and \
            reports[-1].epoch < opt.epochs and not reports[-1].partial
        if stopped:
            watched = "validation" if opt.validation_split is not None else "training"
            print(f"early stopping: {opt.early_stopping} epoch(s) without a lower {watched} "
                  "loss", flush=True)
        if best:
            where = f", written to {os.fspath(opt.save_best)}" if opt.save_best else ""
            print(f"best validation loss {best[0].validation_loss:.4f} at epoch "
                  f"{best[0].epoch}{where}", flush=True)
        if test is not None:
            print(f"test accuracy {test:.4f} (the trained network, scored once)", flush=True)
    return test


def open_training(comm: Communicator, network: str | os.PathLike | Network, run: RunOptions,
                  cfg: TrainConfig, save: str | None, metrics_out: str | None, verbose: bool,
                  data: Any = None, dropout: bool = False,  # noqa: ANN401
                  opt_best: str | os.PathLike | None = None,
                  opt_plan: str | os.PathLike | None = None):
    """Open the job with its outputs checked first (nothing is computed for an hour and then
    fails to be written), and ``data``'s bytes counted before anything is loaded."""
    from spdnn.io.datasize import data_nbytes
    from spdnn.jobs._open import open_job

    def count(grid: Any, features: Any, n_in: int) -> int:  # noqa: ANN401
        return data_nbytes(data, run.dtype, features, n_in, training=True,
                           replicas=grid.replicas)

    return open_job(comm, network, run, cfg.batch_size,
                    [("--save", save), ("--metrics-out", metrics_out),
                     ("--save-best", None if opt_best is None else os.fspath(opt_best)),
                     ("--save-plan", None if opt_plan is None else os.fspath(opt_plan))],
                    [("--checkpoint-dir", cfg.checkpoint_dir)], verbose, training=True,
                    data=None if data is None else count,
                    lsh_tables=cfg.lsh.tables if cfg.lsh is not None else 0,
                    lsh_layer=cfg.lsh.layer - 1 if cfg.lsh is not None else -1,
                    optimizer=cfg.optimizer, dropout=dropout)
