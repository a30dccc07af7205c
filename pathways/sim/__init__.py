"""A deterministic simulated cluster (issue 29): the real roles on virtual time, in one process.

``VirtualTimeLoop`` runs asyncio code on a virtual clock that jumps to the next timer.
``Scheduler`` is the discrete-event core: one event order, actors with virtual CPUs, a seeded
``random`` and a trace digest; ``Network`` times messages over ``Link``s, with seeded faults.
"""

from .network import Fault, Link, Network, RandomFaults
from .scheduler import Actor, CausalityError, Handle, Scheduler, SchedulerError
from .virtual_loop import SimulationStalled, VirtualTimeLoop, run

__all__ = [
    "Actor", "CausalityError", "Fault", "Handle", "Link", "Network", "RandomFaults", "Scheduler",
    "SchedulerError", "SimulationStalled", "VirtualTimeLoop", "run",
]
