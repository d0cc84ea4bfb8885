"""Paths checked before any work starts: inputs are regular files (a read is bounded by the
size the file holds: a device or a pipe never ends), and outputs can be written (a run must not
compute for an hour and then fail to write its result)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from spdnn.errors import InputError


def check_input_file(path: str | os.PathLike, what: str = "file") -> str:
    """``path`` names a regular file (through symlinks); its name. An InputError otherwise:
    missing, a directory, or a device, pipe or socket (``/dev/zero`` would be read forever)."""
    import stat

    name = os.fspath(path)
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        raise InputError(name, "no such file") from None
    except OSError as exc:
        raise InputError(name, f"cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise InputError(name, f"is a directory, not a {what}")
    if not stat.S_ISREG(mode):
        raise InputError(name, f"is not a regular file (a device, pipe or socket): spdnn "
                               f"reads a {what} of known size")
    return name


def check_output_file(path: str | os.PathLike, option: str) -> None:
    """An output file's directory must exist and be writable; the path itself must not be a
    directory. A symlink is checked as its target; a device or pipe is written directly."""
    from spdnn.io.atomic import destination

    p, direct = destination(path)
    if direct:
        if not os.access(p, os.W_OK):
            raise InputError(path, f"{option} is not writable")
        return
    if p.is_dir():
        raise InputError(p, f"{option} names a directory, not a file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(p, f"{option}: output directory {parent} does not exist")
    _probe(parent, p, f"{option}: output directory {parent}")


def check_output_dir(path: str | os.PathLike, option: str) -> None:
    """An output directory may exist (as a writable directory) or be creatable."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(p, f"{option}: exists and is not a directory")
    parent = p if p.exists() else (p.parent if str(p.parent) else Path("."))
    if not parent.is_dir():
        raise InputError(p, f"{option}: {parent} does not exist")
    _probe(parent, p, f"{option}: {parent}")


def _probe(directory: Path, path: Path, what: str) -> None:
    """Create and remove a file in ``directory``: permission bits alone pass /proc, a
    read-only mount seen by root, or a full quota (the write itself would fail after the run).
    Named as spdnn.io.atomic names its temporaries, so a probe a kill leaves is swept."""
    from spdnn.io.atomic import temporary

    try:
        probe = temporary(directory, path.name)
    except OSError as exc:
        raise InputError(path, f"{what} is not writable ({exc.strerror or exc})") from None
    with contextlib.suppress(FileNotFoundError):  # a writer's sweep of stale temporaries
        os.unlink(probe)


def _same(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(files: Iterable[tuple[str, str | None]],
                  dirs: Iterable[tuple[str, str | None]] = (),
                  inputs: Iterable[tuple[str, str | None]] = ()) -> None:
    """Check (option, path) pairs of output files and directories that were given: each
    writable, no two naming one file, none naming one of the ``inputs`` (it would be
    overwritten before, or while, it is read)."""
    files, dirs = list(files), list(dirs)
    given = [(o, os.fspath(p)) for o, p in files + dirs if p]
    from spdnn.io.atomic import destination

    for i, (option, path) in enumerate(given):
        for other, earlier in given[:i]:
            if _same(path, earlier) and not destination(path)[1]:  # /dev/null twice is fine
                raise InputError(path, f"{other} and {option} name the same file")
        for source, read in inputs:
            if read and isinstance(read, (str, os.PathLike)) and _same(path, os.fspath(read)):
                raise InputError(path, f"{option} names the input ({source}): it would be "
                                       "overwritten")
    for option, path in files:
        if path:
            check_output_file(path, option)
    for option, path in dirs:
        if path:
            check_output_dir(path, option)
