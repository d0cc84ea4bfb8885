"""The Python API: train and evaluate a network on the ranks of an MPI job, from a script or a
notebook (``mpirun -n P python my_script.py``); the ``spdnn`` command is a thin layer over it.

``train`` and ``infer`` are collective: every rank calls them with the same arguments. An error
that every rank finds (a bad file, a plan for another P) is raised on every rank as an
``SpdnnError``; an exception on one rank alone aborts the whole job, so that no rank is left
waiting in a collective. Each rank reads only its own rows of the network file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Union

from spdnn.model.network import Network
from spdnn.model.options import Path, RunOptions, TrainOptions
from spdnn.model.records import InferResult, TrainResult

if TYPE_CHECKING:
    import numpy as np
    import scipy.sparse as sp

    from spdnn.comm.mpi import Communicator, MPIComm
    from spdnn.io.loaders import Dataset
    from spdnn.model.reports import EpochReport

__all__ = ["InferResult", "RunOptions", "TrainOptions", "TrainResult", "infer", "predict",
           "train"]

# A data source: a name (``digits``, ``npz:FILE``, ``mnist:DIR``, ``xc:DIR``), ``(x, y)``,
# ``(x, y, x_test, y_test)`` or a Dataset.
DataSource = Union[str, "Dataset", tuple]

def _communicator(comm: MPIComm | Communicator | None) -> Communicator:
    from spdnn.comm.mpi import Communicator, world

    if comm is None:
        return Communicator(world())
    return comm if isinstance(comm, Communicator) else Communicator(comm)


def _timeout(run: RunOptions) -> float | None:
    """The watchdog's limit from the start of the job (a bad value is reported by the
    options' check, which runs under no limit)."""
    t = run.comm_timeout
    ok = isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < float("inf")
    return float(t) if ok else None


def _checked(network: object, run: object, options: object = None) -> None:
    """Arguments of the wrong kind (a dict for an option record, an array for the network) are
    refused here, on every rank alike, before the job starts, not deep inside it."""
    import os

    from spdnn.errors import check_type

    check_type("network", network, (str, os.PathLike, Network),
               "a network bundle's path or a spdnn.Network")
    for name, value, cls, example in (("run", run, RunOptions, "plan='plan4.npz'"),
                                      ("options", options, TrainOptions, "epochs=3")):
        if value is not None:
            check_type(name, value, cls, f"a spdnn.{cls.__name__} (e.g. spdnn.{cls.__name__}"
                                         f"({example}))")


def _collectively(comm: MPIComm | Communicator | None, run: RunOptions,
                  job: Callable[[Communicator], object]) -> object:
    """Run ``job`` on every rank under the watchdog and ``guarded``, and leave the caller's
    kernel threads as they were (spdnn.kernels.callers_threads_kept)."""
    from spdnn.comm.collective import guarded
    from spdnn.kernels import callers_threads_kept

    c = _communicator(comm)
    mark = c.split_count  # the caller's own splits of c stay
    c.watch(_timeout(run))
    try:
        with callers_threads_kept():
            return guarded(c, lambda: job(c))
    finally:
        c.watch(None)
        # the job's grid is split from c: freed with it, or alone when c is the caller's
        c.release_splits(mark)
        if c is not comm:
            c.free()


def train(network: Path | Network, *, data: DataSource = "digits", run: RunOptions | None = None,
          options: TrainOptions | None = None, save: Path | None = None,
          metrics_out: Path | None = None, comm: MPIComm | Communicator | None = None,
          verbose: bool = False, on_epoch: Callable[[EpochReport], None] | None = None,
          return_network: bool = False) -> TrainResult:
    """Train ``network`` (a bundle's path, or a ``Network`` that every rank holds) on ``data``
    across the ranks of ``comm`` (default: every rank of the job). ``data``: a source by name
    (``digits``, ``npz:FILE``, ``mnist:DIR``, ``xc:DIR``), or in memory on every rank alike:
    ``(x, y)`` or ``(x, y, x_test, y_test)``, ``x`` a numpy array or scipy sparse matrix
    (samples x features), ``y`` integer labels (or, with ``loss="mse"``, real-valued targets
    as samples x outputs); or a ``Dataset``. With
    ``save``, write the trained network, with ``metrics_out`` the metrics as JSON.
    ``verbose``: rank 0 prints what ``spdnn train`` prints; ``on_epoch`` is called on rank 0
    after each epoch. ``return_network``: the result holds the trained network, whole, on
    every rank (``TrainResult.network``; each rank then holds all of it). Collective."""
    from spdnn.jobs.train import run_training

    _checked(network, run, options)
    run = run or RunOptions()
    return _collectively(comm, run, lambda c: run_training(  # type: ignore[return-value]
        c, network, data, run, options or TrainOptions(), save, metrics_out, verbose,
        on_epoch, return_network))


def infer(network: Path | Network, *, inputs: DataSource = "digits",
          run: RunOptions | None = None,
          truth: Path | None = None, categories_out: Path | None = None,
          metrics_out: Path | None = None, comm: MPIComm | Communicator | None = None,
          verbose: bool = False, lsh: str | None = None) -> InferResult:
    """Inference with ``network`` (a path or a ``Network``): accuracy on the test split of a
    data set (``digits``, ``npz:FILE``, ``mnist:DIR``, or in memory as ``train`` takes it;
    ``xc:DIR``: P@1 and P@5, among the
    output neurons that ``lsh`` tables retrieve when given), or the Graph Challenge categories
    of an images file (``.tsv`` / ``.mtx``; with ``truth``, compared with an official category
    file; ``categories_out`` writes them, 1-based). Collective."""
    from spdnn.jobs.infer import run_inference

    _checked(network, run)
    run = run or RunOptions()
    return _collectively(comm, run, lambda c: run_inference(  # type: ignore[return-value]
        c, network, inputs, run, truth, categories_out, metrics_out, verbose, lsh))


def predict(network: Path | Network, inputs: np.ndarray | sp.spmatrix, *,
            run: RunOptions | None = None, scores: bool = False,
            comm: MPIComm | Communicator | None = None) -> np.ndarray:
    """The class of each sample of ``inputs`` (samples x features, numpy or scipy sparse, the
    same on every rank): an int64 array of one class per sample; with ``scores``, the output
    layer's values instead (samples x outputs). Every rank gets the whole result, under any
    plan and grid. Collective."""
    from spdnn.jobs.predict import run_prediction

    _checked(network, run)
    run = run or RunOptions()
    return _collectively(comm, run, lambda c: run_prediction(  # type: ignore[return-value]
        c, network, inputs, run, scores))
