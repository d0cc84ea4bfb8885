"""Which kernels run: the backend, chosen once per process, as an object.

A backend (``scipy`` or ``numba``) is a ``Backend``: every kernel operation is its attribute,
the form that backend registered for it (``@form(backend, op)``, beside the operation's
definition in its module), else the scipy backend's, the general one; a module whose numba half
speeds up the steps of one algorithm asks for it (``active().compiled(half)``: None on scipy).
A module calls ``active().op(...)``; no other module compares a backend's name
(tests/test_architecture.py checks it). The default is numba when it is installed, else scipy;
``SPDNN_KERNELS=scipy|numba`` or ``set_backend`` choose. What each backend is for: numba is the
one jobs run on; scipy is its oracle in the tests (the same results on every operation, one
suite run across both: the ``backend`` fixture) and the backend of a platform without numba.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from spdnn.errors import SpdnnError

BACKENDS = ("scipy", "numba")
# Where a kernel module's compiled half is, by its short name: the kernels package's
# _numba_products, _numba_softmax, ...
_NUMBA_PREFIX = f"{__package__}.kernels._numba_"
_FORMS: dict[str, dict[str, Callable[..., Any]]] = {name: {} for name in BACKENDS}


def form(backend: str, op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as ``backend``'s form of ``op``."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _FORMS[backend][op] = fn
        return fn
    return register


class Backend:
    """One backend's forms of the kernel operations (attributes, resolved once)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._halves: dict[str, Any] = {}

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op.startswith("__"):
            raise AttributeError(op)
        fn = _FORMS[self.name].get(op) or _FORMS["scipy"].get(op)
        if fn is None:
            raise AttributeError(f"no kernel operation {op!r} (is its module imported?)")
        setattr(self, op, fn)  # resolved once: later calls find it in the instance
        return fn

    def compiled(self, half: str) -> Any:  # noqa: ANN401
        """The compiled half of a kernel module (``_numba_`` + ``half``, in the kernels
        package; or ``half`` itself, a module's full name) where this backend runs it, else
        None (the module's numpy passes run: the same results)."""
        if self.name == "scipy":
            return None
        module = self._halves.get(half)
        if module is None:
            import importlib

            module = importlib.import_module(half if "." in half else _NUMBA_PREFIX + half)
            self._halves[half] = module
        return module

    def passes(self, compiled: str, plain: str) -> Any:  # noqa: ANN401
        """The module of a concept's passes this backend runs: ``compiled`` (a numba half's
        full name) on numba, else ``plain`` (its numpy twin, the same arguments and
        results)."""
        module = self.compiled(compiled)
        if module is None:
            import importlib

            module = importlib.import_module(plain)
        return module

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


_state: dict[str, Backend | None] = {"active": None}
_MADE: dict[str, Backend] = {}


def available_backends() -> list[str]:
    """The backends installed here; numba found, not loaded (its import is slow: bad input
    ends first)."""
    return ["scipy", "numba"] if "numba" in sys.modules or importlib.util.find_spec("numba") \
        else ["scipy"]


def set_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose from {BACKENDS}")
    if name not in available_backends():
        raise ValueError(f"kernel backend {name!r} is not installed (pip install {name})")
    _state["active"] = _MADE.setdefault(name, Backend(name))


def active() -> Backend:
    """The backend this process runs (chosen at the first call: SPDNN_KERNELS, else numba
    when it is installed)."""
    chosen = _state["active"]
    if chosen is None:
        wanted = os.environ.get("SPDNN_KERNELS", "auto")
        wanted = available_backends()[-1] if wanted == "auto" else wanted  # numba if found
        try:
            set_backend(wanted)
        except ValueError as exc:
            raise SpdnnError(f"SPDNN_KERNELS={wanted!r}: {exc}") from None
        chosen = _state["active"]
    assert chosen is not None
    return chosen


def backend() -> str:
    """The active backend's name (for reports: a job's metrics, a calibration)."""
    return active().name


def forget() -> None:
    """Choose again at the next call (tests of the choice)."""
    _state["active"] = None
