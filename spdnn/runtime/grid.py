"""The grid of ranks: R replicas of a network partitioned into ``parts`` model parts.

P = R x parts; the ranks of one replica are consecutive (rank = replica x parts + part), so a
replica can sit inside a node. The model communicator joins the parts of one replica (expand,
fold, the softmax); the data communicator joins the replicas of one part (gradient sums).
"""

from __future__ import annotations

from dataclasses import dataclass

from spdnn.comm.mpi import Communicator
from spdnn.errors import SpdnnError
from spdnn.model.batching import share_of


@dataclass(frozen=True)
class Grid:
    world: Communicator
    model: Communicator
    data: Communicator

    @staticmethod
    def make(world: Communicator, parts: int) -> Grid:
        """Split ``world`` into replicas of ``parts`` consecutive ranks (collective)."""
        if parts < 1 or world.size % parts:
            raise SpdnnError(f"{world.size} ranks cannot hold replicas of {parts} parts")
        return Grid(world, world.split(world.rank // parts), world.split(world.rank % parts))

    @property
    def parts(self) -> int:
        return self.model.size

    @property
    def replicas(self) -> int:
        return self.data.size

    @property
    def replica(self) -> int:
        return self.data.rank

    def share(self, n: int) -> slice:
        """This replica's contiguous share of n items: R shares whose sizes differ by at most
        one (the first n mod R one larger); a share is empty when n < R."""
        return share_of(n, self.replica, self.replicas)

    def free(self) -> None:
        self.model.free()
        self.data.free()
