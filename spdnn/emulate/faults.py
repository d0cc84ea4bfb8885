"""Link faults mid-run (``spdnn emulate --stall-after / --stall-when / --slow-to``): the last
node's link freezes (no byte passes, in either direction) or slows to a rate, after some
seconds or once a file appears (a checkpoint: an event of the job, not a guess of the clock)."""

from __future__ import annotations

import glob
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spdnn.emulate import links

POLL_SECONDS = 0.05  # how often --stall-when looks for its file


@dataclass(frozen=True, kw_only=True)
class LinkFault:
    """What happens to the last node's link, and when: ``after`` seconds, or once a file
    matching the glob ``when`` exists (whichever comes first when both are given). The link
    freezes, or with ``rate_bps`` slows to that rate."""

    after: float | None = None
    when: str | None = None
    rate_bps: int | None = None

    def describe(self, node: int, rate_bps: int) -> str:
        moment = " or ".join([*([f"after {self.after:g} s"] if self.after is not None else []),
                              *([f"once {self.when} exists"] if self.when else [])])
        what = "freezes (no byte passes)" if self.rate_bps is None else \
            f"drops from {links.format_rate(rate_bps)} to {links.format_rate(self.rate_bps)}"
        return f"node{node}'s link {what} {moment}"

    def due(self, started: float) -> bool:
        if self.after is not None and time.monotonic() - started >= self.after:
            return True
        return bool(self.when) and bool(glob.glob(self.when))


class FaultTimer:
    """Applies a ``LinkFault`` to node ``node`` of ``network`` from a daemon thread once it is
    due, then calls ``applied`` with the seconds since the start; ``cancel`` stops it (the job
    ended first)."""

    def __init__(self, fault: LinkFault, network: links.Network, node: int,
                 applied: Callable[[float], None] | None = None) -> None:
        self.fault, self.network, self.node, self.on_applied = fault, network, node, applied
        self.stop = threading.Event()
        self.applied = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="link-fault")

    def start(self) -> FaultTimer:
        self.thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self.fault.due(started):
            if self.stop.wait(POLL_SECONDS):
                return
        if self.fault.rate_bps is None:
            self.network.freeze(self.node)
        else:
            self.network.slow(self.node, self.fault.rate_bps)
        self.applied = True
        if self.on_applied is not None:
            self.on_applied(time.monotonic() - started)

    def cancel(self) -> None:
        self.stop.set()
        self.thread.join(5)
