"""Giving back the JIT compiler's pages once the kernels are loaded, and loading them without
what only compiling needs.

Loading numba's cached kernels runs LLVM: about 70 MB of ``libllvmlite.so``'s code and
read-only data become resident in every rank (measured: 190 MB for a rank that holds nothing,
122 MB without them). A job does not run LLVM again once its kernels are loaded, unless a
kernel must be compiled anew. So the library's clean, read-only pages are dropped from this
process's resident set with ``madvise(MADV_DONTNEED)``; at the first release, those of every
other shared library too (their start-up code: 20 MB a rank). They stay in the page cache,
shared by every rank on the node, and are read back from there when they run again. Only
mappings that cannot hold a modified page are touched (no write permission, no dirty or
anonymous page), so nothing is lost: dropping such a page only means faulting it in again.
Linux only; elsewhere, or where madvise fails, nothing happens.

Loading a kernel from numba's cache first "refreshes" numba's target: it imports and installs
every implementation numba can compile (numpy's array functions, random generators, typed
containers, ...): 0.15 CPU-s and 13-18 MB of a rank's resident memory (measured), though
loading machine code from the cache uses none of them. ``lean_cache_loads`` makes spdnn's own
kernels load without that step (numba's runtime, which the code calls, is still started); a
kernel that must be compiled goes through numba's compiler, which refreshes the target itself.
"""

from __future__ import annotations

import ctypes
import re
import sys

MADV_DONTNEED = 4
_MAPPING = re.compile(r"([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \d+\s*(.*)")
_LIBRARY = "libllvmlite"
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*$")  # libc.so.6, _multiarray_umath...so
_HEX = frozenset("0123456789abcdef")


def _clean_mappings(library: str | None, smaps: str = "/proc/self/smaps"
                    ) -> list[tuple[int, int]]:
    """(start, end) of ``library``'s mappings (None: every shared library's) that are
    read-only and hold no dirty or anonymous page, from ``smaps``."""
    out: list[tuple[int, int]] = []
    current: dict | None = None

    def close() -> None:
        if current and current["ok"] and current["dirty"] == 0 and current["anon"] == 0:
            out.append((current["start"], current["end"]))

    def named(path: str) -> bool:
        return _SHARED_OBJECT.search(path) is not None if library is None else library in path

    with open(smaps) as fh:
        for line in fh:
            # A mapping's header starts with its hex address, its fields with a capital letter;
            # only the library's own mappings are parsed (a long-lived process has thousands).
            if line[0] in _HEX:
                close()
                m = _MAPPING.match(line) if library is None or library in line else None
                current = None if m is None else {
                    "start": int(m.group(1), 16), "end": int(m.group(2), 16),
                    "ok": named(m.group(4).strip()) and "w" not in m.group(3)
                    and m.group(3)[3] == "p", "dirty": 0, "anon": 0}
            elif current is not None and line.startswith(("Private_Dirty:", "Shared_Dirty:")):
                current["dirty"] += int(line.split()[1])
            elif current is not None and line.startswith("Anonymous:"):
                current["anon"] += int(line.split()[1])
    close()
    return out


# The library's clean ranges, found once: its mappings are fixed when it is loaded, and a
# read-only private mapping cannot gain a dirty page later (reading /proc/self/smaps of a
# process with many mappings took 50-80 ms a call).
_ranges: list[tuple[int, int]] | None = None
# Every other library's clean pages are dropped once, at the first release, from mappings read
# then and there: a library could be unloaded later and its addresses reused by memory whose
# data MADV_DONTNEED would discard, so these ranges are never kept.
_libraries_released = False


def release_compiler_pages() -> int:
    """Drop LLVM's clean read-only pages from this process's resident set, and at the first
    call those of every other shared library (the interpreter's, numpy's, MPI's: 20 MB a rank
    measured, code run once at start-up; what runs again is faulted back from the page cache);
    the bytes of the ranges advised (0 where nothing could be done)."""
    if not sys.platform.startswith("linux") or "llvmlite.binding" not in sys.modules:
        return 0
    global _ranges, _libraries_released
    try:
        if _ranges is None:
            _ranges = _clean_mappings(_LIBRARY)
        ranges = list(_ranges)
        if not _libraries_released:
            _libraries_released = True
            ranges += [r for r in _clean_mappings(None) if r not in _ranges]
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    released = 0
    for start, end in ranges:
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            released += end - start
    return released


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
