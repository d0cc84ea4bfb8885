"""The tests' side of the warm server (tests/warm.py): one server per test process, started at
its first use, ended with the process; ``suitable`` says when a command may start there."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests import warm

ROOT = Path(__file__).resolve().parent.parent
# What the server's imports read from the environment, fixed at its start: a command whose
# environment differs in one of these starts cold.
IMPORT_TIME = ("NUMBA_", "OMP_", "OPENBLAS_", "MKL_", "PYTHON", "LD_", "MALLOC",
               "SPDNN_THREADS", "SPDNN_COLD", "COVERAGE")
_server: dict = {}
_busy = threading.Lock()  # one command at a time; a second, concurrent one starts cold


def _base() -> dict[str, str]:
    """The environment the server starts with: this process's, with this checkout on the path
    (as tests/helpers.py gives every command)."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _started() -> subprocess.Popen:
    if "proc" not in _server:
        # Its own process group: an interrupted wait ends the server and its child together.
        proc = subprocess.Popen([sys.executable, "-m", "tests.warm"], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_base(),
                                start_new_session=True)
        _server["proc"] = proc
        if "scratch" not in _server:  # the commands' stdout and stderr files
            _server["scratch"] = tempfile.mkdtemp(prefix="spdnn-warm-")
            atexit.register(_stop)
    return _server["proc"]


def _stop() -> None:
    proc = _server.pop("proc", None)
    if proc is not None:
        try:
            warm._write(proc.stdin, "stop")
        except OSError:  # the server has ended already
            pass
        proc.stdin.close()
        proc.wait(timeout=30)
    scratch = _server.pop("scratch")
    for name in os.listdir(scratch):
        os.unlink(os.path.join(scratch, name))
    os.rmdir(scratch)


def suitable(argv: list[str], environment: dict[str, str]) -> bool:
    """A module run (``-m``) or a script (``*.py``) whose import-time environment is the
    server's."""
    if os.environ.get("SPDNN_COLD") == "1" or os.name != "posix":
        return False
    if not (argv[0] == "-m" or argv[0].endswith(".py")):
        return False  # -c, -W and other interpreter options start cold
    base = _base()
    keys = set(base) | set(environment)
    return all(base.get(k) == environment.get(k) for k in keys
               if k.startswith(IMPORT_TIME))


def record(kind: str, command: list[str], seconds: float) -> None:
    """With ``SPDNN_WARM_LOG=PATH``: one line per command (warm or cold, seconds, arguments),
    to see which of the suite's commands still start cold."""
    path = os.environ.get("SPDNN_WARM_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{kind}\t{seconds:.2f}\t{' '.join(command[1:])[:200]}\n")


def run(command: list[str], cwd: Path | None, environment: dict[str, str],
        timeout: float) -> subprocess.CompletedProcess | None:
    """``subprocess.run(command, capture_output=True, text=True, ...)``, forked warm; None
    when the server is busy with another thread's command (then start it cold)."""
    if not _busy.acquire(blocking=False):
        return None
    try:
        return _run(command, cwd, environment, timeout)
    except BaseException:
        _kill()  # a test's time-out or Ctrl-C mid-command: the next command gets a new server
        raise
    finally:
        _busy.release()


def _kill() -> None:
    proc = _server.pop("proc", None)
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _run(command: list[str], cwd: Path | None, environment: dict[str, str],
         timeout: float) -> subprocess.CompletedProcess:
    proc = _started()
    scratch = _server["scratch"]
    out, err = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
    warm._write(proc.stdin, {"argv": command[1:], "cwd": str(cwd or os.getcwd()),
                             "env": environment, "stdout": out, "stderr": err,
                             "timeout": timeout})
    answer = warm._read(proc.stdout)
    if answer is None:
        raise RuntimeError(f"the warm server ended (exit {proc.wait()})")
    returncode, timed_out = answer
    with open(out) as f_out, open(err) as f_err:
        stdout, stderr = f_out.read(), f_err.read()
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
    return subprocess.CompletedProcess(command, returncode, stdout, stderr)
