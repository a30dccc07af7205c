"""A client's session with a simulated cluster: the real ``Session`` on a role of the simulation.

Everything the client does with the cluster (requests, sends, pings, replies) is the real
``pathways.client.session.Session``; only its I/O differs. Its loop is the role
``client-<n>`` of the simulation (no thread), its socket a ``SimSocket``, its futures
``DrivenFuture``s: waiting on one (``result()``, ``block_until_ready()``) runs the simulation in
the caller's thread until it settles. Blocking work the client hands off (a checkpoint's commit)
runs at once, on the caller's thread; what it would run on a thread of its own (a suspension the
coordinator asks for) runs on the client's role as a greenlet that parks while it waits.

The user's thread is the client's CPU (``UserCpu``): whenever the script calls into the
cluster or waits, the thread CPU it used since it last did is charged (``cpu="measured"``; a
fixed ``cost`` per call with ``"fixed"``; nothing with ``None``), and the simulation runs up to
that virtual time first, so each call reaches the cluster at the time it would have.
"""

from __future__ import annotations

import concurrent.futures as cf
import random
from collections.abc import Callable

from .. import protocol
from ..client.session import Session
from ..sim.cputime import collecting, thread_cpu
from ..sim.roles import CPU_MODES
from .sockets import COORDINATOR, SimSocket

__all__ = ["InlineExecutor", "SimSession", "UserCpu"]



class UserCpu:
    """The user's thread as the client's CPU on ``loop`` (the simulation's ``VirtualTimeLoop``).

    ``catch_up()`` (at every call into the cluster): charge what the thread used since the last
    mark and run the simulation up to the user's time; ``resumed()`` (after a wait): the user
    goes on at the loop's time. ``run_to(t)`` runs the simulation to virtual time ``t``.
    """

    def __init__(self, loop, run_to: Callable[[float], None], cpu: str | None = "measured",
                 cost: float = 0.0, meter: Callable[[], float] = thread_cpu):
        if cpu not in CPU_MODES:
            raise ValueError(f"cpu must be one of {CPU_MODES}, not {cpu!r}")
        self.loop, self.run_to, self.cpu, self.cost, self.meter = loop, run_to, cpu, cost, meter
        self.time = loop.time()
        self.used = 0.0  # CPU charged to the user's thread in all
        self._mark = meter()

    def catch_up(self) -> float:
        """Charge the user's CPU so far; the cluster runs up to the user's time (returned)."""
        if self.loop.is_running() or self.loop.is_closed():
            return self.loop.time()  # a handler of the simulation, not the user's thread
        if self.cpu == "measured":
            used = max(self.meter() - self._mark, 0.0)
        else:
            used = self.cost if self.cpu == "fixed" else 0.0
        self.used += used
        self.time = max(self.time, self.loop.time()) + used
        self.run_to(self.time)
        self._mark = self.meter()
        return self.time

    def resumed(self) -> None:
        """A wait is over: the user goes on at the time it ended, its CPU counted from now."""
        self.time = max(self.time, self.loop.time())
        self._mark = self.meter()


class InlineExecutor(cf.Executor):
    """Runs what is submitted at once, on the caller's thread (a simulation has no others)."""

    def submit(self, fn, /, *args, **kwargs) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut


class SimSession(Session):
    """``Session`` over a simulated cluster ``sim`` (a ``pathways.simulated.cluster.SimCluster``):
    the same calls, on the role ``client-<n>`` (see the module's text)."""

    def __init__(self, sim, address, keys, coordinator_timeout, for_client, on_message,
                 on_lost):
        self.sim = sim
        super().__init__(address, keys, coordinator_timeout, for_client, on_message, on_lost)

    def open_io(self) -> None:
        self.ctx = None
        name = f"client-{next(self.sim.clients)}"
        self.contact.monitored = False  # no connection to watch: an unanswered hello times out
        self.loop = self.sim.plaque.new_role(name)
        self.socket = SimSocket(self.sim.net, self.loop, name, self._arrived)
        self._tokens = random.Random(f"{self.sim.seed}/{name}")

    def token(self) -> str:
        """Drawn from the cluster's seed: a run names its files as its replay does."""
        return f"{self._tokens.getrandbits(48):012x}"

    def future(self, what: str | None = None) -> cf.Future:
        return self.sim.future(what)

    def on_loop_thread(self) -> bool:
        """Inside the simulation (a role's handler), where driving it again must not
        happen."""
        return self.sim.net.loop.is_running()

    def blocking_executor(self) -> cf.Executor:
        return InlineExecutor()

    def clock(self) -> float:
        """Virtual time where the user's thread is: its CPU since its last call is charged
        and the simulation caught up to it first."""
        self.sim.check_thread()
        if self.sim.net.loop.is_running():  # work of the client's role (``run_as``)
            return self.loop.now()
        return self.sim.user.catch_up()

    def spawn(self, fn, name: str) -> None:
        """No thread: ``fn`` runs on this session's role as a greenlet, parked while it
        waits (``SimCluster.spawn``)."""
        self.sim.spawn(fn, self.loop)

    def call(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the session's role, after what the user queued before it."""
        self.sim.check_thread()
        self.check_open()
        self.loop.call_soon(fn, *args)

    def send(self, address, payload) -> None:
        self.sim.check_thread()
        if not collecting():  # a __del__ the garbage collector runs only queues its send
            self.sim.user.catch_up()
        super().send(address, payload)

    def transmit(self, address, payload) -> None:
        # the cluster's address (sim://N) is its coordinator's port on the net
        self.socket.send(COORDINATOR if address == self.address else address,
                         protocol.pack(payload))

    def _arrived(self, sender: str, frames) -> None:
        self.received(frames, from_coordinator=sender == COORDINATOR)

    def close(self, err: Exception) -> None:
        """Stop: what is in flight fails with ``err``; queued sends still leave first."""
        self.closed = True
        if self.sim.closed:
            self.fail_all(err)
            return
        done = self.sim.future()

        def stop():
            self.fail_all(err)
            self.loop.at_end(lambda _end: self.socket.close())
            done.set_result(None)

        self.loop.call_soon(stop)
        done.result()
