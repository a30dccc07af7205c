"""A simulated Pathways cluster: the real coordinator, hosts and clients in virtual time.

``SimCluster`` runs the real roles of a cluster as roles of ONE discrete-event simulation in
the caller's thread (``pathways.sim``): the coordinator (its control plane and Plaque
cluster) and each host (executor, object store, data service, Plaque worker) with their own
virtual CPU, clients on the same clock. Their messages are the real encoded frames over a
``SimNet``: control and client traffic over the host network (``latency`` seconds and
``bandwidth`` bytes/s per link, DCN-like by default), ICI values between hosts at no extra
cost, since the device model books a collective's ICI time in its kernels. Devices keep their
timelines, in virtual time. Nothing runs while the caller does not wait: each call of a
client catches the simulation up to the caller's time, and each wait runs it until what is
waited for is settled (``pathways.simulated.session``).

``pw.local_cluster(simulate=True, seed=S)`` starts one; its ``address`` (``sim://N``) is
what ``pw.connect`` takes, in this process. ``cpu``: how a handler's CPU is charged to its
role: ``"measured"`` (thread CPU time, the default: each role as if on its own core),
``"fixed"`` (``cost`` seconds each, the same every run: bit-for-bit replay) or ``None``
(free). The same ``seed`` and script give the same events in the same order, in a fresh
process or after others in the same one: the garbage collector runs at fixed points of the
simulation (``pathways.sim.collector``) and the client's names come from the seed.
``faults``: a ``FaultPlan`` or its text (``pathways.simulated.faults``: kills and freezes of
hosts by their ids, messages lost (and sent again, as over TCP) or late), or a message-fault
hook of ``pathways.sim``.

Kernel time limits (``kernel_limit``, 30 s by default, or a function's ``limit=``) hold as on
real hosts, in the CPU seconds the body itself uses (``pathways.host.watchdog.TimerWatchdog``:
no thread; never real time, which the machine's load would stretch): a body that never
returns fails its call instead of stopping the simulation for good. Not simulated yet (a
clear error, not a wrong answer): suspend/resume, host processes of their own.

>>> import numpy as np, pathways as pw
>>> from pathways import P
>>> with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True) as cluster:
...     with pw.connect(cluster.address) as client:
...         mesh = client.mesh((4,), ("x",))
...         total = pw.shard_map(lambda a: pw.psum(a, "x"), mesh, P("x"), P())
...         print(total(client.put(np.arange(4.0), mesh, P("x"))).result())
[6.]
"""

from __future__ import annotations

import itertools
import math
import threading
import time

import greenlet

from plaque.endpoint import Endpoint

from ..client import session as client_session
from ..control.coordinator import Coordinator
from ..errors import PathwaysError
from ..host.clock import Clock
from ..host.executor import KERNEL_LIMIT
from ..host.process import build_host
from ..program.cost import DCN, DeviceSpec
from ..sim import DrivenFuture, SimNet, SimPlaqueCluster, SimulationError, VirtualTimeLoop
from .faults import FaultPlan, parse_faults
from .session import SimSession, UserCpu
from .sockets import COORDINATOR, SimIciLink, SimService

__all__ = ["COORDINATOR", "SimCluster", "HOST_NETWORK", "sim_coordinator"]


HOST_NETWORK = DCN  # control and client messages: latency + bytes / bandwidth per link
_NUMBERS = itertools.count()
_RUNNING: dict[str, SimCluster] = {}  # address -> the simulated cluster running there


def _open_session(address, *args) -> SimSession:
    """``pathways.client.session.OPENERS["sim"]``: a session with the cluster at ``address``."""
    cluster = _RUNNING.get(address)
    if cluster is None:
        raise client_session.no_simulated_cluster(address)
    return SimSession(cluster, address, *args)


def _ici_figures(src: str, dst: str):
    """ICI values between hosts take no network time: their kernels' model books it."""
    return (0.0, math.inf) if src.endswith("/ici") else None


def sim_coordinator(sim: SimCluster, heartbeat_timeout: float, **kwargs) -> Coordinator:
    """The real coordinator on the simulation ``sim``: its Plaque cluster a
    ``SimPlaqueCluster`` on the simulation's net, its clients' port a ``SimService``, its
    time virtual."""
    cluster = SimPlaqueCluster(net=sim.net, heartbeat_timeout=heartbeat_timeout, cpu=sim.cpu,
                               cost=sim.cost, record=sim.record)
    return Coordinator("inproc", cluster=cluster, clock=cluster.clock, **kwargs,
                       serve=lambda on_request, after_batch: SimService(
                           sim.net, cluster.loop, COORDINATOR, on_request, sender=-1,
                           after_batch=after_batch))


class SimCluster:
    """A simulated cluster (see the module's text): ``islands * hosts_per_island`` hosts of
    ``devices_per_host`` devices. ``clock()``: its virtual time; ``wall()``: real seconds
    since it started; ``roles``: each role's ``RoleLoop`` (CPU used, spans when ``record``);
    ``net``: its ``SimNet``."""

    def __init__(self, islands: int = 1, hosts_per_island: int = 2, devices_per_host: int = 4,
                 *, seed: int = 0, cpu: str | None = "measured", cost: float = 0.0,
                 latency: float = HOST_NETWORK.latency,
                 bandwidth: float = HOST_NETWORK.bandwidth, heartbeat_timeout: float = 3.0,
                 policy: str = "fifo", window: int = 8, client_timeout: float = 5.0,
                 hbm_gib: float = 16.0, faults=None, record: bool = False,
                 timeout: float = 60.0, kernel_limit: float | None = KERNEL_LIMIT):
        self._started = time.perf_counter()
        self.thread = threading.current_thread()  # the one thread that drives it
        self._spawned: dict = {}  # greenlet -> the role it runs on (``spawn``)
        self.cpu, self.cost, self.record, self.hbm_gib = cpu, cost, record, hbm_gib
        self.kernel_limit, self.seed = kernel_limit, seed
        self.closed = False
        self.address = f"sim://{next(_NUMBERS)}"
        self.clients = itertools.count()  # numbers the clients' roles: client-0, client-1...
        plan = parse_faults(faults) if isinstance(faults, str) else faults
        if isinstance(plan, FaultPlan):
            faults = plan.messages()
        loop = VirtualTimeLoop()
        self.net = SimNet(loop, latency, bandwidth, seed=seed, faults=faults, record=record,
                          model=_ici_figures)
        self.hosts: list = []  # (host, data service, endpoint) of each host
        self.coordinator = sim_coordinator(self, heartbeat_timeout=heartbeat_timeout,
                                           policy=policy, window=window,
                                           client_timeout=client_timeout)
        self.plaque = self.coordinator.cluster
        self.roles = self.plaque.roles
        self.clock = self.plaque.clock
        self.user = UserCpu(loop, self._run_to, cpu, cost)
        try:
            for island in range(islands):
                for _ in range(hosts_per_island):  # one by one: role host-N is host id N
                    self.add_host(island, devices_per_host)
                    self.plaque.wait_for_workers(len(self.hosts), timeout)
            self.wait_ready(islands * hosts_per_island * devices_per_host, timeout)
            if isinstance(plan, FaultPlan):
                plan.apply(self)
        except BaseException:
            self.close()
            raise
        _RUNNING[self.address] = self
        client_session.OPENERS.setdefault("sim", _open_session)

    # ---- hosts ------------------------------------------------------------------------------
    def add_host(self, island: int, devices: int):
        """One more host in ``island``, as role ``host-<n>``; its ``Host``. (Its host id is
        the coordinator's, in the order hosts join: ``n`` when every earlier host has
        joined first, as the cluster's own hosts do.)"""
        name = f"host-{len(self.hosts)}"
        net, role = self.net, self.plaque.new_role(name)
        transport = net.transport(f"{name}/plaque")
        host, data, core = build_host(
            island, devices, DeviceSpec(hbm_bytes=int(self.hbm_gib * 2**30)),
            self.kernel_limit, role,
            link=lambda worker_of: SimIciLink(net, role, f"{name}/ici", worker_of),
            serve=lambda handle: SimService(net, role, f"{name}/data", handle),
            address=transport.address, plaque=self.plaque.address,
            coordinator_timeout=10.0, clock=Clock(role.now, on_loop=True), hostname=name)
        host.ici.on_arrival = host.executor.wake

        def exited(_reason: str) -> None:  # why: the endpoint's exit_reason
            host.close()
            data.service.close()

        endpoint = Endpoint(core, transport, role, clock=self.clock, on_exit=exited)
        self.plaque.add_endpoint(endpoint)
        role.call_soon(endpoint.start)
        self.hosts.append((host, data, endpoint))
        return host

    def wait_ready(self, num_devices: int, timeout: float = 60.0) -> None:
        """Run the simulation until ``num_devices`` devices have joined (virtual seconds)."""
        self.plaque.wait_for_workers(len(self.hosts), timeout)
        deadline = self.clock() + timeout
        while len(self.coordinator.devices()) < num_devices:
            if self.clock() > deadline:
                raise PathwaysError(f"only {len(self.coordinator.devices())} of {num_devices}"
                                    f" simulated devices joined within {timeout:g} virtual s")
            self.run_for(0.01)
        self.user.resumed()  # wait_for_workers ran the simulation too

    # ---- faults -----------------------------------------------------------------------------
    def at(self, when: float | None, fn) -> None:
        """Run ``fn()`` at virtual time ``when`` (now if None or past), outside every role's
        CPU."""
        self.net.loop.call_at(self.clock() if when is None else max(when, self.clock()), fn)

    def kill_host(self, host: int, at: float | None = None) -> None:
        """The host with id ``host`` (the id ``pathways status`` and ``Device.host`` show)
        dies at virtual time ``at`` (default: now): its sockets close and it never answers
        again, as a killed process; the coordinator finds out from its silence.
        ``ValueError`` if no live host has that id."""
        _, _, endpoint = self.hosts[self.host_index(host)]
        self.at(at, lambda: endpoint.stop("killed"))

    def host_index(self, host: int) -> int:
        """Where in ``hosts`` the host with id ``host`` is (its role is ``host-<index>``)."""
        live = self.coordinator.plane.hosts
        if host not in live:
            raise ValueError(f"no host {host}: the live hosts are {sorted(live)} (the ids"
                             " pathways status shows)")
        return next(i for i, (_, data, _) in enumerate(self.hosts)
                    if data.address == live[host]["data"])

    def freeze(self, role: str, seconds: float, at: float | None = None) -> None:
        """Role ``role`` ("host-1", "coordinator", "client-0") is frozen for ``seconds`` of
        virtual time from ``at`` (default: now), as a stopped process."""
        frozen = self.roles[role]
        self.at(at, lambda: frozen.freeze(seconds))

    # ---- time -------------------------------------------------------------------------------
    def future(self, what: str | None = None) -> DrivenFuture:
        """A future whose ``result``/``exception`` run the simulation until it settles (its
        timeout in virtual seconds), the caller's CPU charged first; ``what`` it stands for
        names it in its ``TimeoutError``."""
        return DrivenFuture(self._drive, *([what] if what else []))

    def check_thread(self) -> None:
        """``SimulationError`` unless called from the thread that started the simulation:
        what another thread does happens at no simulated time, so it cannot take part."""
        if threading.current_thread() is not self.thread:
            raise SimulationError(
                f"a simulated cluster runs in the thread that started it"
                f" ({self.thread.name}), but {threading.current_thread().name} called into"
                " it: the simulator cannot time what a thread of its own does; make the"
                " calls from that thread, as concurrent work of a client with"
                " cluster.run_as(client, fn, *args), or use a real cluster")

    def spawn(self, fn, role) -> None:
        """Run ``fn()`` as work of ``role`` that may wait (what a real client runs on a thread
        of its own): a greenlet, started by a handler of the role; while it waits on a future
        it is parked and the simulation goes on, and it resumes in a handler of the role once
        the future settles (or its timeout passes)."""
        def run():
            try:
                fn()
            finally:
                self._spawned.pop(glet, None)

        glet = greenlet.greenlet(run)
        self._spawned[glet] = role
        role.call_soon(glet.switch)

    def run_as(self, client, fn, *args) -> DrivenFuture:
        """Run ``fn(*args)`` as work of ``client``'s own process, concurrently with the caller
        and with other such work (what a script would run on a thread or a process of its
        own: one client per thread, or several clients sharing the cluster). It runs on the
        client's role, so its CPU is that client's, and each wait of it lets the rest go on.
        Returns a future of what ``fn`` returns (or raises)."""
        if getattr(client.session, "sim", None) is not self:
            raise ValueError(f"run_as: {client!r} is not a client of this simulated cluster"
                             f" ({self.address})")
        self.check_thread()
        done = self.future()

        def work():
            try:
                result = fn(*args)
            except BaseException as exc:  # the caller's result() raises it
                done.set_exception(exc)
            else:
                done.set_result(result)

        self.user.catch_up()  # the work starts at the caller's time
        self.spawn(work, client.session.loop)
        return done

    def _park(self, glet, fut, timeout) -> None:
        """A spawned greenlet waits for ``fut``: back to the simulation until it settles."""
        loop, role, woken = self.net.loop, self._spawned[glet], []

        def wake(*_):
            if not woken:
                woken.append(True)
                role.call_soon(glet.switch)

        fut.add_done_callback(lambda _f: loop.call_soon_threadsafe(wake))
        timer = loop.call_later(timeout, wake) if timeout is not None else None
        glet.parent.switch()
        if timer is not None:
            timer.cancel()

    def _drive(self, fut, timeout) -> None:
        if fut.done():
            return
        self.check_thread()
        glet = greenlet.getcurrent()
        if glet in self._spawned:
            self._park(glet, fut, timeout)
            return
        self.user.catch_up()
        self.plaque.drive(fut, timeout)
        self.user.resumed()

    def _run_to(self, t: float) -> None:
        loop = self.net.loop
        if t <= loop.time() or loop.is_closed():
            return
        waiter = loop.create_future()
        loop.call_at(t, lambda: waiter.done() or waiter.set_result(None))
        self.plaque.run_until(waiter, None)

    def run_for(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass (the caller waits meanwhile: its CPU counts
        from the end); in work started by ``run_as``, that work sleeps."""
        glet = greenlet.getcurrent()
        if glet in self._spawned:
            slept = self.future()
            self._spawned[glet].call_later(  # from the end of its CPU so far
                seconds, lambda: slept.done() or slept.set_result(None))
            self._park(glet, slept, None)
            return
        self._run_to(self.clock() + seconds)
        self.user.resumed()

    def wall(self) -> float:
        return time.perf_counter() - self._started

    def summary(self) -> str:
        """Virtual time against real time, and the CPU charged to each role."""
        busiest = sorted(self.roles.values(), key=lambda r: -r.cpu_used)[:4]
        roles = ", ".join(f"{r.name} {r.cpu_used:.3f} s" for r in busiest)
        return (f"simulated {self.clock():.3f} virtual s in {self.wall():.2f} real s; CPU"
                f" charged: user {self.user.used:.3f} s, {roles}")

    def close(self) -> None:
        """Stop every role; the simulation's loop closes."""
        if self.closed:
            return
        self.closed = True
        _RUNNING.pop(self.address, None)
        self._stop_spawned()
        self.coordinator.close()

    def _stop_spawned(self) -> None:
        """Work of ``spawn``/``run_as`` still waiting fails now, with a clear error, in the
        caller's thread: a greenlet left parked would be killed by the garbage collector
        later, running its code inside whatever simulation runs then."""
        me = greenlet.getcurrent()
        for glet in list(self._spawned):
            if glet is me or glet.dead:
                continue
            try:
                glet.throw(SimulationError(f"the simulated cluster {self.address} closed while"
                                           " this work waited"))
            except Exception:  # it did not catch it: it ended with it, as it should
                pass
