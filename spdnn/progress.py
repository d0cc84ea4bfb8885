"""Progress reporting on stderr: a redrawn bar on a terminal, sparse lines in a log."""

from __future__ import annotations

import sys
import time


class Progress:
    """``Progress("read", total)``; call ``update(done)``; ``close()`` ends the line."""

    def __init__(self, label: str, total: int, enabled: bool = True,
                 log_lines: bool = True) -> None:
        self.label, self.total = label, max(total, 1)
        self.tty = sys.stderr.isatty()
        # In a log (not a terminal) a bar is noise unless asked for as sparse lines.
        self.enabled = enabled and (self.tty or log_lines)
        self.t0 = time.perf_counter()
        self._last_tenth = -1

    def update(self, done: int, extra: str = "") -> None:
        if not self.enabled:
            return
        frac = done / self.total
        if self.tty:
            bar = "#" * int(30 * frac)
            print(f"\r{self.label} [{bar:<30}] {done}/{self.total} {extra}", end="",
                  file=sys.stderr, flush=True)
        elif int(frac * 10) > self._last_tenth:
            # In a log: one line per tenth, not one per item.
            self._last_tenth = int(frac * 10)
            elapsed = time.perf_counter() - self.t0
            print(f"{self.label}: {done}/{self.total} ({elapsed:.1f} s) {extra}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)
