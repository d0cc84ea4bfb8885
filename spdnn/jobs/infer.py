"""An inference job: accuracy on a labelled data set, or the Graph Challenge categories of an
images file (compared with a truth file when one is given)."""

from __future__ import annotations

import os
import time

import numpy as np

from spdnn.comm import Communicator
from spdnn.errors import SpdnnError
from spdnn.io.datasets import check_fits, load_dataset
from spdnn.io.formats import read_categories, write_categories
from spdnn.io.images import read_image_share
from spdnn.jobs._open import open_job
from spdnn.kernels.lsh import LshSpec, check_lsh_layer, parse_lsh
from spdnn.model.network import Network
from spdnn.model.records import InferResult, RunOptions
from spdnn.runtime import memory
from spdnn.runtime.accounting import accounting, format_traffic, plan_volume, timing
from spdnn.runtime.inference import challenge_infer, evaluate, local_inputs, precisions
from spdnn.runtime.session import warm_up, write_json

DATA_SETS = ("digits", "npz:", "mnist:", "xc:")


def _lsh(text: str, sizes: tuple[int, ...]) -> LshSpec:
    try:
        spec = parse_lsh(text)
    except ValueError as exc:
        raise SpdnnError(f"--lsh: {exc}") from None
    check_lsh_layer(spec, sizes)
    return spec


def run_inference(comm: Communicator, network: str | os.PathLike | Network, spec: str,
                  run: RunOptions,
                  truth: str | os.PathLike | None, categories_out: str | os.PathLike | None,
                  metrics_out: str | os.PathLike | None, verbose: bool,
                  lsh: str | None = None) -> InferResult:
    """The job behind ``spdnn.infer`` and ``spdnn infer``. Collective."""
    categories_out = None if categories_out is None else os.fspath(categories_out)
    metrics_out = None if metrics_out is None else os.fspath(metrics_out)
    job = open_job(comm, network, run, 1,
                   [("--categories-out", categories_out), ("--metrics-out", metrics_out)])
    dnet = job.dnet
    show = comm.rank == 0 and verbose

    def traffic() -> dict:
        volume = plan_volume(dnet.comm, job.plan, [lay.exchange.n_ghost for lay in dnet.layers])
        return accounting(comm, dnet.traffic, volume, dnet.dtype.itemsize, dnet.grid.data)

    if spec == "digits" or spec.startswith(DATA_SETS[1:]):
        data = comm.check(lambda: load_dataset(spec, run.dtype))
        x, y = (data.x_test, data.y_test) if data.x_test is not None else (data.x_train,
                                                                            data.y_train)
        comm.check(lambda: check_fits(data, job.bundle.sizes, spec))
        x_local = comm.check(lambda: local_inputs(dnet, x, spec))
        if lsh is not None and not data.multi_label:
            comm.agree(f"{spec}: --lsh reports P@k on label sets (xc:DIR), not on "
                       "single-label data")
        lsh_spec = comm.check(lambda: _lsh(lsh, job.bundle.sizes)) if lsh is not None else None
        warm_up(dnet.dtype)
        t0 = time.perf_counter()
        extra: dict = {}
        if data.multi_label:
            if lsh_spec is not None:
                dnet.use_lsh(lsh_spec, 0)
                dnet.sampled.rebuild()
            acc, p5 = precisions(dnet, x_local, y, sampled=lsh is not None)
            extra = {"precision_at_1": acc, "precision_at_5": p5}
            what = f"P@1 {acc:.4f}, P@5 {p5:.4f}"
            if lsh is not None:
                active = comm.allreduce_scalar(float(dnet.sampled.active_pairs)) / len(y)
                extra |= {"lsh": lsh, "active_outputs": active}
                what += f" among the LSH-retrieved outputs ({active:,.0f} per sample)"
        else:
            acc = evaluate(dnet, x_local, y)
            what = f"accuracy {acc:.4f}"
        seconds = comm.allreduce_scalar(time.perf_counter() - t0, "max")
        counted = traffic()
        mem = memory.report(comm, dnet, batch=1, training=False,
                            data=[x_local, data.x_train, data.x_test])
        if show:
            print(f"{what} on {len(y):,} samples with {comm.size} rank(s) "
                  f"({len(y) / seconds:,.0f} samples/s)")
            print(format_traffic(counted, dnet.grid.parts, dnet.grid.replicas))
            print(memory.format_memory(mem))
        write_json(comm, metrics_out, {"accuracy": acc, **extra, "samples": len(y),
                                       "seconds": seconds, "ranks": comm.size,
                                       "traffic": counted, "memory": mem})
        return InferResult(rank=comm.rank, samples=len(y), seconds=seconds, ranks=comm.size,
                           accuracy=acc, traffic=counted, memory=mem)
    if lsh is not None:
        comm.agree(f"{spec}: --lsh reports P@k on label sets (xc:DIR), not on Graph Challenge "
                   "images")
    if truth is not None:
        truth = os.fspath(truth)
    expected = comm.check(lambda: read_categories(truth)) if truth else None
    # each rank reads only its replica's share of the images
    images = comm.check(lambda: read_image_share(spec, job.bundle.sizes[0], dnet.grid.share))
    warm_up(dnet.dtype)
    result = challenge_infer(comm, dnet, images, job.nnz)
    counted = traffic()
    mem = memory.report(comm, dnet, batch=1, training=False, data=[images.matrix])
    metrics = {"categories": len(result.categories), "inputs": result.n_inputs,
               "seconds": result.seconds, "rate": result.rate, "ranks": comm.size,
               "traffic": counted, "timing": timing(comm, dnet.timers), "memory": mem}
    if show:
        print(f"{len(result.categories)} categories from {result.n_inputs:,} inputs with "
              f"{comm.size} rank(s); inference {result.seconds:.3f} s, rate "
              f"{result.rate:.4g} edges/s")
        print(format_traffic(counted, dnet.grid.parts, dnet.grid.replicas))
        print(memory.format_memory(mem))
    if categories_out:
        comm.check(lambda: write_categories(categories_out, result.categories)
                   if comm.rank == 0 else None)
    out = InferResult(rank=comm.rank, samples=result.n_inputs, seconds=result.seconds,
                      ranks=comm.size, categories=result.categories, rate=result.rate,
                      traffic=counted, timing=metrics["timing"], memory=mem)
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

