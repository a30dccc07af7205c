"""A real Plaque cluster in virtual time: the coordinator and workers in the caller's thread.

``SimPlaqueCluster`` is ``plaque.Cluster`` on a runtime of its own (``SimRuntime``): every
endpoint (a real ``CoordinatorCore`` and N ``WorkerCore``s behind their ``Endpoint``s) runs on ONE
``VirtualTimeLoop``, talks through ``SimTransport``s of one ``SimNet`` (links with latency and
bandwidth), and ticks with the loop's virtual clock, so heartbeats and the coordinator's
liveness timeouts count virtual seconds. There is no loop thread: the loop runs in the caller's
thread while it waits, because every future this cluster hands out (``graph.run(arg)``,
``install``, ``counters``) drives the simulation from ``result``/``exception`` until it is
settled, and their ``timeout`` is in virtual seconds. Nothing depends on real time, so a run is
the same every time (up to measured CPU, off by default: handlers take no virtual time).

Each endpoint is a role with its own virtual CPU (``pathways.sim.roles``): the coordinator
("coordinator") and each worker ("worker-0", ...) schedule on their own ``RoleLoop`` view of
the loop, so a message to a role is handled at max(arrival, that role's CPU free), the role's
ticks and heartbeats queue on the same CPU, and what a handler sends leaves at its end.
``cpu="measured"`` charges each handler the thread CPU time it used, ``cpu="fixed"`` a fixed
cost (``cost``, or ``costs[role]``) for bit-for-bit replay; ``None`` charges nothing. The
driver's calls into the coordinator (install, run, counters) are coordinator handlers too, as
they run on the coordinator's loop thread in a real cluster.

>>> from plaque import Graph, Operator
>>> class Source(Operator):
...     def on_complete(self, ctx, t):
...         ctx.emit(ctx.arg)
>>> class Double(Operator):
...     def on_input(self, ctx, t, port, value):
...         ctx.output(2 * value)
>>> g = Graph("demo")
>>> _ = g.edge(g.node("src", Source, 1, placement=[0]), g.node("double", Double, 1, placement=[1]))
>>> with simulated_plaque_cluster(workers=2, latency=1e-3) as cluster:
...     result = cluster.install(g).run(21).result(timeout=60)
...     print(result.outputs["double"], round(cluster.clock(), 6) > 0)
{0: [42]} True
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import math
from collections.abc import Callable, Mapping

from plaque.cluster import Cluster
from plaque.errors import PlaqueError
from plaque.events import Membership

from .collector import Collector
from .cputime import one_thread
from .network import FaultHook
from .roles import RoleLoop
from .transport import SimNet
from .virtual_loop import VirtualTimeLoop

__all__ = ["DrivenFuture", "SimPlaqueCluster", "SimRuntime", "SimulationError",
           "simulated_plaque_cluster"]

WAIT_LIMIT = 3600.0  # virtual seconds a wait without a timeout may last


class SimulationError(PlaqueError):
    """The simulation cannot do what was asked (e.g. wait on a result from inside itself)."""


class DrivenFuture(cf.Future):
    """A ``concurrent.futures.Future`` whose ``result``/``exception`` run the simulation
    until it is settled or ``timeout`` virtual seconds have passed; then a ``TimeoutError``
    that names ``what`` was waited for and how long."""

    def __init__(self, drive: Callable[[cf.Future, float | None], None],
                 what: str = "the simulated result waited for"):
        super().__init__()
        self.drive, self.what = drive, what

    def result(self, timeout=None):
        self.drive(self, timeout)
        self._check_settled(timeout)
        return super().result(0)

    def exception(self, timeout=None):
        self.drive(self, timeout)
        self._check_settled(timeout)
        return super().exception(0)

    def _check_settled(self, timeout) -> None:
        if not self.done():
            waited = f"{timeout:g}" if timeout is not None else f"the longest wait, {WAIT_LIMIT:g}"
            raise TimeoutError(f"{self.what} did not come within {waited} virtual s")


class SimRuntime:
    """What a ``SimPlaqueCluster`` runs on (``plaque.runtime.LoopThread``'s members): the
    simulation's virtual clock and network; the coordinator's loop and each in-process
    worker's a role of their own; futures that run the simulation while waited on; no
    thread (the loop runs whenever the caller waits)."""

    def __init__(self, sim: SimPlaqueCluster):
        self.sim = sim
        self.clock = sim.net.loop.time

    def transport(self, bind, keys):
        return self.sim.net.transport()

    def worker_transport(self):
        return self.sim.net.transport()

    def loop(self):
        # the cluster's own loop is the coordinator's CPU: its endpoint and the driver's
        # calls into it run there, as on the coordinator's loop thread of a real cluster
        return self.sim.new_role("coordinator")

    def worker_loop(self, loop, name: str):
        return self.sim.new_role(name)  # each worker its own CPU

    def future(self) -> cf.Future:
        return DrivenFuture(self.sim.drive)

    def start(self, loop, endpoint) -> None:
        endpoint.start()  # its timers and deliveries run whenever the caller waits

    def join(self, loop, timeout: float) -> None:
        self.sim.release()
        try:
            if not loop.is_running():
                loop.run_forever()  # until the shutdown ``close`` scheduled stops it
        finally:
            if not loop.is_running():
                loop.close()


class SimPlaqueCluster(Cluster):
    """A ``plaque.Cluster`` on virtual time (see the module's text); ``net`` is its
    ``SimNet`` (links, faults, recorded deliveries), ``clock()`` its virtual time.

    ``wait_limit``: virtual seconds a wait given no timeout may last (then TimeoutError).
    ``net``: a ``SimNet`` to join (a simulated Pathways cluster's, shared with its other
    roles) instead of a new one made from ``seed``, ``latency``, ``bandwidth``, ``faults``,
    and ``record``.
    ``roles``: each role's ``RoleLoop`` by name (its CPU, and its handlers' spans when
    ``record``); ``cpu``, ``cost``, ``costs``: how handlers are charged (module text).
    """

    def __init__(self, *, seed: int = 0, latency: float = 0.0, bandwidth: float = math.inf,
                 heartbeat_timeout: float = 3.0, faults: FaultHook | None = None,
                 record: bool = True, cpu: str | None = None, cost: float = 0.0,
                 costs: Mapping[str, float] | None = None, wait_limit: float = WAIT_LIMIT,
                 net: SimNet | None = None):
        if net is None:
            loop = VirtualTimeLoop()
            net = SimNet(loop, latency, bandwidth, seed=seed, faults=faults, record=record)
        self.net, loop = net, net.loop
        self.clock = loop.time
        self.wait_limit = wait_limit
        self.roles: dict[str, RoleLoop] = {}
        self._cpu, self._cost, self._costs, self._record = cpu, cost, dict(costs or {}), record
        self._one_thread = one_thread()  # BLAS on the role's thread (pathways.sim.cputime)
        self.collector = Collector()  # collections at fixed points of the run
        try:
            super().__init__("inproc", heartbeat_timeout=heartbeat_timeout,
                             runtime=SimRuntime(self))
        except BaseException:
            self.release()
            raise

    def new_role(self, name: str) -> RoleLoop:
        """A new role of this simulation, charged as its other roles are."""
        role = RoleLoop(self.net.loop, name, self._cpu, self._costs.get(name, self._cost),
                        record=self._record, collector=self.collector)
        self.roles[name] = role
        return role

    def worker_role(self, worker: int) -> RoleLoop:
        """The role of the worker with id ``worker`` (ids follow the order of joining, which
        need not be the order the roles were made in)."""
        return self.endpoint_of(worker).loop

    def release(self) -> None:
        """What this simulation holds of the process: BLAS pools, the garbage collector."""
        self._one_thread.release()
        self.collector.release()

    # ---- waiting: the simulation runs while the caller waits ---------------------------------
    def drive(self, fut: cf.Future, timeout: float | None) -> None:
        """Run the simulation until ``fut`` is settled or ``timeout`` virtual seconds passed
        (what a ``DrivenFuture``'s ``result`` does)."""
        if fut.done():
            return
        waiter = self.loop.create_future()

        def settled(_):
            if not self.loop.is_closed() and not waiter.done():
                waiter.set_result(None)

        fut.add_done_callback(settled)
        self.run_until(waiter, timeout)

    def run_until(self, waiter: asyncio.Future, timeout: float | None) -> None:
        """Run the loop until ``waiter`` is done or ``timeout`` virtual seconds passed."""
        loop = self.loop
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
            waiter = self.loop.create_future()

            def on_event(ev):
                if type(ev) is Membership and len(ev.workers) >= n and not waiter.done():
                    waiter.set_result(None)

            self.listeners.append(on_event)
            try:
                self.run_until(waiter, timeout)
            finally:
                self.listeners.remove(on_event)
        members = self.workers()
        if len(members) < n:
            raise PlaqueError(f"only {len(members)} of {n} workers joined within {timeout} "
                              "virtual s")
        return members

    def run_for(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass (heartbeats, timers, messages in flight)."""
        self.run_until(self.loop.create_future(), seconds)


@contextlib.contextmanager
def simulated_plaque_cluster(workers: int = 2, seed: int = 0, latency: float = 0.0,
                             bandwidth: float = math.inf, *, heartbeat_timeout: float = 3.0,
                             faults: FaultHook | None = None, record: bool = True,
                             cpu: str | None = None, cost: float = 0.0, costs: Mapping[str, float] | None = None,
                             timeout: float = 30.0):
    """A ``SimPlaqueCluster`` with ``workers`` in-process workers that have joined (within
    ``timeout`` virtual seconds); closed on exit."""
    cluster = SimPlaqueCluster(seed=seed, latency=latency, bandwidth=bandwidth,
                               heartbeat_timeout=heartbeat_timeout, faults=faults,
                               record=record, cpu=cpu, cost=cost,
                               costs=costs)
    try:
        cluster.add_inproc_workers(workers)
        cluster.wait_for_workers(workers, timeout)
        yield cluster
    finally:
        cluster.close()
