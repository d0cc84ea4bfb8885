"""The watchdog alone (no MPI): a wait longer than the timeout ends the job with one line
naming the rank, the peers and the wait; a shorter one, or none, does nothing."""

from __future__ import annotations

import threading
import time

import pytest

from spdnn.comm.watchdog import TIMEOUT_EXIT, Watchdog
from spdnn.errors import SpdnnError
from spdnn.model.options import RunOptions, check_run_options
from tests.helpers import launch


def _watchdog(rank: int = 0):
    ended = threading.Event()
    codes: list[int] = []

    def abort(code: int) -> None:
        codes.append(code)
        ended.set()

    return Watchdog(rank, abort), ended, codes


def test_a_wait_past_the_timeout_ends_the_job_with_one_line(capsys):
    dog, ended, codes = _watchdog()
    released = []
    dog.before_abort.append(lambda: released.append(True))
    dog.set(0.2)
    dog.arm("the forward exchange of layer 2", [1])
    assert ended.wait(5)
    assert codes == [TIMEOUT_EXIT] and released == [True]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "rank 0" in lines[0] and "rank 1 in the forward exchange of layer 2" in lines[0]
    assert "--comm-timeout" in lines[0]


def test_waits_shorter_than_the_timeout_and_computing_are_left_alone(capsys):
    dog, ended, codes = _watchdog()
    dog.set(0.5)
    for _ in range(10):  # 10 short waits, 1 s in all: each under the limit
        dog.arm("a barrier", [1, 2])
        time.sleep(0.1)
        dog.disarm()
    time.sleep(0.8)  # computing (not waiting) longer than the limit
    assert not ended.is_set() and codes == []
    dog.set(None)  # the thread ends
    time.sleep(0.2)
    assert capsys.readouterr().err == ""


def test_a_wait_that_ends_during_the_grace_is_not_a_stall(capsys):
    """A rank other than 0 waits one more timeout before it ends the job; if the wait it timed
    finishes meanwhile (the peer was slow, not stalled), nothing happens."""
    dog, ended, codes = _watchdog(rank=2)
    dog.set(0.1)
    dog.arm("the fold of layer 3", [0])
    time.sleep(0.6)  # past the timeout: the thread is in its grace sleep (2 s)
    dog.disarm()  # the wait completed
    assert not ended.wait(3.0) and codes == []
    dog.arm("the expand of layer 1", [0])  # a new wait, restarted meanwhile, is timed anew
    time.sleep(0.05)
    dog.disarm()
    assert not ended.wait(2.5) and codes == []
    dog.set(None)
    assert capsys.readouterr().err == ""


def test_other_ranks_give_rank_0_the_first_word(capsys):
    dog, ended, codes = _watchdog(rank=3)
    dog.set(0.1)
    start = time.monotonic()
    dog.arm("the gradient sum of layer 1 over the replicas", [0, 1, 2])
    assert ended.wait(10)
    assert time.monotonic() - start >= 2.0  # rank 0's watchdog would have ended the job first
    assert "rank 3" in capsys.readouterr().err


@pytest.mark.parametrize("value", [-1, 0.0, float("nan"), float("inf"), True, "5"])
def test_a_bad_comm_timeout_in_run_options_is_refused(value):
    with pytest.raises(SpdnnError, match="comm_timeout must be a finite number > 0"):
        check_run_options(RunOptions(comm_timeout=value))


def test_a_bad_comm_timeout_on_the_command_line_is_one_line(tmp_path):
    proc = launch(0, "train", "--network", tmp_path / "net.npz", "--comm-timeout", "-3")
    assert proc.returncode == 2 and "--comm-timeout" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_the_start_guard_ends_a_process_whose_start_lasts_too_long_and_only_that():
    """``guard_start``: a process that has not dismissed the guard within the timeout plus the
    grace is ended with one line (MPI's start-up holds the interpreter, so a sentinel process
    does it); a dismissed guard leaves the process alone."""
    import subprocess
    import sys

    stuck = ("from spdnn.comm.watchdog import guard_start\n"
             "guard_start(0.5, rank=3)\n"
             "import time; time.sleep(30)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", stuck], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9 and time.monotonic() - start < 20
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "spdnn: error: rank 3 (" in proc.stderr
    assert "waited 2.5 s for MPI to start (--comm-timeout)" in proc.stderr
    started = ("from spdnn.comm.watchdog import guard_start\n"
               "dismiss = guard_start(0.5)\n"
               "dismiss()\n"
               "import time; time.sleep(3.5); print('ran on')\n")
    proc = subprocess.run([sys.executable, "-c", started], capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ran on\n", "")
