"""Progress reporting: a redrawn bar on stderr when stderr is a terminal; otherwise (stderr
redirected, or under mpirun) a line on stdout every ``SPDNN_PROGRESS_SECONDS`` (default 10)
with the rate and an ETA, so that long work is never silent and short work adds nothing."""

from __future__ import annotations

import os
import sys
import time


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("SPDNN_PROGRESS_SECONDS", "10")))
    except ValueError:
        return 10.0


class Progress:
    """``Progress("read", total)``; call ``update(done)``; ``close()`` ends the line."""

    def __init__(self, label: str, total: int, enabled: bool = True,
                 log_lines: bool = True, unit: str = "", per_item: int = 1) -> None:
        self.label, self.total = label, max(total, 1)
        self.tty = sys.stderr.isatty()
        # In a log (not a terminal) a bar is noise unless asked for as sparse lines.
        self.enabled = enabled and (self.tty or log_lines)
        self.t0 = time.perf_counter()
        self.start = 0  # items already done when timing began (a resumed epoch)
        self.done = 0
        self.unit, self.per_item = unit, per_item  # e.g. "samples", batch size per step
        self.interval = _interval()
        self._last_line = self.t0

    def update(self, done: int, extra: str = "") -> None:
        if not self.enabled:
            return
        frac = done / self.total
        if self.tty:
            bar = "#" * int(30 * frac)
            print(f"\r{self.label} [{bar:<30}] {done}/{self.total} {extra}", end="",
                  file=sys.stderr, flush=True)
        elif done > self.start and time.perf_counter() - self._last_line >= self.interval:
            # In a log: a line every interval, not one per item.
            now = time.perf_counter()
            self._last_line = now
            elapsed = now - self.t0
            rate = (done - self.start) / max(elapsed, 1e-9)
            speed = f", {rate * self.per_item:,.0f} {self.unit}/s" if self.unit else ""
            eta = f", ETA {(self.total - done) / max(rate, 1e-9):.0f} s" \
                if done < self.total else ""
            print(f"{self.label}: {done}/{self.total} ({elapsed:.0f} s{speed}{eta}) "
                  f"{extra}".rstrip(), flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)
