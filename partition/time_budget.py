"""The partitioner's time budget (``--time-limit``) and its progress estimates."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

Log = Callable[[str], None]


class OutOfTime(Exception):
    """The time limit passed before a piece of work finished; its message says where."""


class Deadline:
    """An absolute deadline on the monotonic clock (the same clock in every worker process),
    or none."""

    def __init__(self, seconds: float | None = None) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        """Seconds remaining (0 once passed), None without a limit."""
        return None if self.end is None else max(0.0, self.end - time.monotonic())

    def passed(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def check(self, where: str) -> None:
        if self.passed():
            raise OutOfTime(where)


NO_DEADLINE = Deadline()


def process_seconds() -> float:
    """Seconds since this process started (Linux; 0 where that is not known)."""
    try:
        start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            return max(0.0, float(f.read().split()[0]) - start / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Progress lines with an estimate of the time left, from the share of work done
    (``work`` units, e.g. pins, in total): at most one line every ``every`` seconds."""

    def __init__(self, what: str, work: float, log: Log | None, every: float = 5.0) -> None:
        self.what, self.work, self.log, self.every = what, max(work, 1.0), log, every
        self.t0 = time.monotonic()
        self.last = self.t0
        self.done = 0.0

    def eta(self) -> float | None:
        """Seconds still needed at the pace so far (None before any work is done)."""
        if self.done <= 0:
            return None
        return (time.monotonic() - self.t0) * max(self.work - self.done, 0.0) / self.done

    def advance(self, units: float, detail: str) -> None:
        self.done += units
        now = time.monotonic()
        finished = self.done >= self.work
        if self.log is None or (not finished and now - self.last < self.every):
            return
        self.last = now
        spent = now - self.t0
        eta = "" if finished or self.done <= 0 else \
            f", about {duration(spent * (self.work - self.done) / self.done)} left"
        self.log(f"{self.what}: {detail} ({duration(spent)}{eta})")
