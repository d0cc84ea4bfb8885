"""The partitioner's options as one record, checked in one place for every way in: the command
line (``spdnn-partition``, which names each option by its flag), ``partition.partition``,
``partition_network`` and the windows. The seed is normalised here too."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from spdnn.errors import OptionError
from spdnn.schema import Boolean, Choice, Custom, Integer, Number, check, declare, option

from .backends import BACKENDS, check_backend
from .hypergraph import OBJECTIVES

METHODS = ("sweep", "hypergraph", "block", "cyclic", "random")
# The methods that search (the others are the baselines).
SEARCHES = ("sweep", "hypergraph")
BASELINES = ("block", "cyclic", "random")


def normalize_seed(seed: int | None) -> int:
    """One place for seed handling: None means 0; KaHyPar takes a C int."""
    if seed is None:
        return 0
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= int(seed) < 2**31:
        raise OptionError("seed", f"must be an integer in [0, 2^31), not {seed!r}")
    return int(seed)


def _count(name: str, value: object, least: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise OptionError(name, f"must be an integer >= {least}, not {value!r}")


def _seed(value: object) -> object:
    normalize_seed(value)  # type: ignore[arg-type]
    return value


def _memory(value: object) -> object:
    if isinstance(value, str) or value is None or (
            isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0):
        return value
    raise ValueError(f"must be a number of bytes >= 0 or text such as '8G', not {value!r}")


_SECONDS = Number(open="low", none=True, what="a positive number of seconds")


@declare
@dataclass(frozen=True, kw_only=True)
class PartitionOptions:
    """How a plan is searched. ``time_limit``: seconds for the whole call or command (loading,
    search, writing); the search stops ``reserve`` seconds before it (default: 2% of the limit,
    at least 1 s; a large network's plan and statistics take seconds to write).
    ``memory_limit`` (bytes, or text such as ``"8G"``) or ``window_layers``: partition in
    windows of consecutive layers (partition/windows.py). Each field is declared once
    (spdnn.schema): ``spdnn-partition``'s flags come from the declarations."""

    method: str = option(
        "sweep", "sweep: multilevel placement and refinement in time and memory linear in the "
                 "pins, for networks of any size; hypergraph: KaHyPar-family runs layer by "
                 "layer and refinement, with the sweep's plan among its starts (slower: give "
                 "it a {time_limit}); or a baseline (docs/partitioner.md)", Choice(*METHODS))
    epsilon: float = option(0.03, "per-layer imbalance allowed",
                            Number(0, 1, open="both", what="a number in (0, 1)"))
    seed: int | None = option(0, "seed of the search",
                              Custom(_seed, "an integer in [0, 2^31)", int, none=True))
    objective: str = option(
        "train", "volume to minimise: train = forward + backward rows of a training step, "
                 "infer = forward rows only, for inference-only plans", Choice(*OBJECTIVES))
    backend: str = option(
        "auto", "{method} hypergraph's partitioner of the layer-by-layer runs. auto: KaHyPar on "
                "layers made of groups of identical rows (RadiX-Net, Graph Challenge), "
                "Mt-KaHyPar, if installed, on the others (faster and slightly better on "
                "unstructured layers: docs/BENCHMARKS.md); or one of them everywhere",
        Choice("auto", *BACKENDS))
    threads: int = option(1, "threads of the Mt-KaHyPar solves; the plan is the same for any "
                             "N. KaHyPar is sequential", Integer(1), metavar="N")
    jobs: int = option(1, "worker processes for the hypergraph method's independent starts "
                          "and refinements (the sweep runs in one process); the plan is the "
                          "same for any N; memory grows with N", Integer(1), metavar="N")
    time_limit: float | None = option(
        None, "finish within SECONDS (the whole command): the search stops in time to write "
              "the best complete plan so far, never worse than the best balanced baseline; "
              "the output names the starts that did not finish", _SECONDS,
        metavar="SECONDS", default_help="no limit")
    reserve: float | None = option(
        None, "seconds kept back from the time limit to write the plan",
        Number(none=True, what="a non-negative number of seconds"), flag="")
    exact_sweeps: int = option(
        0, "polish the plan by up to N sweeps of exact one-layer re-assignment (MILP, HiGHS) "
           "of its groups of identical rows; 0: off. A sweep gains little volume for much "
           "more time on large groups (docs/BENCHMARKS.md, Partitioning)", Integer(0),
        metavar="N")
    shortcuts: bool = option(
        True, "{method} hypergraph: stop a start early where it cannot beat the baselines "
              "(off: run every start to the end, even the layer-by-layer run on a network "
              "where its first layer shows it cannot)", Boolean(), flag="--no-shortcuts")
    memory_limit: int | str | None = option(
        None, "memory this command may use (suffixes K/M/G/T). A hypergraph predicted larger "
              "is built and partitioned in windows of consecutive layers that fit, read from "
              "the file as they advance", Custom(_memory, "a number of bytes", none=True),
        metavar="BYTES", default_help="the cgroup memory limit it runs under (Slurm's --mem), "
                                      "else the node's memory")
    window_layers: int | None = option(
        None, "partition in windows of at most N consecutive layers even when the whole "
              "hypergraph fits", Integer(1, none=True), metavar="N")

    def checked(self, parts: int) -> PartitionOptions:
        """These options for ``parts`` parts, every value checked (OptionError), the seed and
        the memory limit normalised."""
        _count("parts", parts, 1)
        check(self)
        if self.method == "hypergraph":
            check_backend(self.backend, int(self.threads))
        elif self.threads != 1:
            raise OptionError("threads", f"serve the hypergraph method's backend, not "
                                         f"'{self.method}'")
        if self.method != "hypergraph" and self.backend != "auto":
            raise OptionError("backend", f"chooses the hypergraph method's partitioner, not "
                                         f"'{self.method}'s")
        if self.reserve is not None and self.time_limit is None:
            raise OptionError("reserve", "is kept back from a time limit: give {time_limit} "
                                         "too", ("time_limit",))
        if self.exact_sweeps and self.method not in SEARCHES:
            raise OptionError("exact_sweeps", f"polish a searched plan (sweep or hypergraph), "
                                              f"not '{self.method}'")
        return replace(self, seed=normalize_seed(self.seed),
                       memory_limit=self._memory_limit())

    def _memory_limit(self) -> int | None:
        m = self.memory_limit
        if isinstance(m, str):
            from spdnn.comm.memlimit import parse_bytes

            return parse_bytes(m)
        _count("memory_limit", m, 0, optional=True)
        return None if m is None else int(m)

    def search(self) -> dict[str, object]:
        """The keyword arguments of ``partition_network`` and ``partition_windows`` these
        options set (their time limit is the search's share: ``search_seconds``)."""
        return {k: getattr(self, k) for k in ("method", "epsilon", "seed", "objective",
                                               "backend", "threads", "jobs", "shortcuts")}

    @property
    def windowed(self) -> bool:
        """Whether windows were asked for (``partition.partition``; the command also uses
        them, without asking, for a hypergraph predicted past its memory)."""
        return self.memory_limit is not None or self.window_layers is not None

    def check_windowed(self) -> None:
        if self.exact_sweeps:
            raise OptionError("exact_sweeps", "polish the whole hypergraph; they do not run in "
                                              "windows of layers")

    def search_seconds(self, spent: float) -> float | None:
        """The search's share of ``time_limit`` once ``spent`` seconds of it are gone: the
        rest, less the reserve for writing the plan."""
        if self.time_limit is None:
            return None
        reserve = max(1.0, 0.02 * self.time_limit) if self.reserve is None else self.reserve
        return max(self.time_limit - spent - reserve, 1e-3)
