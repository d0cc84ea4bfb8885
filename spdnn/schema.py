"""Options declared once.

An option record (``TrainOptions``, ``RunOptions``, an optimizer's config) declares each field
with ``option(...)``: its default, its check, its help, its flag and whether a checkpoint
records it. From the declarations come the command line's flags (``add_flags``), a record's
checks (``check``), the checkpoint manifest's run settings and the resume comparison
(``recorded``) and the option tables of the docs (``table``).

A check is one ``Check``: called on a value it returns the value as kept or raises
``ValueError`` with the problem ("must be ..."); ``parse`` reads the command line's text. The
error a caller sees names the option in the caller's terms: ``--lr`` on the command line,
the keyword ``lr`` in Python (``spdnn.errors.OptionError``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from spdnn.errors import OptionError, option_name, register_flags

_KEY = "spdnn_option"
Recorded = Literal["same", "free"] | None


class Check:
    """What a value may be. ``what`` reads after "must be"; ``none``: None is allowed (the
    option left unset)."""

    what = "a value"

    def __init__(self, *, none: bool = False) -> None:
        self.none = none

    def __call__(self, value: Any) -> Any:  # noqa: ANN401
        if value is None and self.none:
            return None
        kept = self.keep(value)
        if kept is _BAD:
            raise ValueError(f"must be {self.what}, not {value!r}")
        return kept

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        """The value as kept, or ``_BAD``."""
        return value

    def parse(self, text: str) -> Any:  # noqa: ANN401
        """The command line's text as a value (checked by the caller)."""
        return text

    def cli(self, text: str) -> Any:  # noqa: ANN401
        """argparse's ``type``: parsed and checked; a bad one is argparse's one-line error."""
        try:
            value = self.parse(text)
        except ValueError as exc:
            own = isinstance(self, Custom) and self._parse is not None and str(exc)
            raise argparse.ArgumentTypeError(own or f"must be {self.what}, not {text}") from None
        try:
            return self(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace(repr(value), text)) from None


class _Bad:
    pass


_BAD: Any = _Bad()


def _real(value: Any) -> bool:  # noqa: ANN401
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Integer(Check):
    """An integer >= ``least`` (below 2**63)."""

    def __init__(self, least: int = 0, *, none: bool = False) -> None:
        super().__init__(none=none)
        self.least = least
        self.what = "a positive integer" if least == 1 else f"an integer >= {least}"

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        ok = isinstance(value, int) and not isinstance(value, bool) \
            and self.least <= value < 2**63
        return value if ok else _BAD

    def parse(self, text: str) -> int:
        return int(text)


class Number(Check):
    """A finite number in [low, high] (``open``: the ends excluded, "low", "high" or
    "both")."""

    def __init__(self, low: float = 0.0, high: float = math.inf, *,
                 open: str = "", none: bool = False, what: str | None = None) -> None:  # noqa: A002
        super().__init__(none=none)
        self.low, self.high, self.open = low, high, open
        if what is not None:
            self.what = what
        elif high == math.inf:
            self.what = f"a finite number {'>' if 'low' in open or 'both' in open else '>='} " \
                        f"{low:g}"
        else:
            lo = "(" if open in ("low", "both") else "["
            hi = ")" if open in ("high", "both") else "]"
            self.what = f"a number in {lo}{low:g}, {high:g}{hi}"

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        if not _real(value) or not math.isfinite(value):
            return _BAD
        low_ok = value > self.low if self.open in ("low", "both") else value >= self.low
        high_ok = value < self.high if self.open in ("high", "both") else value <= self.high
        return value if low_ok and high_ok else _BAD

    def parse(self, text: str) -> float:
        return float(text)


class Choice(Check):
    """One of ``choices`` (strings)."""

    def __init__(self, *choices: str, none: bool = False) -> None:
        super().__init__(none=none)
        self.choices = choices
        self.what = "one of " + ", ".join(choices)

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        return value if isinstance(value, str) and value in self.choices else _BAD


class Boolean(Check):
    what = "True or False"

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        return value if isinstance(value, bool) else _BAD


class Numbers(Check):
    """``count`` numbers each as ``each`` (a tuple; the command line's ``A,B``)."""

    def __init__(self, each: Number, count: int, what: str, *, none: bool = False) -> None:
        super().__init__(none=none)
        self.each, self.count, self.what = each, count, what

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        if not isinstance(value, (tuple, list)) or len(value) != self.count \
                or any(self.each.keep(v) is _BAD for v in value):
            return _BAD
        return tuple(float(v) for v in value)

    def parse(self, text: str) -> tuple[float, ...]:
        return tuple(float(v) for v in text.split(","))


class Text(Check):
    """Any string (its form is checked where it is read)."""

    what = "a string"

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        return value if isinstance(value, str) else _BAD


class Custom(Check):
    """A check written as a function: ``fn(value)`` returns the value as kept or raises
    ValueError with the problem; ``parse`` reads the command line's text."""

    def __init__(self, fn: Callable[[Any], Any], what: str,
                 parse: Callable[[str], Any] | None = None, *, none: bool = False) -> None:
        super().__init__(none=none)
        self.fn, self.what, self._parse = fn, what, parse

    def keep(self, value: Any) -> Any:  # noqa: ANN401
        return self.fn(value)

    def parse(self, text: str) -> Any:  # noqa: ANN401
        return text if self._parse is None else self._parse(text)


class Anything(Check):
    """No check here (a path, an object: checked where it is opened)."""

    what = "anything"


@dataclass(frozen=True)
class Option:
    """One option as declared (``option``); ``name`` and ``default`` are the field's."""

    help: str
    check: Check
    flag: str | None  # None: --the-name; "": no flag (the API's alone)
    metavar: str | None
    record: Recorded  # in a checkpoint: "same" a resume must match, "free" recorded only
    default_help: str | None  # how the docs and --help show the default (None: the value)
    group: str | None
    name: str = ""
    default: Any = None

    @property
    def cli(self) -> str | None:
        """The option's flag, or None when it has none."""
        if self.flag == "":
            return None
        return self.flag or "--" + self.name.replace("_", "-")

    def help_text(self, by_flag: bool) -> str:
        """The help, another option named ``{other}`` in it as the caller knows it."""
        return re.sub(r"\{([a-z_0-9]+)\}", lambda m: option_name(m.group(1), by_flag),
                      self.help)

    def checked(self, value: Any) -> Any:  # noqa: ANN401
        """``value`` as kept; a bad one is an ``OptionError`` naming this option."""
        try:
            return self.check(value)
        except ValueError as exc:
            raise OptionError(self.name, str(exc)) from None


def option(default: Any, help: str, check: Check | None = None, *,  # noqa: A002, ANN401
           flag: str | None = None, metavar: str | None = None, record: Recorded = None,
           default_help: str | None = None, group: str | None = None) -> Any:  # noqa: ANN401
    """A record's field declared as an option (a ``dataclasses.field``)."""
    declared = Option(help=help, check=check or Anything(), flag=flag, metavar=metavar,
                      record=record, default_help=default_help, group=group)
    return field(default=default, metadata={_KEY: declared})


def options(cls: Any) -> dict[str, Option]:  # noqa: ANN401
    """The options a record class (or record) declares, by name, in declaration order."""
    out = {}
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(_KEY)
        if declared is not None:
            default = f.default if f.default is not dataclasses.MISSING else None
            out[f.name] = dataclasses.replace(declared, name=f.name, default=default)
    return out


def declare(cls: Any) -> Any:  # noqa: ANN401
    """Class decorator for a record of options: its flags are known to OptionError (so an
    error names ``--no-shuffle``, not ``--shuffle``)."""
    register_flags({name: o.cli for name, o in options(cls).items() if o.cli})
    return cls


def check(record: Any) -> None:  # noqa: ANN401
    """Every option of ``record`` against its declaration (``OptionError`` by name); each
    value is kept as its check keeps it (a list of numbers as a tuple)."""
    for name, declared in options(record).items():
        value = getattr(record, name)
        kept = declared.checked(value)
        if kept is not value:
            object.__setattr__(record, name, kept)  # a frozen record's own field


def add_flags(parser: Any, cls: Any, *, skip: Iterable[str] = (),  # noqa: ANN401
              only: Iterable[str] | None = None, groups: dict[str, Any] | None = None) -> None:
    """The flags of ``cls``'s options on ``parser`` (argparse), each ``dest`` its name; a
    boolean option whose default is False is a switch; ``groups`` maps a declared group to
    the argument group that holds it."""
    skip = set(skip)
    wanted = None if only is None else list(only)
    declared = options(cls)
    names = wanted if wanted is not None else list(declared)
    for name in names:
        o = declared[name]
        if name in skip or o.cli is None:
            continue
        target = (groups or {}).get(o.group or "", parser)
        add_flag(target, o)


def add_flag(parser: Any, o: Option, help: str | None = None) -> None:  # noqa: ANN401, A002
    """One option's flag."""
    text = help or o.help_text(by_flag=True)
    if o.default_help is not None:
        text += f" (default: {o.default_help})"
    text = text.replace("%", "%%")
    if isinstance(o.check, Boolean):
        if o.cli.startswith("--no-"):  # the switch turns a True default off
            parser.add_argument(o.cli, dest=o.name, action="store_false", help=text)
        else:
            parser.add_argument(o.cli, dest=o.name, action="store_const", const=True,
                                default=o.default, help=text)
        return
    choices = getattr(o.check, "choices", None)
    parser.add_argument(o.cli, dest=o.name, type=o.check.cli, default=o.default,
                        metavar=o.metavar or ("|".join(choices) if choices else None),
                        help=text)


def from_args(cls: Any, args: argparse.Namespace, **given: Any) -> Any:  # noqa: ANN401
    """A record of ``cls`` from parsed flags (each option whose flag the parser has), with
    ``given`` besides."""
    values = {name: getattr(args, name) for name in options(cls) if hasattr(args, name)}
    return cls(**{**values, **given})


def recorded(*classes: Any, kind: Recorded = None) -> dict[str, Option]:  # noqa: ANN401
    """The options of ``classes`` that a checkpoint records (``kind``: only those), by name."""
    out: dict[str, Option] = {}
    for cls in classes:
        for name, o in options(cls).items():
            if o.record is not None and (kind is None or o.record == kind):
                out.setdefault(name, o)
    return out


def shown_default(o: Option) -> str:
    """The default as the docs show it."""
    if o.default_help is not None:
        return o.default_help
    v = o.default
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, tuple):
        return ",".join(f"{x:g}" for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def table(rows: Iterable[Option]) -> str:
    """A markdown table of options: flag, keyword, default, what it does."""
    lines = ["| flag | keyword | default | what it does |", "| --- | --- | --- | --- |"]
    for o in rows:
        choices = getattr(o.check, "choices", None)
        metavar = o.metavar or ("|".join(choices) if choices else None)
        if isinstance(o.check, Boolean):
            metavar = None
        flag = f"`{o.cli}{' ' + metavar if metavar else ''}`" if o.cli else "(none)"
        lines.append(f"| {flag.replace('|', chr(92) + '|')} | `{o.name}` | "
                     f"{shown_default(o).replace('|', chr(92) + '|')} | "
                     f"{o.help_text(by_flag=True).replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"

