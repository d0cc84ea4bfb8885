"""The partitioner's options as one record, checked in one place for every way in: the command
line (``spdnn-partition``, which names each option by its flag), ``partition.partition``,
``partition_network`` and the windows. The seed is normalised here too."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from spdnn.errors import OptionError

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


def _seconds(name: str, value: object, least: float = 0.0, strict: bool = True) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (value <= least if strict else value < least):
        kind = "positive" if strict else "non-negative"
        raise OptionError(name, f"must be a {kind} number of seconds, not {value!r}")


@dataclass(frozen=True, kw_only=True)
class PartitionOptions:
    """How a plan is searched. ``time_limit``: seconds for the whole call or command (loading,
    search, writing); the search stops ``reserve`` seconds before it (default: 2% of the limit,
    at least 1 s; a large network's plan and statistics take seconds to write).
    ``memory_limit`` (bytes, or text such as ``"8G"``) or ``window_layers``: partition in
    windows of consecutive layers (partition/windows.py). The other fields are
    ``spdnn-partition``'s options of the same names (``--help``)."""

    method: str = "sweep"
    epsilon: float = 0.03
    seed: int | None = 0
    objective: str = "train"
    backend: str = "auto"
    threads: int = 1
    jobs: int = 1
    time_limit: float | None = None
    reserve: float | None = None
    exact_sweeps: int = 0
    shortcuts: bool = True
    memory_limit: int | str | None = None
    window_layers: int | None = None

    def checked(self, parts: int) -> PartitionOptions:
        """These options for ``parts`` parts, every value checked (OptionError), the seed and
        the memory limit normalised."""
        _count("parts", parts, 1)
        if self.method not in METHODS:
            raise OptionError("method", f"must be one of {', '.join(METHODS)}, not "
                                        f"{self.method!r}")
        e = self.epsilon
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e < 1:
            raise OptionError("epsilon", f"must be in (0, 1), not {e!r}")
        if self.objective not in OBJECTIVES:
            raise OptionError("objective", f"must be one of {', '.join(OBJECTIVES)}, not "
                                           f"{self.objective!r}")
        if self.backend not in (*BACKENDS, "auto"):
            raise OptionError("backend", f"must be one of {', '.join((*BACKENDS, 'auto'))}, "
                                         f"not {self.backend!r}")
        _count("threads", self.threads, 1)
        if self.method == "hypergraph":
            check_backend(self.backend, int(self.threads))
        elif self.threads != 1:
            raise OptionError("threads", f"serve the hypergraph method's backend, not "
                                         f"'{self.method}'")
        if self.method != "hypergraph" and self.backend != "auto":
            raise OptionError("backend", f"chooses the hypergraph method's partitioner, not "
                                         f"'{self.method}'s")
        _count("jobs", self.jobs, 1)
        _seconds("time_limit", self.time_limit)
        _seconds("reserve", self.reserve, strict=False)
        if self.reserve is not None and self.time_limit is None:
            raise OptionError("reserve", "is kept back from a time limit: give time_limit too")
        _count("exact_sweeps", self.exact_sweeps, 0)
        if self.exact_sweeps and self.method not in SEARCHES:
            raise OptionError("exact_sweeps", f"polish a searched plan (sweep or hypergraph), "
                                              f"not '{self.method}'")
        if not isinstance(self.shortcuts, bool):
            raise OptionError("shortcuts", f"must be True or False, not {self.shortcuts!r}")
        _count("window_layers", self.window_layers, 1, optional=True)
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
