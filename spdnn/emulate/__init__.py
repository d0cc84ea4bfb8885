"""An emulated multi-node cluster on one machine (``spdnn emulate``): network namespaces as
nodes, shaped links between them, MPI held to TCP across them (docs/network.md)."""

from spdnn.emulate.cluster import Cluster, LinkMeasurement, interrupts_as_ctrl_c
from spdnn.emulate.faults import LinkFault
from spdnn.emulate.links import EmulationError, format_rate, parse_rate

__all__ = ["Cluster", "EmulationError", "LinkFault", "LinkMeasurement", "format_rate",
           "interrupts_as_ctrl_c", "parse_rate"]
