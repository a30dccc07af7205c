"""What a ``plaque.Cluster`` runs on: its runtime. ``LoopThread`` is the default, a real process's:
the coordinator's event loop on a thread of its own. A simulation gives its own runtime with
the same members (``pathways.sim.plaque_cluster.SimRuntime``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import uvloop

from .errors import PlaqueError
from .transport import InprocTransport
from .zmq_transport import ZmqTransport

__all__ = ["LoopThread"]


class LoopThread:
    """What a ``Cluster`` runs on, its runtime: this one, the default, is a uvloop event loop
    on a thread of its own in real time, with ZeroMQ (or, at ``inproc``, in-process)
    transports and plain futures. A simulation gives its own with the same members
    (``pathways.sim.plaque_cluster``): virtual time, a simulated network, futures that run
    the simulation while they are waited on.

    ``clock``: the time endpoints tick with; ``transport(bind, keys)``: the coordinator's;
    ``worker_transport()``: an in-process worker's; ``loop()``: the coordinator's event
    loop, and ``worker_loop(loop, name)`` an in-process worker's (here the same one);
    ``future()``: a future the caller may wait on, settled on the loop; ``start(loop,
    endpoint)``: run the loop and the coordinator's endpoint; ``join(loop, timeout)``: wait
    for the loop to finish the shutdown ``Cluster.close`` scheduled on it."""

    clock = staticmethod(time.monotonic)

    def __init__(self):
        self._thread = None

    def transport(self, bind: str, keys):
        return InprocTransport() if bind == "inproc" else ZmqTransport(bind, keys=keys)

    def worker_transport(self):
        return InprocTransport()

    def loop(self):
        return uvloop.new_event_loop()

    def worker_loop(self, loop, name: str):
        return loop

    def future(self) -> cf.Future:
        return cf.Future()

    def start(self, loop, endpoint) -> None:
        self._thread = threading.Thread(target=self._serve, args=(loop, endpoint),
                                        name="plaque-coordinator", daemon=True)
        started = threading.Event()
        loop.call_soon(started.set)
        self._thread.start()
        if not started.wait(10):
            raise PlaqueError("coordinator event loop did not start")

    def join(self, loop, timeout: float) -> None:
        self._thread.join(timeout)

    @staticmethod
    def _serve(loop, endpoint):
        asyncio.set_event_loop(loop)
        endpoint.start()
        try:
            loop.run_forever()
        finally:
            loop.close()
