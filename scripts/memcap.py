"""Run a command under a hard memory cap of its own: a new Linux memory cgroup (v1 or v2) with
the given limit, this process moved into it, then the command exec'd in its place. As root.

Under mpirun every rank gets its own cgroup, so the cap is per rank, as Slurm's
``--mem-per-cpu`` gives one rank per CPU:

    mpirun -n 4 python scripts/memcap.py 600M -- spdnn train --network net.npz ...

spdnn reads the cap as its default ``--memory-limit`` (spdnn.comm.memlimit.cgroup_limit). A
process that passes the cap is killed by the kernel's OOM killer. ``--clean`` removes the
empty cgroups left by earlier runs (a cgroup can only be removed once its processes ended).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from spdnn.comm.memlimit import parse_bytes  # noqa: E402

ROOT = Path("/sys/fs/cgroup")
GROUP = "spdnn-memcap"


def base() -> tuple[Path, str]:
    """The directory under which caps are made, and the limit file's name."""
    if (ROOT / "memory").is_dir():  # v1: the memory controller's own hierarchy
        return ROOT / "memory" / GROUP, "memory.limit_in_bytes"
    return ROOT / GROUP, "memory.max"  # v2 (unified)


def clean() -> int:
    parent, _ = base()
    removed = 0
    for d in parent.glob("*") if parent.is_dir() else []:
        try:
            d.rmdir()
            removed += 1
        except OSError:
            pass
    return removed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: mpirun -n 4 python scripts/memcap.py 600M -- "
                                        "spdnn train --network net.npz --plan plan4.npz ...")
    ap.add_argument("limit", nargs="?", help="bytes, with K, M or G (e.g. 600M)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    ap.add_argument("--clean", action="store_true", help="remove empty caps of earlier runs")
    args = ap.parse_args()
    if args.clean:
        print(f"removed {clean()} empty cgroup(s)")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.limit is None or not command:
        ap.error("give a limit and a command: memcap.py 600M -- spdnn train ...")
    try:
        limit = parse_bytes(args.limit)
    except Exception as exc:  # noqa: BLE001 (one line, whatever the cause)
        ap.error(str(exc))
    parent, name = base()
    group = parent / str(os.getpid())
    try:
        parent.mkdir(exist_ok=True)
        if name == "memory.max":  # v2: the parent must hand the controller down
            (parent / "cgroup.subtree_control").write_text("+memory")
        group.mkdir()
        (group / name).write_text(str(limit))
        if name == "memory.limit_in_bytes":  # v1: no swap beyond the cap either
            swap = group / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(limit))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        print(f"memcap: {group}: cannot make a memory cgroup ({exc.strerror}; needs root and a "
              "writable cgroup memory controller)", file=sys.stderr)
        return 2
    # MPICH 5's MPI_Init fails or hangs, most of the time, when the ranks of one node sit in
    # different cgroups ("Message truncated" in MPIDI_UCX_comm_set_vcis, or an invalid
    # parameter in the UCX address exchange): its shared-memory set-up does not survive it.
    # Ranks that treat each other as on other nodes (messages through UCX, as between nodes)
    # start every time. Open MPI ignores the variable.
    os.environ.setdefault("MPIR_CVAR_NOLOCAL", "1")
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
