"""spdnn.comm.interrupt: Ctrl-C ends a process with one line while MPI starts (spdnn.comm calls
MPI_Init without the GIL; under mpi4py's call, which holds it, a 2-rank job hung once at 100%
CPU), and even when its main thread holds the GIL inside C for good (a compiled loop that
keeps the GIL stands in for such a call)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.helpers import ROOT, start

SPIN = """
import numba, sys, time
from spdnn.comm.interrupt import starting_mpi, watch

@numba.njit  # compiled code that keeps the GIL and does not return for minutes
def spin(n):
    s = 0.0
    for i in range(n):
        s += (i % 7) * 1e-9
    return s

spin(10)
watch("spdnn")
"""
WHILE_MPI_STARTS = SPIN + """
with starting_mpi():
    print("ready", flush=True)
    spin(10**12)
"""
AFTER_THE_LINE = SPIN + """
print("ready", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    time.sleep(0.3)  # the watcher prints its line and waits its grace period
    spin(10**12)     # then the main thread holds the GIL in C for good
"""


def _interrupt(script: str) -> tuple[int, str, float]:
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        return proc.returncode, err, time.monotonic() - start
    finally:
        proc.kill()


def test_ctrl_c_while_mpi_starts_ends_the_rank_by_the_signal():
    code, err, took = _interrupt(WHILE_MPI_STARTS)
    assert code == -signal.SIGINT and took < 10, (code, took, err)
    assert "Traceback" not in err, err


def test_ctrl_c_ends_the_process_when_the_main_thread_then_holds_the_gil():
    """The watcher printed the line, then cannot run again: faulthandler's C watchdog ends the
    process a second after the grace period (exit code 1), instead of never."""
    code, err, took = _interrupt(AFTER_THE_LINE)
    assert code == 1 and took < 15, (code, took, err)
    assert [ln for ln in err.splitlines() if ln.strip()] == ["spdnn: interrupted"], err


# Rank 1 starts MPI late: rank 0 waits for it inside MPI_Init when the launcher forwards Ctrl-C.
RANK_1_LATE = """
import os, time
from spdnn.comm.interrupt import interrupted, launcher_rank, watch
watch("spdnn")
try:
    if launcher_rank() == 1:
        time.sleep(60)
    else:
        print("ready", flush=True)
    import spdnn.comm.mpi
    print("MPI started", flush=True)
except KeyboardInterrupt:
    interrupted()
"""


def test_ctrl_c_while_mpi_starts_ends_the_job_with_one_line():
    job = start(2, "-c", RANK_1_LATE, module=None, timeout=60)
    try:
        assert job.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # rank 0 is inside MPI_Init, waiting for rank 1
        t0 = time.monotonic()
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=30)
    finally:
        job.kill()
    assert job.returncode == 130 and time.monotonic() - t0 < 10, (job.returncode, err)
    assert [ln for ln in err.splitlines() if ln.strip()] == ["spdnn: interrupted"], err
    assert "MPI started" not in out


def test_an_interrupt_in_a_finaliser_prints_nothing_of_its_own():
    """Python reports an exception raised in ``__del__`` as "Exception ignored" with its
    traceback; after ``watch`` a KeyboardInterrupt there prints nothing (the watcher ends the
    process with the one line), while other errors there are still reported."""
    code = ("from spdnn.comm.interrupt import watch\n"
            "watch()\n"
            "class Interrupted:\n"
            "    def __del__(self):\n"
            "        raise KeyboardInterrupt\n"
            "class Broken:\n"
            "    def __del__(self):\n"
            "        raise ValueError('still reported')\n"
            "Interrupted()\n"
            "Broken()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert "still reported" in proc.stderr, proc.stderr


def test_an_error_raised_while_ctrl_c_unwinds_is_an_interrupt():
    """zipfile's close refuses the archive an interrupted np.savez left open (a ValueError
    whose context is the KeyboardInterrupt): the job ends as interrupted (one line, 130), not
    with a traceback."""
    code = """
from types import SimpleNamespace
from spdnn.comm.collective import guarded

def body():
    try:
        raise KeyboardInterrupt
    finally:
        raise ValueError("Can't close the ZIP file while there is an open writing handle")

guarded(SimpleNamespace(size=2, rank=0), body)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "interrupted" in proc.stderr + proc.stdout
