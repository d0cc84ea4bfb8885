"""Forked helpers end with their parent (``die_with_parent``): a child that outlived a killed
parent would hold its pipes open, and whoever reads them (a test runner's controller) would
wait forever."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from spdnn.comm.processes import die_with_parent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_forked_child_ends_when_its_parent_is_killed():
    r, w = os.pipe()
    parent = os.fork()
    if parent == 0:  # the parent: forks the child, reports its pid, waits to be killed
        child = os.fork()
        if child == 0:
            die_with_parent()
            time.sleep(60)
            os._exit(0)
        os.write(w, str(child).encode())
        time.sleep(60)
        os._exit(0)
    child = int(os.read(r, 20))
    time.sleep(0.3)  # the child has made its call
    os.kill(parent, signal.SIGKILL)
    os.waitpid(parent, 0)
    deadline = time.monotonic() + 5
    state = "R"
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        if state in ("Z", "X", "gone"):
            break
        time.sleep(0.05)
    assert state in ("Z", "X", "gone"), f"the child is still running (state {state})"

