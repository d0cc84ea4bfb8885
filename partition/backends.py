"""Partitioner backends: KaHyPar (``kahypar``) and, when installed, Mt-KaHyPar (``mtkahypar``).

KaHyPar ends the process on many errors (exit()/abort(), not exceptions) and must get a fresh
Context per call, so every call runs in a forked child process; a child's death becomes a
one-line SpdnnError. Inputs are validated here before they reach C++.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spdnn.errors import SpdnnError

KAHYPAR_INI = Path(__file__).resolve().parent / "kahypar_km1.ini"
BACKENDS = ("kahypar", "mtkahypar")


@dataclass(frozen=True)
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


def _kahypar_child(problem: Problem, conn) -> None:  # noqa: ANN001
    import kahypar

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
    ctx.loadINIconfiguration(str(KAHYPAR_INI))
    ctx.setK(problem.nparts)
    ctx.setEpsilon(problem.epsilon)
    ctx.setSeed(problem.seed)
    ctx.suppressOutput(True)
    kahypar.partition(hg, ctx)
    conn.send(np.array([hg.blockID(v) for v in range(problem.n_vertices)], dtype=np.int32))
    conn.close()


_MT_INIT: list = []


def _mtkahypar_initializer(mtkahypar):  # noqa: ANN001, ANN202
    # The thread pool may be initialised once per process; one thread (one per rank/core rule).
    if not _MT_INIT:
        _MT_INIT.append(mtkahypar.initialize(1))
    return _MT_INIT[0]


def _mtkahypar_solve(problem: Problem) -> np.ndarray:
    try:
        import mtkahypar
    except ImportError:
        raise SpdnnError("backend mtkahypar is not installed (pip install mtkahypar)") from None
    mt = _mtkahypar_initializer(mtkahypar)
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
    return np.array([part.block_id(v) for v in range(problem.n_vertices)], dtype=np.int32)


def solve(problem: Problem, backend: str = "kahypar", timeout: float | None = None) -> np.ndarray:
    """Partition ``problem``; returns the block of every vertex."""
    problem.validate()
    if backend == "mtkahypar":
        return _mtkahypar_solve(problem)
    if backend != "kahypar":
        raise SpdnnError(f"unknown backend '{backend}' (choose from {', '.join(BACKENDS)})")
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_kahypar_child, args=(problem, send), daemon=True)
    child.start()
    send.close()
    result = None
    try:
        if recv.poll(timeout):
            result = recv.recv()
    except EOFError:
        result = None
    child.join(5)
    if child.is_alive():
        child.kill()
        child.join()
    if result is None:
        code = child.exitcode
        why = f"timed out after {timeout} s" if code is None or code == -9 else \
            f"its process ended with exit code {code}"
        raise SpdnnError(f"KaHyPar failed on a hypergraph of {problem.n_vertices} vertices, "
                         f"{len(problem.net_indptr) - 1} nets, k={problem.nparts}: {why}")
    return result


def available_backends() -> list[str]:
    found = ["kahypar"]
    try:
        import mtkahypar  # noqa: F401
        found.append("mtkahypar")
    except ImportError:
        pass
    return found


__all__ = ["BACKENDS", "KAHYPAR_INI", "Problem", "available_backends", "solve"]
