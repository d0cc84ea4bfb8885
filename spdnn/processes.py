"""Whether a process still runs: for locks and namespaces named after the process that made
them (a checkpoint directory's lock, an emulated network), left behind when it was killed."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent() -> None:
    """In a forked child: end when the parent process ends, however it ends (Linux
    ``PR_SET_PDEATHSIG``; elsewhere nothing). A child that outlived a killed parent would keep
    its pipes open, and whoever waits on the parent's pipes would wait forever."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent ended before the call took effect
        os._exit(1)
