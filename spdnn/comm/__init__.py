"""The ranks of a job: how they talk and how they live.

- ``mpi``: every MPI call of spdnn (``Communicator``, ``AgreedError``, ``world``); compute code
  never calls MPI directly, so message passing is auditable in one place, as in Heat.
- ``collective``: the policy that no rank is left waiting for a peer that failed.
- ``watchdog``: ``--comm-timeout`` on every wait; ``interrupt``: Ctrl-C at any moment.
- ``object_buffers``: Python objects as byte buffers for the object collectives.
- ``processes``: liveness, ending with the parent, starting helper processes safely.
- ``threads``: one thread per rank unless asked; ``memlimit``: the memory a rank may use.

Importing this package starts nothing: MPI starts when ``spdnn.comm.mpi`` is first imported
(``Communicator`` and the other names below are loaded from it on first use).
"""

from __future__ import annotations

from typing import Any

_FROM_MPI = ("AgreedError", "Communicator", "MPIComm", "Request", "world", "world_size",
             "abort_world")
__all__ = list(_FROM_MPI)


def __getattr__(name: str) -> Any:  # noqa: ANN401 (PEP 562: MPI loads on first use)
    if name in _FROM_MPI:
        from spdnn.comm import mpi

        return getattr(mpi, name)
    raise AttributeError(f"module 'spdnn.comm' has no attribute {name!r}")
