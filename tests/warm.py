"""A warm start for the tests' one-process commands: a server that has imported what the
``spdnn`` commands import (numpy, scipy, the command and job modules; not MPI's library, whose
UCX threads a fork does not carry, and not numba, whose thread pool ``--threads`` sizes at its
load) forks one child per command. The child is a new process as a user's would be: its own
pid, environment, working directory, arguments, stdin (/dev/null), stdout and stderr (files),
exit code, atexit handlers and MPI start; only the imports are inherited. A command costs a
fraction of a new interpreter's start (tests/helpers.py ``launch`` decides
when a command may start here; everything else still starts cold).

Protocol, over this process's stdin and stdout: one pickled request (argv, cwd, env, stdout
path, stderr path, timeout) per line of work, answered with one pickled ``(returncode,
timed_out)``. End of stdin ends the server.
"""

from __future__ import annotations

import os
import pickle
import runpy
import select
import signal
import struct
import sys

# What ``spdnn train|infer`` imports (0.6 s of a cold start), less mpi4py.MPI: loading MPI's
# library starts UCX's threads, which a fork does not carry (the child crashes at exit).
PRELOAD = ("spdnn.cli.thread_pools", "numpy", "scipy.sparse", "spdnn.cli.parser", "spdnn.api",
           "spdnn.cli.commands", "spdnn.model.network", "spdnn.model.reports",
           "spdnn.io.loaders", "spdnn.runtime.memory_report", "spdnn.runtime.memory_budget",
           "spdnn.runtime.checkpoint", "spdnn.runtime.session", "spdnn.runtime.training",
           "spdnn.jobs.train", "spdnn.jobs.infer", "spdnn.comm.interrupt", "spdnn.comm.watchdog")


class _WithoutMPI:
    """A finder that refuses ``mpi4py.MPI``: the modules that need it fail to import here and
    are imported again, whole, by the child."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):  # noqa: ANN001, ANN205
        if name == "mpi4py.MPI":
            raise ImportError("mpi4py.MPI is not loaded in the warm server")
        return None


def _preload() -> None:
    import importlib

    import mpi4py

    settings = dict(vars(mpi4py.rc))  # spdnn.comm changes them before it imports MPI
    sys.meta_path.insert(0, _WithoutMPI)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    sys.meta_path.remove(_WithoutMPI)
    vars(mpi4py.rc).update(settings)
    # A module whose package failed to import goes too (the child imports both again).
    ours = sorted(n for n in sys.modules if n.split(".")[0] in ("spdnn", "partition", "tests"))
    for name in ours:
        parent = name.rpartition(".")[0]
        if parent and parent not in sys.modules:
            del sys.modules[name]
    assert "mpi4py.MPI" not in sys.modules and "numba" not in sys.modules


def _read(stream) -> object | None:  # noqa: ANN001
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(size))


def _write(stream, value: object) -> None:  # noqa: ANN001
    data = pickle.dumps(value)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _become(request: dict) -> None:
    """In the child: take the request's process state, then run its command (its exit, or an
    uncaught exception, ends this process as it would a new interpreter). The server's
    channels, fds 0 and 1, are replaced."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stdin, kept open)
    os.environ.clear()
    os.environ.update(request["env"])
    from spdnn.comm.threads import pin_threads

    pin_threads()  # what spdnn.cli.thread_pools does at a cold start, in this environment
    os.chdir(request["cwd"] or os.getcwd())
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    raise SystemExit(0)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """The child's returncode (as subprocess gives it: -N for signal N), and whether it was
    killed for passing ``timeout``."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
        timed_out = not ready
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    return os.waitstatus_to_exitcode(status), timed_out


def serve() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the tests; they end this
    _preload()
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    # "stop" ends it, not only the end of the pipe: a process the tests' process forked (a
    # worker pool) holds the pipe's writing end open as long as it lives
    while (request := _read(requests)) not in (None, "stop"):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become(request)  # never returns
        _write(answers, _wait(pid, request["timeout"]))


if __name__ == "__main__":
    serve()
