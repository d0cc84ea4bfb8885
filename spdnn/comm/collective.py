"""How a job of many ranks ends when one of them fails: the policy that no rank is ever left
waiting in a collective for a peer that will not come (the MPI calls are spdnn.comm's).

- ``run_collectively``: runs an entry point on every rank; an error every rank agreed on is
  printed once, anything else on one rank aborts the job.
- ``guarded``: the same for one collective step inside a running job (the library's entry
  points).
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from spdnn.comm.interrupt import interrupted
from spdnn.comm.mpi import AgreedError, Communicator, MPIComm, world
from spdnn.errors import SpdnnError, say_error


def run_collectively(fn: Callable[[Communicator], int], comm: MPIComm | None = None,
                     prog: str = "spdnn", timeout: float | None = None, *,
                     finalize: bool = False) -> int:
    """Run an entry point on every rank (``comm``: default COMM_WORLD).

    A SpdnnError that every rank agreed on (Communicator.check/agree) is printed once, by
    rank 0, and every rank returns 2; one raised on a single rank is printed by that rank and
    aborts the job with code 2. Any other exception prints its traceback and aborts the whole
    job, so no rank is left waiting in a collective. ``timeout``: ``--comm-timeout`` from the
    first wait on (the duplication of ``comm``). ``finalize``: end MPI before returning, under
    the same watch (a command's process, which then exits).
    """
    c = Communicator(world() if comm is None else comm, timeout=timeout)
    try:
        code = fn(c)
    except AgreedError as exc:
        if c.rank == 0:
            say_error(prog, exc)
        code = exc.exit_code
    except SpdnnError as exc:  # raised on this rank alone: the others must not wait
        say_error(prog, exc)
        if c.size > 1:
            _abort(c, exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        if c.size > 1:
            interrupted(prog, c.rank)  # one line from rank 0, exit 130
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    except BaseException:
        traceback.print_exc()
        sys.stderr.write(f"{prog}: rank {c.rank} failed; aborting all {c.size} ranks\n")
        sys.stderr.flush()
        if c.size > 1:
            _abort(c, 1)
        return 1
    if finalize:
        c.finalize()
    return code


def guarded(c: Communicator, fn: Callable[[], Any]) -> Any:  # noqa: ANN401
    """Run a collective body: an error every rank agreed on (``check``/``agree``) is raised
    on every rank; any other exception on one rank, which the others cannot know of, prints
    its cause and aborts the job (with one rank it is simply raised)."""
    try:
        return fn()
    except AgreedError:
        raise
    except BaseException as exc:
        if c.size == 1:
            raise
        if isinstance(exc, KeyboardInterrupt) or _during_interrupt(exc):
            interrupted("spdnn", c.rank)  # one line from rank 0, exit 130
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt from None
        if isinstance(exc, SystemExit):
            # A rank leaving in the middle of a collective step would leave the others
            # waiting: the job ends, with the exit code it asked for.
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            sys.stderr.write(f"spdnn: rank {c.rank} exited (code {code}) in a "
                             f"collective step; ending all {c.size} ranks\n")
        elif isinstance(exc, SpdnnError):
            say_error("spdnn", exc)
            code = exc.exit_code
        else:
            traceback.print_exc()
            sys.stderr.write(f"spdnn: rank {c.rank} failed; aborting all {c.size} ranks\n")
            code = 1
        _abort(c, code)
        raise


def _during_interrupt(exc: BaseException) -> bool:
    """``exc`` was raised while a Ctrl-C unwound (zipfile's close, say, refuses to close the
    archive an interrupted write left open): the job was interrupted, not broken."""
    seen = exc.__context__
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False


def _abort(c: Communicator, code: int) -> None:
    # Give the launcher a moment to forward this rank's last stderr lines: an immediate
    # Abort sometimes kills the job before they reach the terminal.
    time.sleep(0.5)
    c.abort(code)
