"""A deterministic simulated cluster (issue 29): the real roles on virtual time, in one process.

``VirtualTimeLoop`` runs asyncio code on a virtual clock that jumps to the next timer, the
one event order of a simulation. ``Link`` times messages (latency, bandwidth, FIFO), with
seeded faults (``RandomFaults``). ``SimNet``/``SimTransport`` carry Plaque's messages over
such links on one ``VirtualTimeLoop``;
``simulated_plaque_cluster`` runs a real Plaque coordinator and workers over them, each a
role (``RoleLoop``) with its own virtual CPU.
"""

from .network import RTO, Fault, Link, RandomFaults
from .plaque_cluster import (
                             DrivenFuture,
                             SimPlaqueCluster,
                             SimulationError,
                             simulated_plaque_cluster,
)
from .roles import RoleLoop, Span
from .transport import Delivery, SimNet, SimTransport
from .virtual_loop import SimulationStalled, VirtualTimeLoop, run

__all__ = [
    "DrivenFuture", "Fault", "Link", "RandomFaults", "RTO", "SimPlaqueCluster", "SimulationError", "simulated_plaque_cluster",
    "Delivery", "SimNet", "SimTransport", "SimulationStalled",
    "VirtualTimeLoop", "run", "RoleLoop", "Span",
]
