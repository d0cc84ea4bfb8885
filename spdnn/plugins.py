"""The partitioner's functions, found by their entry points (pyproject.toml): spdnn never
imports the ``partition`` package, which imports spdnn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def entry_point(group: str, name: str) -> Callable[..., Any] | None:
    """The function registered as ``name`` in the entry-point ``group``, or None."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=group):
        if ep.name == name:
            return ep.load()
    return None
