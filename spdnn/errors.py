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
# Each option's flag where it is not --the-name (``--no-shuffle``): spdnn.schema.declare.
_FLAGS: dict[str, str] = {}


def register_flags(flags: dict[str, str]) -> None:
    """The flags of declared options, by name (spdnn.schema)."""
    _FLAGS.update(flags)


@contextlib.contextmanager
def options_named_by_flag() -> Iterator[None]:
    """While a command runs, an ``OptionError`` reads ``--the-flag ...`` (its field's flag)
    wherever it is raised and however it is passed on (an agreed error carries its text)."""
    before, _BY_FLAG[0] = _BY_FLAG[0], True
    try:
        yield
    finally:
        _BY_FLAG[0] = before


def option_name(name: str, by_flag: bool | None = None) -> str:
    """An option as its caller knows it: ``--lr`` on the command line, its keyword ``lr`` in
    Python."""
    if by_flag if by_flag is not None else _BY_FLAG[0]:
        return _FLAGS.get(name) or "--" + name.replace("_", "-")
    return name


class OptionError(SpdnnError, ValueError):
    """A bad option value, named by its keyword in an option record; the command line names
    it by its flag instead (``as_flag``, or ``options_named_by_flag``). ``problem`` may name
    other options as ``{name}`` when it lists them in ``refers``: each is named the same way.
    A ``ValueError`` too, as Python's own bad arguments are."""

    def __init__(self, name: str, problem: str, refers: tuple[str, ...] = ()) -> None:
        self.name, self.problem, self.refers = name, problem, refers
        super().__init__(self._text(False))

    def _text(self, by_flag: bool) -> str:
        problem = self.problem
        for other in self.refers:
            problem = problem.replace("{" + other + "}", option_name(other, by_flag))
        return f"{option_name(self.name, by_flag)} {problem}"

    def __str__(self) -> str:
        return self._text(_BY_FLAG[0])

    def renamed(self, names: dict[str, str]) -> OptionError:
        """The same error naming each option in ``names`` (keyword -> an API's own parameter,
        such as an estimator's) by that name instead."""
        problem = self.problem
        for other in self.refers:
            if other in names:
                problem = problem.replace("{" + other + "}", names[other])
        return OptionError(names.get(self.name, self.name), problem,
                           tuple(o for o in self.refers if o not in names))

    def as_flag(self, flags: dict[str, str] | None = None) -> SpdnnError:
        """The same error naming ``--the-flag`` (or ``flags[name]``) instead of the field."""
        if flags and self.name in flags:
            return SpdnnError(f"{flags[self.name]} {self._text(True).split(' ', 1)[1]}")
        return SpdnnError(self._text(True))


def check_type(name: str, value: object, types: type | tuple[type, ...], expected: str) -> None:
    """A library argument of the wrong kind is a ``TypeError`` naming it and what it takes, at
    the call (not an AttributeError from deep inside)."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {expected}, not {type(value).__name__}")
