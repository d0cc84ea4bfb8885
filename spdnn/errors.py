"""User-facing errors: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


def say_error(prog: str, message: object) -> None:
    """The one error line every command prints: ``PROG: error: MESSAGE`` on stderr."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()


class SpdnnError(Exception):
    """An error caused by the user's input or environment, reported as one line."""

    exit_code = 2


class InputError(SpdnnError):
    """A problem with an input file, naming the file and, where there is one, the line."""

    def __init__(self, path: str | os.PathLike, problem: str, line: int | None = None) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


_BY_FLAG: list[bool] = [False]


@contextlib.contextmanager
def options_named_by_flag() -> Iterator[None]:
    """While a command runs, an ``OptionError`` reads ``--the-flag ...`` (its field's flag)
    wherever it is raised and however it is passed on (an agreed error carries its text)."""
    before, _BY_FLAG[0] = _BY_FLAG[0], True
    try:
        yield
    finally:
        _BY_FLAG[0] = before


class OptionError(SpdnnError, ValueError):
    """A bad option value, named by its field in an option record (or its argument). Each check
    is written once, on the record; the command line names the option by its flag instead
    (``as_flag``, or ``options_named_by_flag``). A ``ValueError`` too, as Python's own bad
    arguments are."""

    def __init__(self, name: str, problem: str) -> None:
        self.name, self.problem = name, problem
        super().__init__(f"{name} {problem}")

    def __str__(self) -> str:
        if _BY_FLAG[0]:
            return f"--{self.name.replace('_', '-')} {self.problem}"
        return f"{self.name} {self.problem}"

    def as_flag(self, flags: dict[str, str] | None = None) -> SpdnnError:
        """The same error naming ``--the-flag`` (or ``flags[name]``) instead of the field."""
        flag = (flags or {}).get(self.name, "--" + self.name.replace("_", "-"))
        return SpdnnError(f"{flag} {self.problem}")


def check_type(name: str, value: object, types: type | tuple[type, ...], expected: str) -> None:
    """A library argument of the wrong kind is a ``TypeError`` naming it and what it takes, at
    the call (not an AttributeError from deep inside)."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {expected}, not {type(value).__name__}")
