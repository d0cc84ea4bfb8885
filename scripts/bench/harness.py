"""The shared harness of the scripts/bench/ benchmarks: the command line every benchmark has
(``parser``: ``--no-write``, ``--json FILE``, the docstring's usage as the example), rounds
(``Rounds``) and interleaving (``interleaved``), the machine line, the report (``publish``: the
markdown section of docs/BENCHMARKS.md or docs/SCALING.md, printed, and the same tables as JSON
records).

JSON results (``--json FILE``), one file per run::

    {"format": "spdnn-bench/1", "script": "bench_infer.py", "argv": [...], "machine": "...",
     "date": "2026-11-27T09:30:00+00:00",
     "sections": [{"marker": "BENCH_INFER", "title": "...", "text": "...",
                   "tables": [[{"case": "...", "rate (edges/s)": "6.77e+10", ...}, ...]]}]}

Every value is the string the table shows (units are in the column names).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


class Rounds:
    """Values measured in interleaved rounds, by case: the best or the median of each."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, case: str, value: float) -> None:
        self.values.setdefault(case, []).append(value)

    def best(self, higher_is_better: bool = True) -> dict[str, float]:
        pick = max if higher_is_better else min
        return {case: pick(v) for case, v in self.values.items()}

    def median(self) -> dict[str, float]:
        return {case: statistics.median(v) for case, v in self.values.items()}


def parser(doc: str, **kwargs: object) -> argparse.ArgumentParser:
    """A benchmark's command line: the docstring's first paragraph as the description, its
    indented usage lines as the example, and the options every benchmark has."""
    usage = doc.split("\n\n")[1].splitlines() if "\n\n" in doc else []
    example = "\n".join(usage) if usage and usage[0].startswith("    ") else None
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 epilog=f"usage, as documented:\n{example}" if example else None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    ap.add_argument("--no-write", action="store_true",
                    help="print the report; leave the docs/ page as it is")
    ap.add_argument("--json", metavar="FILE",
                    help="also write the results as JSON records (format in scripts/bench/"
                         "harness.py)")
    return ap


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """The markdown tables of a report, each as records keyed by its header."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if len(rows) >= 2:
            header = rows[0]
            tables.append([dict(zip(header, r)) for r in rows[2:]])
        rows = []
    return tables


_SECTIONS: list[dict] = []  # what this run published, for its JSON file


def publish(args: argparse.Namespace, marker: str, title: str, body: str,
            path: Path | None = None) -> None:
    """The report of one table: printed, written to its section of ``path`` (default
    docs/BENCHMARKS.md) unless ``--no-write``, and added to the ``--json`` file if given
    (fsynced under a temporary name, then renamed)."""
    print(body, flush=True)
    if not args.no_write:
        write_section(marker, title, body, path or BENCHMARKS)
    if getattr(args, "json", None):
        _SECTIONS.append({"marker": marker, "title": title, "text": body,
                          "tables": markdown_tables(body)})
        out = Path(args.json)
        from spdnn.io.atomic import write_text  # fsynced, renamed: as every spdnn output
        record = {"format": "spdnn-bench/1", "script": Path(sys.argv[0]).name,
                  "argv": sys.argv[1:], "machine": machine(),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"), "sections": _SECTIONS}
        write_text(out, json.dumps(record, indent=1) + "\n", "the JSON results")


def machine() -> str:
    """The CPU a table was measured on, as this machine reports it (model, family, cores,
    caches, memory)."""
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
    from spdnn.io.atomic import write_text

    write_text(path, text, "the benchmarks page")


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
