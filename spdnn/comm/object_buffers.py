"""Python objects as byte buffers for the communicator's object collectives (no MPI here).

mpi4py's own object collectives (``comm.allgather`` and the like) duplicate the communicator
on first use while holding the interpreter lock: a link that freezes then hangs the rank with
its watchdog thread unable to run. spdnn sends objects through buffer collectives instead
(which release the lock), in a fixed-size slot when the pickle is short (one collective, the
common case: ``None``, an error line, a number) and as a second, variable-size message
otherwise.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

SLOT = 256  # bytes per rank in the first message: the length, then a short pickle inline
INLINE = SLOT - 8


def dumps(obj: Any) -> np.ndarray:  # noqa: ANN401
    """``obj`` pickled, as a uint8 array."""
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def loads(data: np.ndarray) -> Any:  # noqa: ANN401
    return pickle.loads(memoryview(np.ascontiguousarray(data)))


def slot(data: np.ndarray | None) -> np.ndarray:
    """The first message: ``len(data)`` and, when it fits, ``data`` itself (``None``: an
    empty slot, filled by the collective)."""
    out = np.zeros(SLOT, dtype=np.uint8)
    if data is not None:
        out[:8] = np.array([len(data)], dtype=np.int64).view(np.uint8)
        if len(data) <= INLINE:
            out[8:8 + len(data)] = data
    return out


def lengths(slots: np.ndarray) -> np.ndarray:
    """The pickles' lengths, one per slot (``slots``: shape (ranks, SLOT) or (SLOT,))."""
    s = np.ascontiguousarray(slots.reshape(-1, SLOT)[:, :8])
    return s.view(np.int64).ravel().copy()


def inline(slots: np.ndarray) -> list[Any]:
    """The objects carried in the slots themselves (every length within INLINE)."""
    s = slots.reshape(-1, SLOT)
    return [loads(s[r, 8:8 + n]) for r, n in enumerate(lengths(s))]


def split(data: np.ndarray, counts: np.ndarray) -> list[Any]:
    """The objects of a variable-size message: ``counts[r]`` bytes from rank r, in order."""
    ends = np.cumsum(counts)
    return [loads(data[e - n:e]) for e, n in zip(ends, counts, strict=True)]
