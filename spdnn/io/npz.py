"""Pickle-free ``.npz`` access shared by every file format of spdnn (networks, plans,
checkpoints, data sets, dense weights).

An ``.npz`` is a zip of ``.npy`` members. ``NpzReader`` reads a member's header before its data
and refuses one that claims more elements than the member holds, so no allocation is sized by a
file's own claims alone; ``ranges`` reads parts of a 1-D member without reading the rest (members
written by ``np.savez`` are stored uncompressed, so the parts are read in place). Every failure
becomes an ``InputError`` naming the file and the member.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from typing import Any

import numpy as np
from numpy.lib import format as npy

from spdnn.errors import InputError
from spdnn.io.paths import check_input_file
from spdnn.kernels.ranges import concat_ranges

# Failures of the zip and npy layers that mean "this file is damaged", not "spdnn is broken".
# zipfile's NotImplementedError (a compression it lacks) and RuntimeError (an encrypted member)
# are translated where a member is opened (``_zip_open``) and nowhere else: elsewhere they, like
# SyntaxError, are bugs and must not look like bad input.
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError,
                struct.error)
# Elements read per block by ``ranges`` (bounds its temporaries to about 16 MB: the raw span,
# its int64 index and the picked values).
RANGE_BLOCK = 1 << 20
_LOCAL_HEADER = struct.Struct("<4s22xHH")


# A member is read in pieces of this size (each read allocates its own bytes in zipfile).
_READ_CHUNK = 1 << 20

_BRING = ("convert it with `spdnn convert safetensors FILE --activations relu,... -o "
          "net.npz` (docs/recipes.md)")


def _is_safetensors(path: str) -> bool:
    """An 8-byte little-endian header length, then a JSON object."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and \
        int.from_bytes(head[:8], "little") < os.path.getsize(path)


class NpzReader:
    """Lazy access to one ``.npz`` file; ``kind`` names it in errors ("network", "plan"...)."""

    def __init__(self, path: str | os.PathLike, kind: str) -> None:
        self.path = check_input_file(path, f"{kind} .npz file")
        self.kind = kind
        try:
            self._zip = zipfile.ZipFile(self.path)
            members = self._zip.namelist()
        except _READ_ERRORS as exc:
            if kind == "network" and _is_safetensors(self.path):
                raise InputError(self.path, f"a safetensors file, not a network bundle: "
                                            f"{_BRING}") from None
            raise InputError(self.path, f"not a readable {kind} .npz file ({exc})") from None
        self._identity = self._stat()
        self._members = {m[:-4]: m for m in members if m.endswith(".npy")}
        if not self._members:
            if kind == "network" and any(m.endswith("data.pkl") for m in members):
                raise InputError(self.path, "a torch.save file (pickled, which spdnn does not "
                                            "load), not a network bundle: give the model to "
                                            "spdnn.from_torch, or save its state_dict with "
                                            "safetensors.torch.save_file and " + _BRING)
            raise InputError(self.path, f"not a {kind} .npz file (no .npy members)")
        self.keys = set(self._members)

    def _member(self, key: str) -> zipfile.ZipInfo:
        if key not in self._members:
            raise InputError(self.path, f"missing key '{key}'")
        return self._zip.getinfo(self._members[key])

    def stored(self, key: str) -> bool:
        """Whether a member is stored uncompressed (``span`` then reads only the span)."""
        return self._member(key).compress_type == zipfile.ZIP_STORED

    def _fail(self, key: str, problem: str) -> InputError:
        return InputError(self.path, f"key '{key}' {problem}")

    def _zip_open(self, key: str, info: zipfile.ZipInfo) -> Any:  # noqa: ANN401
        try:
            return self._zip.open(info)
        except NotImplementedError as exc:  # a compression method zipfile cannot read
            raise self._fail(key, f"uses a zip feature that cannot be read ({exc})") from None
        except RuntimeError:
            if info.flag_bits & 0x1:  # zipfile asks for the password of an encrypted member
                raise self._fail(key, "is encrypted") from None
            raise
        except _READ_ERRORS as exc:
            raise self._fail(key, f"is corrupt ({exc})") from None

    def _open(self, key: str) -> tuple[Any, tuple[int, ...], np.dtype]:
        """The member opened just after its header, with the validated shape and dtype."""
        info = self._member(key)
        fh = self._zip_open(key, info)
        try:
            version = npy.read_magic(fh)
            read = npy.read_array_header_1_0 if version == (1, 0) else \
                npy.read_array_header_2_0
            shape, fortran, dtype = read(fh, max_header_size=10_000)
        except _READ_ERRORS as exc:
            raise self._fail(key, f"is corrupt ({exc})") from None
        if dtype.hasobject:
            fh.close()
            raise self._fail(key, "holds Python objects (only plain arrays are read)")
        if fortran and len(shape) > 1:
            fh.close()
            raise self._fail(key, "is in Fortran order (only C order is read)")
        claimed = dtype.itemsize
        for n in shape:
            claimed *= int(n)
        if claimed > info.file_size:
            fh.close()
            raise self._fail(key, f"claims {shape} of {dtype} ({claimed:,} bytes) but the "
                                  f"member holds {info.file_size:,} bytes")
        return fh, tuple(int(n) for n in shape), dtype

    def check_headers(self) -> None:
        """Read every member's header (not its data): a file whose members cannot be read, or
        claim more than they hold, is refused before anything is loaded from it."""
        for key in sorted(self.keys):
            self.header(key)

    def header(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype of a member, from its header alone."""
        fh, shape, dtype = self._open(key)
        fh.close()
        return shape, dtype

    def get(self, key: str) -> np.ndarray:
        fh, shape, dtype = self._open(key)
        count = int(np.prod(shape, dtype=np.int64))
        out = np.empty(count, dtype=dtype)
        into = memoryview(out.view(np.uint8))  # read in place: no second copy of the member
        got = 0
        try:
            with fh:
                while got < len(into):  # zipfile reads through bytes of the size asked
                    n = fh.readinto(into[got:got + _READ_CHUNK])
                    if not n:
                        break
                    got += n
        except _READ_ERRORS as exc:
            raise self._fail(key, f"is corrupt ({exc})") from None
        if got != count * dtype.itemsize:
            raise self._fail(key, "is truncated")
        return out.reshape(shape)

    def _vector(self, key: str) -> tuple[int, np.dtype]:
        """Length and type of a 1-D member, from its header."""
        fh, shape, dtype = self._open(key)
        fh.close()
        if len(shape) != 1:
            raise self._fail(key, f"must be 1-D, has shape {shape}")
        return shape[0], dtype

    def span(self, key: str, start: int, count: int) -> np.ndarray:
        """Elements [start, start + count) of a 1-D member: a stored member is read in place
        into one array (no index array, no second copy); a compressed one is read whole."""
        length, dtype = self._vector(key)
        shape = (length,)
        if start < 0 or count < 0 or start + count > shape[0]:
            raise self._fail(key, f"is shorter ({shape[0]:,}) than the span read from it")
        info = self._member(key)
        if info.compress_type != zipfile.ZIP_STORED:
            return self.get(key)[start:start + count].copy()
        try:
            with open(self.path, "rb") as f:
                f.seek(self._data_offset(key, info) + start * dtype.itemsize)
                out = np.fromfile(f, dtype=dtype, count=count)
        except OSError as exc:
            raise self._fail(key, f"could not be read ({exc})") from None
        if len(out) != count:
            raise self._fail(key, "is truncated")
        return out

    def row_block(self, key: str, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of a 2-D member (C order), read in place: the rest of the member is
        not read (a compressed member is read whole)."""
        fh, shape, dtype = self._open(key)
        fh.close()
        if len(shape) != 2:
            raise self._fail(key, f"must be 2-D, has shape {shape}")
        if not 0 <= r0 <= r1 <= shape[0]:
            raise self._fail(key, f"has {shape[0]:,} rows, not rows {r0:,}-{r1:,}")
        info = self._member(key)
        if info.compress_type != zipfile.ZIP_STORED:
            return self.get(key)[r0:r1].copy()
        count = (r1 - r0) * shape[1]
        try:
            with open(self.path, "rb") as f:
                f.seek(self._data_offset(key, info) + r0 * shape[1] * dtype.itemsize)
                out = np.fromfile(f, dtype=dtype, count=count)
        except OSError as exc:
            raise self._fail(key, f"could not be read ({exc})") from None
        if len(out) != count:
            raise self._fail(key, "is truncated")
        return out.reshape(r1 - r0, shape[1])

    def ranges(self, key: str, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Elements [start, start + count) of a 1-D member, concatenated (ranges ascending and
        disjoint, as a layer's rows are).

        A stored member is read in place, in groups of ranges that span at most RANGE_BLOCK
        elements of the file (a longer range is a group of its own): the temporaries are
        bounded by the group, not by the share. A compressed one is read whole."""
        starts = np.asarray(starts, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        length, dtype = self._vector(key)
        ends = starts + counts
        total = int(counts.sum())
        if len(starts) and total and (starts.min() < 0 or ends.max() > length):
            raise self._fail(key, f"is shorter ({length:,}) than the ranges read from it")
        info = self._member(key)
        if info.compress_type != zipfile.ZIP_STORED:
            return self.get(key)[concat_ranges(starts, counts)]
        out = np.empty(total, dtype=dtype)
        offset = self._data_offset(key, info)
        try:
            with open(self.path, "rb") as f:
                g0, done = 0, 0
                while g0 < len(starts):
                    g1 = max(g0 + 1, int(np.searchsorted(ends, starts[g0] + RANGE_BLOCK,
                                                         side="right")))
                    lo, hi = int(starts[g0]), int(ends[g1 - 1])
                    f.seek(offset + lo * dtype.itemsize)
                    raw = f.read((hi - lo) * dtype.itemsize)
                    if len(raw) != (hi - lo) * dtype.itemsize:
                        raise self._fail(key, "is truncated")
                    picked = np.frombuffer(raw, dtype=dtype)[
                        concat_ranges(starts[g0:g1] - lo, counts[g0:g1])]
                    out[done:done + len(picked)] = picked
                    done += len(picked)
                    g0 = g1
        except OSError as exc:
            raise self._fail(key, f"could not be read ({exc})") from None
        return out

    def _data_offset(self, key: str, info: zipfile.ZipInfo) -> int:
        """Offset in the file of a stored member's array data (after the .npy header)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(info.header_offset)
                sig, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(30))
            with self._zip_open(key, info) as fh:
                version = npy.read_magic(fh)
                (npy.read_array_header_1_0 if version == (1, 0) else
                 npy.read_array_header_2_0)(fh, max_header_size=10_000)
                header_len = fh.tell()
        except _READ_ERRORS as exc:
            raise self._fail(key, f"is corrupt ({exc})") from None
        if sig != b"PK\x03\x04":
            raise self._fail(key, "has a corrupt zip entry header")
        return info.header_offset + 30 + name_len + extra_len + header_len

    def text(self, key: str) -> str:
        value = self.get(key)
        if value.shape != () or value.dtype.kind != "U":
            raise self._fail(key, "must be a string")
        return str(value)

    def integer(self, key: str) -> int:
        value = self.get(key)
        if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
            raise self._fail(key, "must be one integer")
        return int(value.reshape(-1)[0])

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        """The open file's and the path's (inode, size, mtime): a file rewritten in place, cut
        short or replaced under the path changes one of them."""
        seen = []
        for st in (os.fstat(self._zip.fp.fileno()), os.stat(self.path)):
            seen.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(seen)

    def check_unchanged(self) -> None:
        """Refuse a file that changed since it was opened (read again later in a job: the
        blocks of a streamed inference)."""
        try:
            now = self._stat()
        except (OSError, AttributeError, ValueError):
            now = ()
        if now != self._identity:
            raise InputError(self.path, f"the {self.kind} file changed, moved or shrank during "
                                        "the run (it is read again block by block)")

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> NpzReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
