"""Write files under a temporary name in the same directory and rename them into place."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import InputError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds."""
    final = Path(path)
    parent = final.parent if str(final.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(final, f"output directory {parent} does not exist")
    # A killed run leaves its temporary behind: the next write of the same file removes it
    # (two runs writing one file at once conflict anyway; the last rename would win).
    for stale in parent.glob(f".{glob.escape(final.name)}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=parent)
    os.close(fd)
    # mkstemp creates the file 0600; the result should have the mode any new file gets here.
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield Path(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
