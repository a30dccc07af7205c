"""A deterministic simulated cluster (issue 29): the real roles on virtual time, in one process.

``VirtualTimeLoop`` runs asyncio code on a virtual clock that jumps to the next timer.
``Scheduler`` is the discrete-event core: one event order, actors with virtual CPUs, a seeded
``random`` and a trace digest; ``Network`` times messages over ``Link``s, with seeded faults.
``SimNet``/``SimTransport`` carry Plaque's messages over such links on one ``VirtualTimeLoop``;
``simulated_plaque_cluster`` runs a real Plaque coordinator and workers over them, each a
role (``RoleLoop``) with its own virtual CPU.
"""

from .network import RTO, Fault, Link, Network, RandomFaults
from .plaque_cluster import (
                             DrivenFuture,
                             SimPlaqueCluster,
                             SimulationError,
                             simulated_plaque_cluster,
)
from .roles import RoleLoop, Span
from .scheduler import Actor, CausalityError, Handle, Scheduler, SchedulerError
from .transport import Delivery, SimNet, SimTransport
from .virtual_loop import SimulationStalled, VirtualTimeLoop, run

__all__ = [
    "Actor", "CausalityError", "DrivenFuture", "Fault", "Handle", "Link", "Network",
    "RandomFaults", "RTO", "Scheduler",
    "SchedulerError", "SimPlaqueCluster", "SimulationError", "simulated_plaque_cluster",
    "Delivery", "SimNet", "SimTransport", "SimulationStalled",
    "VirtualTimeLoop", "run", "RoleLoop", "Span",
]
