"""Memory limits, MPI-free (the partitioner reads them too): ``--memory-limit``'s text, the
cgroup limit a process runs under (Slurm's ``--mem``) and the node's memory."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from spdnn.errors import OptionError

_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# A limit above this is "no limit" (cgroup v1 writes 2**63 rounded down to pages).
_UNLIMITED = 2**60


def parse_bytes(text: str) -> int:
    """``BYTES`` with an optional suffix K, M, G or T (powers of 1024; ``KB``, ``MiB`` and
    ``GB`` are read the same), e.g. ``1.5G``; ``none``: 0, no limit."""
    if str(text).strip().lower() == "none":
        return 0
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.I)
    if not m:
        raise OptionError("memory_limit", f"{text!r}: not a number of bytes (e.g. 4G, 512M, "
                                          "1073741824)")
    value = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if not math.isfinite(value) or value < 1:
        raise OptionError("memory_limit", f"{text!r}: must be at least one byte")
    return int(value)


def cgroup_limit(proc: Path = Path("/proc/self/cgroup"),
                 root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of the cgroup this process runs in (v2 ``memory.max`` or v1
    ``memory.limit_in_bytes``; the smallest of it and its ancestors'), None when there is
    none (what Slurm's ``--mem`` sets)."""
    found = cgroup_memory(proc, root)
    return None if found is None else found[0]


def cgroup_memory(proc: Path = Path("/proc/self/cgroup"),
                  root: Path = Path("/sys/fs/cgroup")) -> tuple[int, str] | None:
    """``cgroup_limit`` with the cgroup that sets it (the processes inside it share it)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        rel = Path(path.lstrip("/"))
        for level in (rel, *rel.parents):  # the leaf, then each ancestor up to the root
            try:
                text = (base / level / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < _UNLIMITED and (best is None or
                                                              int(text) < best[0]):
                best = (int(text), str(base / level))
    return best


def node_memory() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def process_limit() -> tuple[int, str]:
    """One process's default limit (the partitioner's): its cgroup's when one is set, else
    the node's memory; with where it came from."""
    cg = cgroup_limit()
    if cg is not None:
        return cg, "the cgroup memory limit"
    return node_memory(), "the node's memory"
