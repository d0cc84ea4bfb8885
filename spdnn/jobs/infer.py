"""An inference job: accuracy on a labelled data set, or the Graph Challenge categories of an
images file (compared with a truth file when one is given)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.comm.mpi import Communicator
from spdnn.errors import SpdnnError
from spdnn.io.datasize import data_nbytes
from spdnn.io.formats import read_categories, write_categories
from spdnn.io.images import ImageShare, image_share_nbytes, read_image_share
from spdnn.io.loaders import Dataset, check_fits
from spdnn.jobs._open import data_name, open_data, open_job
from spdnn.kernels.loading import load_kernels
from spdnn.kernels.lsh import LshSpec, check_lsh_layer, parse_lsh
from spdnn.model.labels import MultiLabels
from spdnn.model.network import Network
from spdnn.model.options import RunOptions
from spdnn.model.records import InferResult, TimingReport, TrafficReport
from spdnn.model.reports import ChallengeResult
from spdnn.runtime import memory_report
from spdnn.runtime.accounting import accounting, format_traffic, plan_volume, timing
from spdnn.runtime.grid import Grid
from spdnn.runtime.inference import challenge_infer, evaluate, local_inputs, precisions
from spdnn.runtime.lsh_layer import use_lsh
from spdnn.runtime.session import Opened, write_json
from spdnn.runtime.streamed_inference import stream_challenge, stream_scores

DATA_SETS = ("digits", "npz:", "mnist:", "xc:")


def _lsh(text: str) -> LshSpec:
    """``--lsh``, parsed once, before anything is opened (its layer is checked later)."""
    try:
        return parse_lsh(text)
    except ValueError as exc:
        raise SpdnnError(f"--lsh: {exc}") from None


def is_dataset(spec: Any) -> bool:  # noqa: ANN401
    """A labelled data set (accuracy; by name, or in memory), not Graph Challenge images
    (categories)."""
    return not isinstance(spec, str) or spec == "digits" or spec.startswith(DATA_SETS[1:])


def dataset_inputs(comm: Communicator, job: Opened, spec: str, dtype: str
                   ) -> tuple[Dataset, np.ndarray | sp.csr_matrix, np.ndarray | MultiLabels,
                              bool]:
    """The data set, my feature columns of its test split (else its training split), the
    labels, and whether the columns are of this replica's share of the samples only (a
    replica reads only its share). Collective."""
    net = job.dnet if job.dnet is not None else job.stream
    grid = net.grid
    data = open_data(comm, spec, dtype, net.input_rows, job.bundle.sizes[0],
                     (grid.replica, grid.replicas) if grid.replicas > 1 else None,
                     evaluate=True)
    x, y, rows = (data.x_test, data.y_test, data.test_rows) if data.x_test is not None else \
        (data.x_train, data.y_train, data.train_rows)
    name = data_name(spec)
    comm.check(lambda: check_fits(data, job.bundle.sizes, name))
    return data, comm.check(lambda: local_inputs(net, x, name, data.features)), y, \
        rows is not None


def run_streamed(comm: Communicator, job: Opened, spec: str, truth: str | os.PathLike | None,
                 categories_out: str | None, metrics_out: str | None, dtype: str,
                 verbose: bool) -> InferResult:
    """``run_inference`` on a network read block by block (``Opened.stream``)."""
    stream = job.stream
    show = comm.rank == 0 and verbose
    if show:
        print(stream.stream.describe(), flush=True)

    def traffic() -> dict:
        volume = plan_volume(stream.comm, job.plan, stream.ghost_rows)
        return accounting(comm, stream.traffic, volume, stream.dtype.itemsize, stream.grid.data)

    if is_dataset(spec):
        data, x_local, y, shared = dataset_inputs(comm, job, spec, dtype)
        load_kernels(stream.dtype)
        t0 = time.perf_counter()
        acc, p5 = stream_scores(stream, x_local, y, shared=shared)
        seconds = comm.allreduce_scalar(time.perf_counter() - t0, "max")
        extra = {} if p5 is None else {"precision_at_1": acc, "precision_at_5": p5}
        what = f"accuracy {acc:.4f}" if p5 is None else f"P@1 {acc:.4f}, P@5 {p5:.4f}"
        mem = stream.memory_report([x_local, data.x_train, data.x_test])
        return dataset_outcome(comm, stream.grid, acc, what, len(y), seconds, traffic(), mem,
                               extra | {"load_seconds": stream.load_seconds}, metrics_out,
                               show, ", reading the blocks included")
    expected, images = challenge_inputs(comm, job, spec, truth)
    load_kernels(stream.dtype, narrow=True)
    result = stream_challenge(comm, stream, images, job.nnz)
    mem = stream.memory_report([images.matrix])
    if show:
        print(f"reading the blocks took {stream.load_seconds:.3f} s (not in the rate)")
    return challenge_outcome(comm, job, result, traffic(), timing(comm, stream.timers), mem,
                             expected, truth, categories_out, metrics_out, show,
                             {"load_seconds": stream.load_seconds})


def run_inference(comm: Communicator, network: str | os.PathLike | Network, spec: str,
                  run: RunOptions,
                  truth: str | os.PathLike | None, categories_out: str | os.PathLike | None,
                  metrics_out: str | os.PathLike | None, verbose: bool,
                  lsh: str | None = None) -> InferResult:
    """The job behind ``spdnn.infer`` and ``spdnn infer``. Collective."""
    categories_out = None if categories_out is None else os.fspath(categories_out)
    metrics_out = None if metrics_out is None else os.fspath(metrics_out)
    lsh_spec = comm.check(lambda: _lsh(lsh)) if lsh is not None else None
    job = open_job(comm, network, run, 1,
                   [("--categories-out", categories_out), ("--metrics-out", metrics_out)],
                   can_stream=lsh is None, challenge=not is_dataset(spec),
                   data=dataset_bytes(spec, run.dtype) if is_dataset(spec) else
                   images_bytes(spec, run.dtype),
                   lsh_tables=lsh_spec.tables if lsh_spec is not None else 0,
                   lsh_layer=lsh_spec.layer - 1 if lsh_spec is not None else -1)
    if job.stream is not None:
        return run_streamed(comm, job, spec, truth, categories_out, metrics_out, run.dtype,
                            verbose)
    dnet = job.dnet
    show = comm.rank == 0 and verbose

    def traffic() -> TrafficReport:
        volume = plan_volume(dnet.comm, job.plan, [lay.exchange.n_ghost for lay in dnet.layers])
        return accounting(comm, dnet.traffic, volume, dnet.dtype.itemsize, dnet.grid.data,
                          forward_itemsize=dnet.stored.itemsize)

    if is_dataset(spec):
        data, x_local, y, shared = dataset_inputs(comm, job, spec, run.dtype)
        if lsh is not None and not data.multi_label:
            comm.agree(f"{spec}: --lsh reports P@k on label sets (xc:DIR), not on "
                       "single-label data")
        if lsh_spec is not None:
            comm.check(lambda: check_lsh_layer(
                lsh_spec, job.bundle.sizes, activations=tuple(job.bundle.meta["activations"])))
        load_kernels(dnet.dtype, bfloat16=dnet.bfloat16)
        t0 = time.perf_counter()
        extra: dict = {}
        if data.multi_label:
            if lsh_spec is not None:
                use_lsh(dnet, lsh_spec, 0)
                dnet.sampled.rebuild()
            acc, p5 = precisions(dnet, x_local, y, sampled=lsh is not None, shared=shared)
            extra = {"precision_at_1": acc, "precision_at_5": p5}
            what = f"P@1 {acc:.4f}, P@5 {p5:.4f}"
            if lsh is not None:
                active = comm.allreduce_scalar(float(dnet.sampled.active_pairs)) / len(y)
                extra |= {"lsh": lsh, "active_outputs": active}
                what += f" among the LSH-retrieved outputs ({active:,.0f} per sample)" \
                    if dnet.sampled.output else \
                    f", layer {lsh_spec.layer}'s neurons LSH-selected ({active:,.0f} per sample)"
        else:
            acc = evaluate(dnet, x_local, y, shared=shared)
            what = f"accuracy {acc:.4f}"
        seconds = comm.allreduce_scalar(time.perf_counter() - t0, "max")
        mem = memory_report.report(comm, dnet, batch=1, training=False,
                            data=[x_local, data.x_train, data.x_test])
        return dataset_outcome(comm, dnet.grid, acc, what, len(y), seconds, traffic(), mem,
                               extra, metrics_out, show)
    if lsh is not None:
        comm.agree(f"{spec}: --lsh reports P@k on label sets (xc:DIR), not on Graph Challenge "
                   "images")
    expected, images = challenge_inputs(comm, job, spec, truth)
    load_kernels(dnet.dtype, narrow=True, bfloat16=dnet.bfloat16)
    result = challenge_infer(comm, dnet, images, job.nnz)
    counted = traffic()
    mem = memory_report.report(comm, dnet, batch=1, training=False, data=[images.matrix],
                        challenge=True)
    return challenge_outcome(comm, job, result, counted, timing(comm, dnet.timers), mem,
                             expected, truth, categories_out, metrics_out, show)


def dataset_outcome(comm: Communicator, grid: Grid, acc: float, what: str, samples: int,
                    seconds: float, counted: TrafficReport, mem: dict, extra: dict,
                    metrics_out: str | None, show: bool, note: str = "") -> InferResult:
    """Print, write and return an accuracy (or P@k) result."""
    if show:
        print(f"{what} on {samples:,} samples with {comm.size} rank(s) "
              f"({samples / seconds:,.0f} samples/s{note})")
        print(format_traffic(counted, grid.parts, grid.replicas))
        print(memory_report.format_memory(mem))
    write_json(comm, metrics_out, {"accuracy": acc, **extra, "samples": samples,
                                   "seconds": seconds, "ranks": comm.size,
                                   "traffic": counted.as_dict(), "memory": mem})
    return InferResult(rank=comm.rank, samples=samples, seconds=seconds, ranks=comm.size,
                       accuracy=acc, precision_at_1=extra.get("precision_at_1"),
                       precision_at_5=extra.get("precision_at_5"), traffic=counted,
                       memory=mem)


def images_bytes(spec: str, dtype: str | None) -> Callable[[Grid, np.ndarray, int], int]:
    """What ``challenge_inputs`` will hold on a rank (its replica's share of the images, its
    features, in ``dtype``), for the memory check before loading."""
    def count(grid: Grid, input_rows: np.ndarray, n_features: int) -> int:
        return image_share_nbytes(spec, n_features, grid.share,
                                  features=_selected(input_rows, n_features),
                                  dtype=dtype or "float32")
    return count


def dataset_bytes(spec: str, dtype: str | None) -> Callable[[Grid, np.ndarray, int], int]:
    """What ``dataset_inputs`` will hold on a rank, for the memory check before loading."""
    def count(grid: Grid, input_rows: np.ndarray, n_features: int) -> int:
        return data_nbytes(spec, dtype, input_rows, n_features, training=False,
                           replicas=grid.replicas)
    return count


def _selected(input_rows: np.ndarray, n_features: int) -> np.ndarray | None:
    """The features a rank reads: None (every one) when its first layer uses them all."""
    return None if len(input_rows) == n_features else input_rows


def challenge_inputs(comm: Communicator, job: Opened, spec: str,
                     truth: str | os.PathLike | None) -> tuple[np.ndarray | None, ImageShare]:
    """The truth categories (when given) and this replica's share of the images, with only
    this rank's feature columns (each rank reads only those). Collective."""
    other = sorted(set(job.bundle.meta["activations"]) - {"relu"})
    if other:  # the challenge's categories are its ReLU network's nonzero outputs
        comm.agree(f"{job.bundle.path}: Graph Challenge inference runs ReLU networks; this one "
                   f"computes {', '.join(other)} (give a data set: mnist:DIR, ...)")
    truth = None if truth is None else os.fspath(truth)
    expected = comm.check(lambda: read_categories(truth)) if truth else None
    held = job.dnet if job.dnet is not None else job.stream
    n_features = job.bundle.sizes[0]
    # A model part reads only the features its first layer uses, in its dtype: the share is
    # then the only copy of the images this rank holds.
    return expected, comm.check(lambda: read_image_share(
        spec, n_features, held.grid.share, features=_selected(held.input_rows, n_features),
        dtype=held.dtype))


def challenge_outcome(comm: Communicator, job: Opened, result: ChallengeResult,
                      counted: TrafficReport, timed: TimingReport, mem: dict,
                      expected: np.ndarray | None, truth: str | os.PathLike | None,
                      categories_out: str | None, metrics_out: str | None, show: bool,
                      extra: dict | None = None) -> InferResult:
    """Print, write and return a Graph Challenge result (checked against ``expected``)."""
    grid = job.dnet.grid if job.dnet is not None else job.stream.grid
    metrics = {"categories": len(result.categories), "inputs": result.n_inputs,
               "seconds": result.seconds, "rate": result.rate, "ranks": comm.size,
               "traffic": counted.as_dict(), "timing": timed.as_dict(), "memory": mem,
               **(extra or {})}
    if show:
        print(f"{len(result.categories)} categories from {result.n_inputs:,} inputs with "
              f"{comm.size} rank(s); inference {result.seconds:.3f} s, rate "
              f"{result.rate:.4g} edges/s")
        print(format_traffic(counted, grid.parts, grid.replicas))
        print(memory_report.format_memory(mem))
    if categories_out:
        comm.check(lambda: write_categories(categories_out, result.categories)
                   if comm.rank == 0 else None)
    out = InferResult(rank=comm.rank, samples=result.n_inputs, seconds=result.seconds,
                      ranks=comm.size, categories=result.categories, rate=result.rate,
                      traffic=counted, timing=timed, memory=mem)
    if expected is not None:
        match = bool(np.array_equal(expected, result.categories))
        metrics["truth_match"] = match
        if show:
            print("categories match the truth file" if match else
                  f"categories DIFFER from the truth file ({len(expected)} expected)")
        write_json(comm, metrics_out, metrics)
        if not match:
            comm.agree(f"{truth}: categories do not match")
        return out
    write_json(comm, metrics_out, metrics)
    return out

