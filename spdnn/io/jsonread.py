"""The one reader of spdnn's JSON files (their structures: ``spdnn.io.jsonfiles``): a file is
decoded and validated as its structure, or refused with one ``InputError`` naming the file and
the field (``m.json: runtime.step_s: expected a number >= 0, got -1``)."""

from __future__ import annotations

import json
import os
import re
from typing import Any, TypeVar

import msgspec
from msgspec import Struct

from spdnn.errors import InputError
from spdnn.io.paths import check_input_file

MAX_BYTES = 16 * 2**20

S = TypeVar("S")
_WHERE = re.compile(r"\s+- at (?:key in )?`\$\.?(.*)`$")


def decode(raw: bytes | str, path: str | os.PathLike, what: str = "",
           unique_keys: bool = False) -> Any:  # noqa: ANN401
    """JSON text as Python values, every JSON that spdnn reads (files, the JSON inside
    bundles, plans and safetensors headers) alike: invalid or too deeply nested text is one
    ``InputError`` naming ``path`` (and ``what`` of it), never a RecursionError.
    ``unique_keys``: an object naming a key twice is refused too (JSON readers keep the
    last, silently)."""
    where = f"{what} is " if what else ""
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, f"{where}not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError(path, f"{where}JSON nested too deeply to read") from None
    if unique_keys:
        try:
            json.loads(raw, object_pairs_hook=_unique)
        except _Duplicate as exc:
            raise InputError(path, f"{where}JSON naming {exc.args[0]!r} twice in one object"
                             ) from None
        except RecursionError:
            raise InputError(path, f"{where}JSON nested too deeply to read") from None
    return value


class _Duplicate(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def read(path: str | os.PathLike, kind: type[S]) -> S:
    """Decode and validate the JSON file at ``path`` as ``kind``; any problem is one
    ``InputError`` naming the file and the field."""
    name = check_input_file(path, f"{_format_of(kind) or kind.__name__} file")
    try:
        with open(name, "rb") as fh:
            if os.fstat(fh.fileno()).st_size > MAX_BYTES:
                raise InputError(name, f"larger than {MAX_BYTES // 2**20} MiB: not a "
                                       f"{_format_of(kind) or kind.__name__} file")
            raw = fh.read()
    except FileNotFoundError:
        raise InputError(name, "no such file") from None
    except IsADirectoryError:
        raise InputError(name, "is a directory") from None
    except OSError as exc:
        raise InputError(name, f"cannot read ({exc.strerror or exc})") from None
    head = decode(raw, name)
    expected = _format_of(kind)
    found = head.get("format") if isinstance(head, dict) else None
    if expected and found not in _formats_of(kind):
        if found == "spdnn-calibration/1":
            raise InputError(name, "an older calibration (spdnn-calibration/1, no reuse axis in "
                                   "its kernel tables): run spdnn calibrate again")
        noun = "manifest" if expected.startswith("spdnn-checkpoint/") else "file"
        raise InputError(name, f"not a {expected} {noun} (its 'format' field must be "
                               f"{expected!r})")
    try:
        return msgspec.convert(head, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise InputError(name, _message(str(exc))) from None


def _message(text: str) -> str:
    """msgspec's ``Expected `float` >= 0, got `-1` - at `$.runtime.step_s``` as
    ``runtime.step_s: expected a number >= 0, got -1``."""
    m = _WHERE.search(text)
    where = m.group(1) if m else ""
    problem = _WHERE.sub("", text)
    problem = problem.replace("`float`", "a number").replace("`int`", "an integer")
    problem = problem.replace("`", "")
    problem = problem[:1].lower() + problem[1:]
    if problem.startswith("object contains unknown field"):
        return f"unknown field '{'.'.join(filter(None, (where, problem.split()[-1])))}'"
    if problem.startswith("object missing required field"):
        return f"missing field '{'.'.join(filter(None, (where, problem.split()[-1])))}'"
    return f"field '{where}': {problem}" if where else problem


def _formats_of(kind: type) -> tuple[str, ...]:
    """The ``format`` values a structure accepts (its Literal's), oldest first."""
    ann = next((str(k.__annotations__["format"]) for k in getattr(kind, "__mro__", (kind,))
                if "format" in getattr(k, "__annotations__", {})), "")
    m = re.search(r"Literal\[([^\]]+)\]", ann)
    return tuple(re.findall(r"['\"]([^'\"]+)['\"]", m.group(1))) if m else ()


def _format_of(kind: type) -> str | None:
    """The newest ``format`` a structure accepts (the one spdnn writes)."""
    formats = _formats_of(kind)
    return formats[-1] if formats else None



def as_dict(record: Struct) -> dict[str, Any]:
    """A decoded structure's fields, without the optional ones that were absent (None)."""
    return {k: v for k, v in msgspec.structs.asdict(record).items() if v is not None}
