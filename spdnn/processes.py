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
