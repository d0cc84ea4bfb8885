"""The tests' warm launcher (tests/warm.py) gives what a new interpreter gives: exit code,
stdout, stderr, working directory, arguments, environment, a traceback on an uncaught error,
atexit handlers, MPI started by the command, and a timeout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spdnn.io.bundle import save_network
from tests import warm_client
from tests.helpers import ROOT, _environment, small_network

pytestmark = pytest.mark.skipif(os.environ.get("SPDNN_COLD") == "1",
                                reason="SPDNN_COLD=1: the warm launcher is switched off")

SCRIPT = """
import atexit, os, sys
atexit.register(lambda: print("atexit ran"))
here = os.path.dirname(os.path.abspath(__file__))
print(os.getcwd(), sys.argv[1:], os.environ.get("SPDNN_WARM_PROBE"), sys.path[0] == here)
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("boom")
if sys.argv[1] == "sleep":
    import time; time.sleep(30)
if sys.argv[1] == "mpi":
    from spdnn.comm.mpi import Communicator
    with Communicator() as c:
        print("ranks", c.size)
sys.exit(int(sys.argv[2]))
"""


def both(command: list[str], cwd, env: dict | None = None, timeout: float = 60):  # noqa: ANN001, ANN201
    environment = _environment(env, timeout)
    assert warm_client.suitable(command[1:], environment)
    warm = warm_client.run(command, cwd, environment, timeout)
    cold = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=timeout)
    return warm, cold


@pytest.mark.parametrize("args", [["plain", "3"], ["raise", "0"], ["mpi", "0"]])
def test_a_warm_script_is_a_new_process(tmp_path, args):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    warm, cold = both([sys.executable, str(script), *args], tmp_path,
                      {"SPDNN_WARM_PROBE": "seen"})
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout)
    assert f"{tmp_path} {args!r} seen True" in warm.stdout and "atexit ran" in warm.stdout
    if args[0] == "raise":
        assert warm.returncode == 1
        assert "ValueError: boom" in warm.stderr.splitlines()[-1]
    else:
        assert warm.stderr == cold.stderr == "to stderr\n"
    if args[0] == "mpi":
        assert "ranks 1" in warm.stdout


def test_a_warm_command_fails_as_a_cold_one(tmp_path):
    save_network(small_network(), tmp_path / "net.npz")
    (tmp_path / "cut.npz").write_bytes((tmp_path / "net.npz").read_bytes()[:100])
    for args in (["train", "--network", "cut.npz", "--data", "digits"],
                 ["infer", "--network", "net.npz", "--inputs", "digits", "--replicas", "3"]):
        warm, cold = both([sys.executable, "-m", "spdnn", *args], tmp_path)
        assert warm.returncode == cold.returncode == 2
        assert warm.stderr == cold.stderr and warm.stdout == cold.stdout


def test_a_warm_command_times_out(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    with pytest.raises(subprocess.TimeoutExpired):
        warm_client.run([sys.executable, str(script), "sleep", "0"], tmp_path,
                        _environment(None, 60), timeout=1)


def test_what_is_read_at_import_time_starts_cold():
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert warm_client.suitable(["-m", "spdnn"], environment)
    assert not warm_client.suitable(["-c", "print()"], environment)
    assert not warm_client.suitable(["-W", "error", "-m", "spdnn"], environment)
    for name in ("NUMBA_NUM_THREADS", "SPDNN_THREADS", "OMP_NUM_THREADS"):
        assert not warm_client.suitable(["-m", "spdnn"], {**environment, name: "7"})


def test_an_interrupted_wait_ends_the_server_and_the_next_command_gets_a_new_one(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    environment = _environment(None, 60)
    warm_client.run([sys.executable, str(script), "plain", "0"], tmp_path, environment, 60)
    first = warm_client._server["proc"]

    def interrupt(signum, frame):  # noqa: ANN001, ANN202
        raise KeyboardInterrupt

    import signal

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            warm_client.run([sys.executable, str(script), "sleep", "0"], tmp_path,
                            environment, 60)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert first.poll() is not None  # the server (and its sleeping child) ended
    proc = warm_client.run([sys.executable, str(script), "plain", "4"], tmp_path, environment,
                           60)
    assert proc.returncode == 4 and warm_client._server["proc"] is not first
