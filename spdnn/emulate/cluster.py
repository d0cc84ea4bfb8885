"""An emulated cluster on this machine: build it, measure its link, run MPI jobs on it, and
always take it down again (on exit, on error, on Ctrl-C or SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from spdnn.emulate import launch, links
from spdnn.emulate.faults import FaultTimer, LinkFault
from spdnn.emulate.links import EmulationError


@dataclass(frozen=True, kw_only=True)
class LinkMeasurement:
    """A ping-pong between node 0 and node 1 over the emulated link."""

    bandwidth: float  # bytes/s for 1 MiB messages, one way
    latency: float  # seconds one way for 8-byte messages

    def describe(self, rate_bps: int) -> str:
        return (f"measured node0 <-> node1: {self.bandwidth / 1e6:.1f} MB/s for 1 MiB "
                f"messages ({self.bandwidth * 8 / rate_bps:.0%} of the link), "
                f"{self.latency * 1e6:.0f} us one way for 8 bytes")


class Cluster:
    """``with Cluster(nodes=2, rate_bps=100_000_000) as c: c.run(["python", "x.py"])``."""

    def __init__(self, *, nodes: int, rate_bps: int, mpiexec: str | None = None) -> None:
        if nodes < 2:
            raise EmulationError("an emulated cluster needs at least 2 nodes")
        if nodes > 250:
            raise EmulationError("at most 250 emulated nodes")
        self.nodes = nodes
        self.rate_bps = rate_bps
        self.launcher = launch.find_launcher(mpiexec)
        self._net: links.Network | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Cluster:
        self._tmp = tempfile.TemporaryDirectory(prefix="spdnn-emulate-")
        try:
            self._net = links.build(self.nodes, self.rate_bps)
            self._ssh = launch.write_ssh(self._net, Path(self._tmp.name))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._net is not None:
            self._net.remove()
            self._net = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def network(self) -> links.Network:
        if self._net is None:
            raise EmulationError("the emulated cluster is not up (use it in a with block)")
        return self._net

    def describe(self, ranks: int) -> str:
        per = launch.ranks_per_node(ranks, self.nodes)
        family = {"mpich": "MPICH over OFI/TCP", "openmpi": "Open MPI over the TCP BTL"}
        return (f"{self.nodes} nodes (node0..node{self.nodes - 1}), {ranks} ranks "
                f"({'/'.join(map(str, per))} per node), links "
                f"{links.format_rate(self.rate_bps)} per node and direction (tbf, burst "
                f"{links.burst_bytes(self.rate_bps) // 1024} KiB, MTU {links.MTU}), "
                f"{family[self.launcher.family]}")

    def command(self, argv: list[str], ranks: int | None = None) -> list[str]:
        per = launch.ranks_per_node(ranks or self.nodes, self.nodes)
        return launch.command(self.launcher, self.network, self._ssh, per, argv)

    def environment(self) -> dict[str, str]:
        return {**os.environ, **launch.environment(self.launcher)}

    def run(self, argv: list[str], *, ranks: int | None = None, fault: LinkFault | None = None,
            fault_applied: Callable[[float], None] | None = None, capture: bool = False,
            timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``ranks`` ranks (default: one per node); consecutive ranks share a
        node. ``fault``: what happens to the last node's link mid-run, and when
        (``fault_applied`` is called with the seconds from the start when it happens)."""
        if ranks is not None and ranks < 1:
            raise EmulationError("-n must be at least 1")
        pipe = subprocess.PIPE if capture else None
        proc, timer = None, None
        try:
            with interrupts_as_ctrl_c():  # from the start: a Ctrl-C as the job starts stops it
                proc = subprocess.Popen(self.command(argv, ranks), env=self.environment(),
                                        text=True, stdout=pipe, stderr=pipe,
                                        start_new_session=True)
                timer = None if fault is None else \
                    FaultTimer(fault, self.network, self.nodes - 1, fault_applied).start()
                out, err = proc.communicate(timeout=timeout)
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as exc:
            if proc is not None:
                _stop(proc)
            if isinstance(exc, subprocess.TimeoutExpired):
                raise EmulationError(f"the job did not finish within {timeout:g} s; "
                                     "stopped") from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if proc is not None:
                _kill_group(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    @property
    def python(self) -> str:
        """The Python beside the launcher (its mpi4py matches that MPI), else this one."""
        beside = Path(self.launcher.path).parent / "python"
        return str(beside) if beside.exists() else sys.executable

    def measure(self) -> LinkMeasurement:
        """Ping-pong between node 0 and node 1 (one rank each)."""
        res = self.run([self.python, "-m", "spdnn.emulate.probe"], ranks=2, capture=True,
                       timeout=120)
        lines = [ln for ln in (res.stdout or "").splitlines() if ln.startswith("{")]
        if res.returncode != 0 or not lines:
            tail = (res.stderr or res.stdout or "").strip().splitlines()[-1:]
            raise EmulationError(f"measuring the link failed (exit {res.returncode}): {tail}")
        return LinkMeasurement(**json.loads(lines[-1]))


@contextlib.contextmanager
def interrupts_as_ctrl_c() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, so that clean-up runs as on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _ctrl_c) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C to the job's process group, then SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Launcher daemons left behind in the namespaces would keep them alive."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
