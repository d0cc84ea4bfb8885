"""An emulated cluster's network: one network namespace per node, a switch, shaped links.

Node i is the namespace ``spdnn<pid>n<i>`` with one interface ``eth0`` at 127.77.0.<i+1>
(addresses in the loopback range, routed only inside these private namespaces); a namespace
``spdnn<pid>sw`` holds a bridge, the switch. Each node's link is shaped in both directions by a
token bucket (``tc tbf``) to the set rate: the node's egress on ``eth0`` and its ingress on the
switch port. This kernel has no ``netem``, so latency is what TCP and the stack add.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from spdnn.comm.processes import pid_alive
from spdnn.errors import SpdnnError

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_NAME = re.compile(r"^spdnn(\d+)(n\d+|sw)$")
MTU = 1500  # Ethernet's, so that a packet never exceeds the token bucket


class EmulationError(SpdnnError):
    """The emulated network could not be built or used here."""


def parse_rate(text: str, *, least: float = 1e5) -> int:
    """A link rate in bits per second from ``100mbit``, ``1gbit``, ``10gbit`` or ``2.5e9``;
    at least ``least`` (100 kbit/s for a link; ``--slow-to`` allows a trickle of 1 kbit/s)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(?:bit|bps|b/s)?\s*", text.lower())
    if m is None:
        raise ValueError(f"not a link rate: {text!r} (e.g. 100mbit, 1gbit, 10gbit)")
    bps = float(m.group(1)) * _UNITS[m.group(2)]
    if not least <= bps <= 1e12:
        raise ValueError(f"link rate {text!r} outside {format_rate(least)}..1 Tbit/s")
    return int(bps)


def format_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def burst_bytes(bps: int) -> int:
    """The token bucket: 100 us of traffic, at least 2 KiB (one packet). A message leaves its
    first bucketful at the stack's speed and the rest at the rate, so the bucket is as small as
    the shaper allows: below ~100 us it cannot keep the rate (a 1 MiB ping-pong reached a
    fraction of it through a bucket of a few KiB), above it short messages beat the rate (a
    bucket as large as the message lets it through at the stack's speed)."""
    return max(2048, bps // 80_000)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise EmulationError(f"`{args[0]}` not found: the emulation needs iproute2 "
                             "(apt-get install iproute2)") from None
    if check and proc.returncode != 0:
        raise EmulationError(f"`{' '.join(args)}` failed: "
                             f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc


def namespaces() -> list[str]:
    """The emulation namespaces that exist now (any run's)."""
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()
            and _NAME.match(line.split()[0])]


def remove_leftovers() -> list[str]:
    """Delete namespaces of runs whose process is gone (killed before it could clean up)."""
    gone = [ns for ns in namespaces() if not pid_alive(int(_NAME.match(ns).group(1)))]
    for ns in gone:
        delete(ns)
    return gone


def delete(ns: str) -> None:
    """Kill every process left in namespace ``ns``, then delete it. A rank or launcher proxy
    of a node outlives the job when the launcher dies first (killed, or cut off by a frozen
    link), and deleting the namespace alone would leave it running, unseen, maybe spinning in
    its MPI progress loop (one was found spinning long after its test)."""
    import signal

    for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    _run("ip", "netns", "del", ns, check=False)


@dataclass(frozen=True, kw_only=True)
class Network:
    """The namespaces and links of one emulated cluster (``build`` makes it, ``remove`` ends
    it)."""

    nodes: int
    rate_bps: int
    prefix: str

    def node(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    def address(self, i: int) -> str:
        return f"127.77.0.{i + 1}"

    def hostname(self, i: int) -> str:
        return f"node{i}"

    def shape(self, bps: int) -> None:
        """Set every link to ``bps`` in both directions (``tc ... replace``)."""
        for i in range(self.nodes):
            self._shape_node(i, bps)

    def _shape_node(self, i: int, bps: int) -> None:
        self._qdisc(i, "tbf", "rate", f"{bps}bit", "burst", str(burst_bytes(bps)), "latency",
                    "100ms")

    def _qdisc(self, i: int, *qdisc: str) -> None:
        """The root queue of node i's link, both directions: its egress and the switch port's
        (the node's ingress)."""
        _run("ip", "netns", "exec", self.node(i), "tc", "qdisc", "replace", "dev", "eth0",
             "root", *qdisc)
        _run("ip", "netns", "exec", self.switch, "tc", "qdisc", "replace", "dev", f"p{i}",
             "root", *qdisc)

    def freeze(self, i: int) -> None:
        """No byte passes node i's link, either way, from now on (the ``blackhole`` queue
        drops every packet): a peer whose network froze. The interface stays up, so no error
        tells the peers: TCP retransmits into the void, as across a dead switch."""
        self._qdisc(i, "blackhole")

    def slow(self, i: int, bps: int) -> None:
        """Node i's link from now on at ``bps`` (a congested or degraded link)."""
        self._shape_node(i, bps)

    def remove(self) -> None:
        for ns in [self.node(i) for i in range(self.nodes)] + [self.switch]:
            delete(ns)


def check_permitted() -> None:
    """Raise EmulationError (one line) where network namespaces cannot be made."""
    for tool in ("ip", "tc", "unshare"):
        if not any(os.access(os.path.join(d, tool), os.X_OK)
                   for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin",
                                                                          "/sbin"]):
            raise EmulationError(f"`{tool}` not found: the emulation needs iproute2 and "
                                 "util-linux")
    if os.geteuid() != 0:
        raise EmulationError("network namespaces are not permitted here: the emulation must "
                             "run as root (it creates namespaces, links and shapers)")


def build(nodes: int, rate_bps: int) -> Network:
    """Create the namespaces, links and shapers of an emulated cluster of ``nodes``."""
    check_permitted()
    remove_leftovers()
    net = Network(nodes=nodes, rate_bps=rate_bps, prefix=f"spdnn{os.getpid()}")
    try:
        _run("ip", "netns", "add", net.switch)
        _run("ip", "-n", net.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", net.switch, "link", "set", "br0", "up")
        for i in range(nodes):
            ns = net.node(i)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", "eth0", "netns", ns, "mtu", str(MTU), "type", "veth",
                 "peer", "name", f"p{i}", "netns", net.switch, "mtu", str(MTU))
            _run("ip", "-n", net.switch, "link", "set", f"p{i}", "master", "br0")
            _run("ip", "-n", net.switch, "link", "set", f"p{i}", "up")
            # 127.x on an interface is dropped as a martian unless route_localnet; the node's
            # own loopback keeps only 127.0.0.1, so 127.77.0.x is not taken as local.
            _run("ip", "netns", "exec", ns, "sysctl", "-qw",
                 "net.ipv4.conf.all.route_localnet=1", "net.ipv4.conf.eth0.route_localnet=1")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "del", "127.0.0.1/8", "dev", "lo", check=False)
            _run("ip", "-n", ns, "addr", "add", "127.0.0.1/32", "dev", "lo")
            _run("ip", "-n", ns, "addr", "add", f"{net.address(i)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
        net.shape(rate_bps)
    except BaseException:
        net.remove()
        raise
    return net
