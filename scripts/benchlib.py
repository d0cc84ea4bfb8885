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


def write_section(marker: str, title: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace the text between <!-- MARKER --> and <!-- /MARKER --> (or append it)."""
    section = f"<!-- {marker} -->\n{body.rstrip()}\n<!-- /{marker} -->"
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
