"""Standard output that may fail (a pipe closed early, a closed descriptor, /dev/full) must not
end a job that still has files to write: after its first failed write, what a command prints
goes nowhere, the job goes on, and the command ends as a Unix tool does: quietly for a closed
pipe, with one line for another error."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class _Guarded:
    """A text stream that forwards to ``stream`` until a write or flush fails, then drops
    everything (and points descriptor 1 at /dev/null, so the interpreter's own flush at exit
    does not fail either)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.failure: OSError | None = None

    def _failed(self, exc: OSError) -> None:
        if self.failure is None:
            self.failure = exc
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, self._stream.fileno())
                os.close(null)

    def write(self, text: str) -> int:
        if self.failure is None:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as exc:  # ValueError: a closed stream
                self._failed(exc if isinstance(exc, OSError) else OSError(errno.EBADF, str(exc)))
        return len(text)

    def flush(self) -> None:
        if self.failure is None:
            try:
                self._stream.flush()
            except (OSError, ValueError) as exc:
                self._failed(exc if isinstance(exc, OSError) else OSError(errno.EBADF, str(exc)))

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 (isatty, fileno, encoding...)
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout(prog: str) -> Iterator[list[int]]:
    """Run a command with standard output guarded; the yielded list receives the exit code
    override: 0 after a closed pipe, 2 (with one line on stderr) after another failure."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (no descriptor 1 at all)
    guard = _Guarded(sys.stdout)
    before, sys.stdout = sys.stdout, guard  # type: ignore[assignment]
    code: list[int] = []
    try:
        yield code
    finally:
        guard.flush()
        sys.stdout = before
        failure = guard.failure
        if failure is not None:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (what is left goes nowhere)
            if failure.errno == errno.EPIPE:
                code.append(0)
            else:
                from spdnn.errors import say_error

                say_error(prog, f"standard output: {failure.strerror or failure} (what was "
                                "printed is lost; the command's files were written)")
                code.append(2)
