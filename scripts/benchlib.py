"""Shared helpers of the scripts/bench_*.py benchmarks: timing and the BENCHMARKS.md sections."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"


def interleaved(fns: dict[str, Callable[[], object]], repeats: int = 5,
                warmup: int = 1) -> dict[str, float]:
    """Median seconds of each function, measured round-robin so that machine noise hits all
    of them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def machine() -> str:
    """The CPU a table was measured on, as this machine reports it (model, family, cores,
    caches, memory)."""
    import os

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text()
            if "Instruction" not in kind:
                caches.append(f"L{level} {(index / 'size').read_text().strip()}")
        except OSError:
            continue
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')}, "
            f"model {info.get('model', '?')}), {os.cpu_count()} cores, "
            f"{', '.join(caches) or 'caches unknown'} (as cpu0 sees them), "
            f"{memory:.0f} GiB")


def write_section(marker: str, title: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace the text between <!-- MARKER --> and <!-- /MARKER --> (or append it); the
    section's first line names the machine it was measured on."""
    section = f"<!-- {marker} -->\nMachine: {machine()}.\n{body.rstrip()}\n<!-- /{marker} -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- {marker} -->.*?<!-- /{marker} -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip() + f"\n\n## {title}\n\n{section}\n"
    path.write_text(text)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


class Ranks:
    """Runs a command on P ranks: ``mpiexec -n P`` on this node, or, with an emulated cluster
    (``spdnn.emulate.Cluster``, entered), on its nodes (P = 1 runs alone either way)."""

    def __init__(self, emulated: object | None = None) -> None:
        import sys

        self.emulated = emulated
        self._mpiexec = str(Path(sys.executable).parent / "mpiexec")

    def run(self, cmd: list[str], ranks: int, timeout: float = 3600):  # noqa: ANN201
        import subprocess

        if self.emulated is not None and ranks > 1:
            proc = self.emulated.run(cmd, ranks=ranks, capture=True, timeout=timeout)
        else:
            proc = subprocess.run(([self._mpiexec, "-n", str(ranks)] if ranks > 1 else [])
                                  + cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:4])} ... on {ranks} rank(s) failed "
                             f"(exit {proc.returncode}):\n{proc.stderr}")
        return proc
