"""numba's cached kernels loaded without what only compiling needs.

Loading a kernel from numba's cache first "refreshes" numba's target: it imports and installs
every implementation numba can compile (numpy's array functions, random generators, typed
containers, ...), private memory of every rank and CPU time at start-up, though loading
machine code from the cache uses none of them. ``lean_cache_loads`` makes spdnn's own kernels
load without that step (numba's runtime, which the code calls, is still started); a kernel
that must be compiled goes through numba's compiler, which refreshes the target itself. It
reaches into numba's private cache methods: pyproject.toml pins numba and llvmlite to the
versions it was tested with, and where the methods differ nothing changes.
"""

from __future__ import annotations


def _load_lean(cache: object, sig: object, target_context: object) -> object:
    """numba's ``Cache.load_overload`` without ``target_context.refresh()``: start numba's
    runtime (what the refresh does first, and the loaded code links against), then load."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)
    with cache._guard_against_spurious_io_errors():  # type: ignore[attr-defined]
        return cache._load_overload(sig, target_context)  # type: ignore[attr-defined]


def lean_cache_loads(namespace: dict) -> None:
    """Make the cached numba kernels defined in ``namespace`` (a module's ``globals()``) load
    without numba's registries; the dispatchers of other code, the caller's own, are left as
    they are. Where numba's internals differ from what this expects, nothing changes."""
    import functools

    from numba.core.dispatcher import Dispatcher

    for value in list(namespace.values()):
        cache = getattr(value, "_cache", None)
        if (isinstance(value, Dispatcher) and value.__module__ == namespace.get("__name__")
                and hasattr(cache, "_load_overload")
                and hasattr(cache, "_guard_against_spurious_io_errors")):
            cache.load_overload = functools.partial(_load_lean, cache)
