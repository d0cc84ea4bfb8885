"""The shared harness of the scripts/bench/ benchmarks: the command line every benchmark has
(``parser``: ``--no-write``, ``--json FILE``, the docstring's usage as the example), rounds
(``Rounds``) and interleaving (``interleaved``), the machine line, the report (``publish``: the
report printed, its record in docs/results/ and the results pages re-rendered from the records
(scripts/bench/results.py, which documents the record); ``--json FILE`` also collects a run's
records in one file, ``{"format": "spdnn-bench/2", "script", "argv", "sections": [records]}``).
Every table value is the string the table shows (units are in the column names).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent  # the environment's spdnn, spdnn-partition and mpiexec


def shared_mnist() -> Path:
    """The MNIST under ../shared/data, or the benchmark ends saying it needs it."""
    mnist = SHARED / "mnist"
    if not mnist.is_dir():
        raise SystemExit(f"{mnist}: no MNIST here (this benchmark needs the shared data)")
    return mnist


def spdnn_tool(tool: str, *args: object, env: dict[str, str] | None = None) -> None:
    """Run ``spdnn`` or ``spdnn-partition`` (``tool``) of this environment to make a file; a
    failure ends the benchmark with its stderr."""
    proc = subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} {' '.join(map(str, args[:3]))} ... failed:\n{proc.stderr}")


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
Summary = Callable[[list[list[dict[str, str]]]], list[dict[str, str]]]


def summary_row(what: str, spdnn: str, peer: str = "-", ratio: str = "-") -> dict[str, str]:
    """One row of a results page: what was measured, spdnn's figure, the peer's, the ratio."""
    return {"what": what, "spdnn": spdnn, "peer": peer, "ratio": ratio}


def number(text: str) -> float:
    """The first number a table cell shows ('1,234', '2.14e+10', '196 / 206', '**0.97**')."""
    found = re.search(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", text.replace("**", ""))
    if found is None:
        raise ValueError(f"no number in {text!r}")
    return float(found.group(0).replace(",", ""))


def median_of(text: str) -> float:
    """The median of a 'best / median' cell, or its only number."""
    parts = text.split("/")
    return number(parts[1] if len(parts) == 2 else parts[0])


def publish(args: argparse.Namespace, marker: str, title: str, body: str, *,
            area: str | None, rows: Summary | None, page: str = "BENCHMARKS",
            command: str | None = None, results: Path | None = None) -> dict:
    """The report of one run: ``body`` printed in full; its record (the summary ``rows``
    computes from the body's tables, every table, the machine, the date and the command)
    written to docs/results/MARKER.json and the results page re-rendered, unless
    ``--no-write``; the record added to the ``--json`` file if given. ``rows=None``: a
    comparison of two source trees, which belongs in a commit message, not on a page: printed
    and added to ``--json`` only."""
    import shlex

    print(body, flush=True)
    tables = markdown_tables(body)
    record = {"format": "spdnn-results/1", "marker": marker, "page": page, "area": area,
              "title": title,
              "command": command or shlex.join(["python", f"scripts/bench/{Path(sys.argv[0]).name}",
                                                *measured(sys.argv[1:])]),
              "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
              "rows": rows(tables) if rows else [], "tables": tables}
    from spdnn.io.atomic import write_text  # fsynced, renamed: as every spdnn output

    if rows is not None and not args.no_write:
        import results as pages

        where = results or pages.RESULTS
        pages.check_record(record, marker)
        where.mkdir(parents=True, exist_ok=True)
        write_text(where / f"{marker}.json", json.dumps(record, indent=1) + "\n",
                   f"the record {marker}.json")
        if results is None:
            pages.write_pages()
    if getattr(args, "json", None):
        _SECTIONS.append(record)
        write_text(Path(args.json), json.dumps(
            {"format": "spdnn-bench/2", "script": Path(sys.argv[0]).name,
             "argv": sys.argv[1:], "sections": _SECTIONS}, indent=1) + "\n",
            "the JSON results")
    return record


# Options that say where a run writes, not what it measures: left out of a record's command.
SCRATCH = ("--work", "--json")


def measured(argv: list[str]) -> list[str]:
    """``argv`` without the SCRATCH options (``--work DIR``, ``--json=FILE``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in SCRATCH:
            skip = True
        elif not a.startswith(tuple(f"{o}=" for o in SCRATCH)):
            out.append(a)
    return out


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


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


class Ranks:
    """Runs a command on P ranks: ``mpiexec -n P`` on this node, or, with an emulated cluster
    (``spdnn.emulate.Cluster``, entered), on its nodes (P = 1 runs alone either way)."""

    def __init__(self, emulated: object | None = None) -> None:
        self.emulated = emulated
        self._mpiexec = str(BIN / "mpiexec")

    def run(self, cmd: list[str], ranks: int, timeout: float = 3600,
            env: dict[str, str] | None = None, cwd: Path | None = None,
            cgroup: JobCgroup | None = None) -> subprocess.CompletedProcess:
        if self.emulated is not None and ranks > 1:
            proc = self.emulated.run(cmd, ranks=ranks, capture=True, timeout=timeout)
        else:
            proc = subprocess.run(([self._mpiexec, "-n", str(ranks)] if ranks > 1 else [])
                                  + cmd, capture_output=True, text=True, timeout=timeout,
                                  env=env, cwd=cwd, preexec_fn=cgroup.join if cgroup else None)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:4])} ... on {ranks} rank(s) failed "
                             f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc


class Job(NamedTuple):
    """What one spdnn job gave: its ``--metrics-out`` record, its output, its wall time and,
    when asked, each rank's peak resident set in bytes (``/usr/bin/time -f %M``) and the
    peak its memory cgroup was charged (every rank and the launcher together)."""
    metrics: dict
    stdout: str
    stderr: str
    seconds: float
    peaks: list[int]
    cgroup_peak: int | None


class JobCgroup:
    """A memory cgroup of its own for one job (as a scheduler gives each job): the launcher
    moves into it before it execs, its ranks inherit it, and ``peak`` is what the kernel
    charged it at most (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``: anonymous
    memory and the page cache the job itself brought in). Needs root; removed on exit."""

    ROOT = Path("/sys/fs/cgroup")

    def __init__(self) -> None:
        v1 = self.ROOT / "memory"
        parent = v1 if v1.is_dir() else self.ROOT
        self.peak_file = "memory.max_usage_in_bytes" if v1.is_dir() else "memory.peak"
        self.path = parent / f"spdnn-bench-{os.getpid()}-{time.monotonic_ns()}"

    def __enter__(self) -> JobCgroup:
        try:
            self.path.mkdir()
        except OSError as e:
            raise SystemExit(f"cannot make the job's memory cgroup {self.path}: {e} (as root, "
                             "with the memory controller)") from e
        return self

    def join(self) -> None:
        """Move the calling process in (run in the child, before it execs)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self) -> int:
        return int((self.path / self.peak_file).read_text())

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):  # the last rank's exit is accounted a moment after it ends
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def run_job(arguments: list[str], ranks: int = 1, *, metrics: Path,
            command: list[str] | None = None, env: dict[str, str] | None = None,
            cwd: Path | None = None, peaks: bool = False, emulated: object | None = None,
            cgroup: bool = False, timeout: float = 3600) -> Job:
    """One spdnn job, as every benchmark launches it: ``spdnn ARGUMENTS --metrics-out
    METRICS`` on ``ranks`` ranks (``Ranks``: mpiexec here, or an emulated cluster's nodes) and
    its metrics read back. ``command`` replaces the installed ``spdnn`` (``python -m spdnn``
    from another source tree); a job that fails ends the benchmark with its command and the
    end of its stderr. ``cgroup``: the job runs in a memory cgroup of its own (``JobCgroup``,
    on this node) and ``Job.cgroup_peak`` is what it was charged at most."""
    cmd = [*(command or [str(BIN / "spdnn")]), *arguments, "--metrics-out", str(metrics)]
    if peaks:
        cmd = ["/usr/bin/time", "-f", "peak-kB %M", *cmd]
    group = JobCgroup() if cgroup else None
    with group or contextlib.nullcontext():
        t0 = time.perf_counter()
        proc = Ranks(emulated).run(cmd, ranks, timeout=timeout, env=env, cwd=cwd,
                                   cgroup=group)
        seconds = time.perf_counter() - t0
        charged = group.peak() if group else None
    found = [int(k) * 1024 for k in re.findall(r"peak-kB (\d+)", proc.stderr)] if peaks else []
    return Job(json.loads(Path(metrics).read_text()), proc.stdout, proc.stderr, seconds, found,
               charged)
