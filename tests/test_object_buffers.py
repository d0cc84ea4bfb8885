"""The communicator's object collectives (spdnn.comm.object_buffers carries objects as byte
buffers): short and long pickles, on every rank count, against what each rank sent; and the slot
format itself without MPI."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn.comm import object_buffers
from spdnn.comm.mpi import Communicator


def _payload(rank: int, big: bool) -> object:
    if not big:
        return None if rank % 2 else ("rank", rank, 0.5)
    return {"rank": rank, "w": np.arange(1000 + rank, dtype=np.float64) * (rank + 1)}


def _same(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def test_a_short_pickle_rides_in_its_slot_and_a_long_one_only_gives_its_length():
    short, long = object_buffers.dumps(("x", 1)), object_buffers.dumps(np.zeros(100))
    assert len(short) <= object_buffers.INLINE < len(long)
    slots = np.stack([object_buffers.slot(short), object_buffers.slot(short)])
    assert list(object_buffers.lengths(slots)) == [len(short)] * 2
    assert object_buffers.inline(slots) == [("x", 1), ("x", 1)]
    assert object_buffers.lengths(object_buffers.slot(long))[0] == len(long)
    assert not object_buffers.slot(long)[8:].any()  # too long: only the length travels first
    both = np.concatenate([short, long])
    got = object_buffers.split(both, np.array([len(short), len(long)]))
    assert got[0] == ("x", 1) and np.array_equal(got[1], np.zeros(100))


@pytest.mark.mpi
@pytest.mark.parametrize("big", [False, True], ids=["short", "long"])
def test_object_collectives_deliver_what_each_rank_sent(big):
    with Communicator() as c:
        mine = _payload(c.rank, big)
        everyone = c.allgather(mine)
        assert len(everyone) == c.size
        assert all(_same(everyone[r], _payload(r, big)) for r in range(c.size))
        root = c.size - 1
        got = c.gather(mine, root=root)
        if c.rank == root:
            assert all(_same(got[r], _payload(r, big)) for r in range(c.size))
        else:
            assert got is None
        assert _same(c.bcast(mine, root=root), _payload(root, big))
        # one long pickle among short ones takes the second message on every rank
        mixed = c.allgather(_payload(c.rank, big=c.rank == 0))
        assert _same(mixed[0], _payload(0, True))
        assert c.allreduce_scalar(c.rank + 0.5, "sum") == sum(r + 0.5 for r in range(c.size))
        assert c.allreduce_scalar(float(c.rank), "max") == c.size - 1
