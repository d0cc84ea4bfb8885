"""Write files under a temporary name in the same directory and rename them into place."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from spdnn.errors import InputError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str = "the file") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds.
    An OS error in the block or the rename becomes one ``InputError``: "cannot write WHAT"."""
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
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, InputError):
            # A full disk, a file-size limit (Python ignores SIGXFSZ: the write fails with
            # EFBIG), a read-only mount: one line naming the file, not numpy's zip traceback.
            raise InputError(final, f"cannot write {what} ({exc.strerror or exc})") from None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str, what: str = "the file") -> None:
    with atomic_path(path, what) as tmp:
        tmp.write_text(text)
