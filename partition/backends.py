"""Partitioner backends: KaHyPar (``kahypar``) and, when installed, Mt-KaHyPar (``mtkahypar``).

The C++ runs in child processes (forked; from a fork server inside an MPI job of several ranks,
spdnn.comm.processes.child_context). KaHyPar ends the process on many errors (exit()/abort(),
not exceptions) and must get a fresh Context, so each call gets a fresh child. Mt-KaHyPar's thread
pool can be sized only once per process, so each thread count gets one long-lived worker child.
A child's death or a timeout becomes a one-line SpdnnError. Inputs are validated here before they
reach C++.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from spdnn.comm.processes import child_context, die_with_parent, main_script_hidden
from spdnn.errors import SpdnnError

KAHYPAR_INI = Path(__file__).resolve().parent / "kahypar_km1.ini"
BACKENDS = ("kahypar", "mtkahypar")


@dataclass(frozen=True, kw_only=True)
class Problem:
    """A hypergraph partitioning problem in flat arrays (what the backends take)."""

    n_vertices: int
    net_indptr: np.ndarray
    net_pins: np.ndarray
    vertex_weights: np.ndarray  # >= 1
    net_weights: np.ndarray  # >= 1
    nparts: int
    epsilon: float
    seed: int
    fixed: np.ndarray | None = None  # block per vertex, -1 = free

    def validate(self) -> None:
        if self.nparts < 2:
            raise SpdnnError("a backend needs at least 2 parts")
        if not 0 < self.epsilon < 1:
            raise SpdnnError(f"epsilon must be in (0, 1), not {self.epsilon}")
        if len(self.vertex_weights) != self.n_vertices or self.vertex_weights.min() < 1:
            raise SpdnnError("every vertex needs a weight >= 1")
        sizes = np.diff(self.net_indptr)
        if len(sizes) and sizes.min() < 2:
            raise SpdnnError("nets with fewer than 2 pins must be filtered out")
        if len(self.net_pins) and (self.net_pins.min() < 0 or
                                   self.net_pins.max() >= self.n_vertices):
            raise SpdnnError("a net has a pin outside the vertex range")
        if self.fixed is not None and (len(self.fixed) != self.n_vertices or
                                       self.fixed.max() >= self.nparts):
            raise SpdnnError("fixed-vertex blocks out of range")


def _kahypar_child(problem: Problem, ini: str, conn: Connection) -> None:
    import kahypar

    die_with_parent()

    hg = kahypar.Hypergraph(
        problem.n_vertices, len(problem.net_indptr) - 1,
        problem.net_indptr.astype(np.uint64).tolist(), problem.net_pins.astype(np.int64).tolist(),
        problem.nparts, problem.net_weights.astype(np.int64).tolist(),
        problem.vertex_weights.astype(np.int64).tolist(),
    )
    if problem.fixed is not None:
        for v in np.flatnonzero(problem.fixed >= 0):
            hg.fixNodeToBlock(int(v), int(problem.fixed[v]))
    ctx = kahypar.Context()  # a fresh Context per call: re-use makes KaHyPar prompt and exit
    ctx.loadINIconfiguration(ini)  # the parent's choice, however the child was started
    ctx.setK(problem.nparts)
    ctx.setEpsilon(problem.epsilon)
    ctx.setSeed(problem.seed)
    ctx.suppressOutput(True)
    kahypar.partition(hg, ctx)
    conn.send(np.array([hg.blockID(v) for v in range(problem.n_vertices)], dtype=np.int32))
    conn.close()


def _mtkahypar_worker(threads: int, conn: Connection) -> None:
    """Partition every problem received until the pipe closes: the import and the thread pool
    are paid once, not per layer."""
    import mtkahypar

    die_with_parent()

    mt = mtkahypar.initialize(threads)
    while True:
        try:
            problem = conn.recv()
        except EOFError:
            return
        # The deterministic preset: the same blocks for a seed whatever the thread count
        # (tests/test_partition.py checks 1 against 2 threads).
        ctx = mt.context_from_preset(mtkahypar.PresetType.DETERMINISTIC)
        ctx.set_partitioning_parameters(problem.nparts, problem.epsilon, mtkahypar.Objective.KM1)
        mtkahypar.set_seed(problem.seed)
        ctx.logging = False
        edges = [problem.net_pins[problem.net_indptr[e]:problem.net_indptr[e + 1]].tolist()
                 for e in range(len(problem.net_indptr) - 1)]
        hg = mt.create_hypergraph(ctx, problem.n_vertices, len(edges), edges,
                                  problem.vertex_weights.tolist(), problem.net_weights.tolist())
        if problem.fixed is not None and (problem.fixed >= 0).any():
            hg.add_fixed_vertices(problem.fixed.tolist(), problem.nparts)
        part = hg.partition(ctx)
        conn.send(np.array([part.block_id(v) for v in range(problem.n_vertices)],
                           dtype=np.int32))


_NAMES = {"kahypar": "KaHyPar", "mtkahypar": "Mt-KaHyPar"}
# Live Mt-KaHyPar workers by (the process that started them, thread count).
_WORKERS: dict[tuple[int, int], tuple[BaseProcess, Connection]] = {}


def check_backend(backend: str, threads: int = 1) -> None:
    """A one-line SpdnnError unless ``backend`` (or ``auto``, the rule of layer_backends)
    can run here with ``threads`` threads."""
    if backend not in (*BACKENDS, "auto"):
        raise SpdnnError(f"unknown backend '{backend}' (choose from "
                         f"{', '.join((*BACKENDS, 'auto'))})")
    if not isinstance(threads, (int, np.integer)) or threads < 1:
        raise SpdnnError(f"threads must be a positive integer, not {threads!r}")
    if backend == "auto":
        return
    if backend == "kahypar" and threads != 1:
        raise SpdnnError("KaHyPar runs on one thread; more threads need --backend mtkahypar")
    if backend not in available_backends():
        raise SpdnnError("backend mtkahypar is not installed (pip install mtkahypar)")


def _start(target: Callable[..., None], *args: Any) -> tuple[BaseProcess, Connection]:
    ctx = child_context()  # fork, unless inside an MPI job of several ranks or beside threads
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=target, args=(*args, theirs), daemon=True)
    with main_script_hidden():
        child.start()
    theirs.close()
    return child, ours


def _stop(child: BaseProcess) -> None:
    child.join(5)
    if child.is_alive():
        child.kill()
        child.join()


def solve(problem: Problem, backend: str = "kahypar", timeout: float | None = None,
          threads: int = 1) -> np.ndarray:
    """Partition ``problem``; returns the block of every vertex. A backend that crashes or
    runs past ``timeout`` seconds becomes a one-line SpdnnError."""
    check_backend(backend, threads)
    problem.validate()
    if backend == "kahypar":
        child, conn = _start(_kahypar_child, problem, str(KAHYPAR_INI))
    else:
        key = (os.getpid(), int(threads))
        if key not in _WORKERS:
            _WORKERS[key] = _start(_mtkahypar_worker, int(threads))
        child, conn = _WORKERS[key]
    result, timed_out = None, False
    try:
        if backend == "mtkahypar":
            conn.send(problem)
        if conn.poll(timeout):
            result = conn.recv()
        else:
            timed_out = True
            child.kill()
    except (EOFError, BrokenPipeError):  # the child ended without answering
        result = None
    if backend == "kahypar" or result is None:
        conn.close()
        _stop(child)
        if backend == "mtkahypar":
            del _WORKERS[(os.getpid(), int(threads))]
    if result is None:
        why = f"timed out after {timeout} s" if timed_out else \
            f"its process ended with exit code {child.exitcode}"
        raise SpdnnError(f"{_NAMES[backend]} failed on a hypergraph of {problem.n_vertices} "
                         f"vertices, {len(problem.net_indptr) - 1} nets, k={problem.nparts}: "
                         f"{why}")
    return result


def layer_backends(backend: str, grouped: np.ndarray) -> list[str]:
    """The backend of each layer's solve. ``auto``: KaHyPar where the layer's rows form groups
    of identical rows (RadiX-Net, Graph Challenge: less volume than Mt-KaHyPar), Mt-KaHyPar
    where they do not (unstructured: slightly less volume and much faster on large layers;
    docs/BENCHMARKS.md, "Partitioning"), KaHyPar everywhere if Mt-KaHyPar is not installed."""
    if backend != "auto":
        return [backend] * len(grouped)
    other = "mtkahypar" if "mtkahypar" in available_backends() else "kahypar"
    return ["kahypar" if g else other for g in grouped]


def available_backends() -> list[str]:
    return ["kahypar"] + (["mtkahypar"] if importlib.util.find_spec("mtkahypar") else [])


__all__ = ["BACKENDS", "KAHYPAR_INI", "Problem", "available_backends", "check_backend",
           "layer_backends", "solve"]
