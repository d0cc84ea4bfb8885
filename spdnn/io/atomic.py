"""Write files under a temporary name in the same directory and rename them into place: the
data is flushed to the disk (``fsync``) before the rename, and the directory after it, so a
crash or power loss leaves either the old file or the whole new one. A symlink is written
through (its target is replaced, the link stays); a device or a pipe (``/dev/null``,
``/dev/stdout``) is written into directly: a rename would replace the device itself."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from spdnn.errors import InputError


def temporary(directory: str | os.PathLike, name: str) -> str:
    """A new empty file in ``directory`` named as every temporary of ``name`` is (``.NAME.*.tmp``:
    the next write of ``name`` sweeps one that a killed run left)."""
    fd, path = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    return path


def destination(path: str | os.PathLike) -> tuple[Path, bool]:
    """Where a write of ``path`` goes: the file itself, or a symlink's target; and whether
    that is a device, pipe or socket, written into directly (no temporary, no rename)."""
    import stat

    final = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    try:
        mode = os.stat(final).st_mode
    except OSError:
        return final, False
    return final, not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@dataclass
class _Together:
    finals: set[Path]  # the outputs' final paths
    pending: list[tuple[str, Path, Path]] = field(default_factory=list)  # (tmp, final, dir)
    failed: bool = False  # one of the outputs could not be written


_together: _Together | None = None


def _output_failed(final: Path) -> None:
    if _together is not None and final.absolute() in _together.finals:
        _together.failed = True


@contextlib.contextmanager
def outputs_together(paths: list[str | os.PathLike | None]) -> Iterator[None]:
    """The files of ``paths`` written inside the block take their names at its end, one after
    another: a job's outputs appear together, and when one of them cannot be written the
    others' temporaries are removed (a later output that fails leaves no earlier one behind,
    nor replaces a file of the same name). Another failure (the final checkpoint) still
    gives the outputs written by then their names. Other files are written as usual."""
    global _together
    outer = _together
    together = _together = _Together({destination(p)[0].absolute() for p in paths if p})
    try:
        yield
    except BaseException:
        if together.failed:
            for tmp, _, _ in together.pending:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        else:
            _rename(together.pending)
        raise
    finally:
        _together = outer
    _rename(together.pending)


def _rename(pending: list[tuple[str, Path, Path]]) -> None:
    for tmp, final, parent in pending:
        try:
            os.replace(tmp, final)
        except OSError as exc:
            raise InputError(final, f"cannot write the file ({exc.strerror or exc})") from None
        fsync_directory(parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str = "the file") -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (a symlink's target); rename it into place only
    if the block succeeds; a device or pipe is yielded itself. An OS error in the block or
    the rename becomes one ``InputError``: "cannot write WHAT"."""
    final, direct = destination(path)
    if direct:
        try:
            yield final
        except OSError as exc:
            _output_failed(final)
            raise InputError(path, f"cannot write {what} ({exc.strerror or exc})") from None
        return
    parent = final.parent if str(final.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(final, f"output directory {parent} does not exist")
    # A killed run leaves its temporary behind: the next write of the same file removes it
    # (two runs writing one file at once conflict anyway; the last rename would win).
    for stale in parent.glob(f".{glob.escape(final.name)}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
    tmp = None
    try:
        tmp = temporary(parent, final.name)
        # mkstemp creates the file 0600; the result should have the mode any new file gets.
        os.chmod(tmp, 0o666 & ~_umask())
        yield Path(tmp)
        fsync_file(tmp)
        if _together is not None and final.absolute() in _together.finals:
            _together.pending.append((tmp, final, parent))  # renamed with the others
            return
        os.replace(tmp, final)
        fsync_directory(parent)
    except BaseException as exc:
        _output_failed(final)
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, InputError):
            # A full disk, a file-size limit (Python ignores SIGXFSZ: the write fails with
            # EFBIG), a read-only mount: one line naming the file, not numpy's zip traceback.
            raise InputError(final, f"cannot write {what} ({exc.strerror or exc})") from None
        raise


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file's data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: str | os.PathLike) -> None:
    """Make a rename or a new name in ``path`` durable (where the file system allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory: the rename stands anyway
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str, what: str = "the file") -> None:
    with atomic_path(path, what) as tmp:
        tmp.write_text(text)
