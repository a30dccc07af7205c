"""A real Plaque cluster in virtual time: the coordinator and workers in the caller's thread.

``SimPlaqueCluster`` is ``plaque.Cluster`` with its seams filled in: every endpoint (a real
``CoordinatorCore`` and N ``WorkerCore``s behind their ``Endpoint``s) runs on ONE
``VirtualTimeLoop``, talks through ``SimTransport``s of one ``SimNet`` (links with latency and
bandwidth), and ticks with the loop's virtual clock, so heartbeats and the coordinator's
liveness timeouts count virtual seconds. There is no loop thread: the loop runs in the caller's
thread while it waits, because every future this cluster hands out (``graph.run(arg)``,
``install``, ``counters``) drives the simulation from ``result``/``exception`` until it is
settled, and their ``timeout`` is in virtual seconds. Nothing depends on real time, so a run is
the same every time (up to ``cpu_charge``, off by default: handlers take no virtual time).

>>> with simulated_plaque_cluster(workers=2, latency=1e-3) as cluster:
...     result = cluster.install(graph).run(10).result(timeout=60)
...     cluster.clock()  # virtual seconds when the result came back
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import math
from collections.abc import Callable

from plaque.cluster import Cluster
from plaque.errors import PlaqueError
from plaque.events import Membership

from .network import FaultHook
from .transport import SimNet
from .virtual_loop import CpuCharge, VirtualTimeLoop

__all__ = ["SimPlaqueCluster", "SimulationError", "simulated_plaque_cluster"]

WAIT_LIMIT = 3600.0  # virtual seconds a wait without a timeout may last


class SimulationError(PlaqueError):
    """The simulation cannot do what was asked (e.g. wait on a result from inside itself)."""


class _DrivenFuture(cf.Future):
    """A ``concurrent.futures.Future`` whose ``result``/``exception`` run the simulation
    until it is settled or ``timeout`` virtual seconds have passed."""

    def __init__(self, drive: Callable[[cf.Future, float | None], None]):
        super().__init__()
        self._drive = drive

    def result(self, timeout=None):
        self._drive(self, timeout)
        return super().result(0)

    def exception(self, timeout=None):
        self._drive(self, timeout)
        return super().exception(0)


class SimPlaqueCluster(Cluster):
    """A ``plaque.Cluster`` on virtual time (see the module's text); ``net`` is its
    ``SimNet`` (links, faults, recorded deliveries), ``clock()`` its virtual time.

    ``wait_limit``: virtual seconds a wait given no timeout may last (then TimeoutError).
    """

    def __init__(self, *, seed: int = 0, latency: float = 0.0, bandwidth: float = math.inf,
                 heartbeat_timeout: float = 3.0, faults: FaultHook | None = None,
                 record: bool = True, cpu_charge: CpuCharge | None = None,
                 wait_limit: float = WAIT_LIMIT):
        loop = VirtualTimeLoop(cpu_charge=cpu_charge)
        self.net = SimNet(loop, latency, bandwidth, seed=seed, faults=faults, record=record)
        self.clock = loop.time
        self.wait_limit = wait_limit
        super().__init__("inproc", heartbeat_timeout=heartbeat_timeout)

    # ---- the seams of plaque.Cluster ---------------------------------------------------------
    def _make_loop(self):
        return self.net.loop

    def _make_transport(self, bind, keys):
        return self.net.transport()

    def _new_worker_transport(self):
        return self.net.transport()

    def _new_future(self) -> cf.Future:
        return _DrivenFuture(self._drive)

    def _start_loop(self) -> None:
        self._endpoint.start()  # its timers and deliveries run whenever the caller waits

    def _join_loop(self, timeout: float) -> None:
        loop = self._loop
        try:
            if not loop.is_running():
                loop.run_forever()  # until the shutdown ``close`` scheduled stops it
        finally:
            if not loop.is_running():
                loop.close()

    # ---- waiting: the simulation runs while the caller waits ---------------------------------
    def _drive(self, fut: cf.Future, timeout: float | None) -> None:
        if fut.done():
            return
        waiter = self._loop.create_future()

        def settled(_):
            if not self._loop.is_closed() and not waiter.done():
                waiter.set_result(None)

        fut.add_done_callback(settled)
        self._run_until(waiter, timeout)

    def _run_until(self, waiter: asyncio.Future, timeout: float | None) -> None:
        """Run the loop until ``waiter`` is done or ``timeout`` virtual seconds passed."""
        loop = self._loop
        if loop.is_running():
            raise SimulationError("cannot wait for the simulation from inside it (a "
                                  "callback of the loop); chain a callback instead")
        if loop.is_closed():
            return

        async def wait():
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except TimeoutError:
                pass

        if timeout is None:
            timeout = self.wait_limit
        loop.run_until_complete(wait())

    def wait_for_workers(self, n: int, timeout: float = 30.0) -> list[int]:
        """Run the simulation until at least ``n`` workers are live (virtual ``timeout``)."""
        if len(self.workers()) < n:
            waiter = self._loop.create_future()

            def on_event(ev):
                if type(ev) is Membership and len(ev.workers) >= n and not waiter.done():
                    waiter.set_result(None)

            self.listeners.append(on_event)
            try:
                self._run_until(waiter, timeout)
            finally:
                self.listeners.remove(on_event)
        members = self.workers()
        if len(members) < n:
            raise PlaqueError(f"only {len(members)} of {n} workers joined within {timeout} "
                              "virtual s")
        return members

    def run_for(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass (heartbeats, timers, messages in flight)."""
        self._run_until(self._loop.create_future(), seconds)


@contextlib.contextmanager
def simulated_plaque_cluster(workers: int = 2, seed: int = 0, latency: float = 0.0,
                             bandwidth: float = math.inf, *, heartbeat_timeout: float = 3.0,
                             faults: FaultHook | None = None, record: bool = True,
                             cpu_charge: CpuCharge | None = None, timeout: float = 30.0):
    """A ``SimPlaqueCluster`` with ``workers`` in-process workers that have joined (within
    ``timeout`` virtual seconds); closed on exit."""
    cluster = SimPlaqueCluster(seed=seed, latency=latency, bandwidth=bandwidth,
                               heartbeat_timeout=heartbeat_timeout, faults=faults,
                               record=record, cpu_charge=cpu_charge)
    try:
        cluster.add_inproc_workers(workers)
        cluster.wait_for_workers(workers, timeout)
        yield cluster
    finally:
        cluster.close()
