"""Each role of a simulated cluster its own virtual CPU, on one shared ``VirtualTimeLoop``.

A ``RoleLoop`` is one role's (the coordinator's, a worker's) view of the shared loop. The
role's code schedules on it as on any asyncio loop (``call_soon``, ``call_later``,
``call_at``, ``call_soon_threadsafe``); everything else (``time``, ``create_future``,
``run_until_complete``...) is the shared loop's. Each callback is one *handler* of the role:
it becomes ready at its time (a message's arrival, a timer's deadline) and starts at
max(ready, the role's CPU free), in (ready, submission) order, one at a time. The role's CPU is
then busy for the handler's cost: the thread CPU time it used (``cpu="measured"``), a fixed
``cost`` (``"fixed"``, for bit-for-bit replay) or nothing (``None``). So a busy coordinator
delays only its own later work, as on a cluster where each process has its own core.

The shared clock never moves for a handler: while it runs, ``time()`` is its start, and other
roles' events between its start and its end still run at their own times. What it schedules
counts from its *end* (start + cost, known only afterwards): ``call_soon`` is ready at the end,
``call_later(d)`` at end + d, and work handed to ``at_end`` (a ``SimTransport``'s sends) runs
then with the end time, so a message leaves when the handler is done: a reply never arrives
before the work that produced it, though the cost is known only afterwards.

The roles are asyncio code on one ``VirtualTimeLoop``: a per-role run queue with one loop
timer (armed at max(head's ready time, CPU free)) gives each role its CPU without a second
event order, and the loop's own timers, futures and waits keep working unchanged.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from time import perf_counter
from typing import NamedTuple

from .collector import Collector
from .cputime import thread_cpu

__all__ = ["RoleLoop", "Span", "CPU_MODES"]

log = logging.getLogger("pathways.sim.roles")
CPU_MODES = (None, "measured", "fixed")
SAMPLE_EVERY = 20e-6  # wall seconds ``now`` goes on the wall clock between meter readings


class Span(NamedTuple):
    """One handler of a role: when it was ready, when it started and ended (virtual s)."""

    ready: float
    start: float
    end: float
    name: str


class RoleHandle:
    """A scheduled handler of a role; ``cancel()`` keeps it from running."""

    __slots__ = ("fn", "args", "cancelled")

    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args, self.cancelled = fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class RoleLoop:
    """Role ``name``'s virtual CPU on the shared ``loop`` (see the module's text).

    ``cpu``: ``None`` (handlers take no time), ``"measured"`` (``meter`` seconds: by default
    thread CPU time less garbage collections, ``pathways.sim.cputime``) or ``"fixed"``
    (``cost`` seconds each; settable later). ``busy_until``: when the CPU is next free;
    ``cpu_used``: total charged; ``spans``: every handler's ``Span`` when ``record``.
    ``collector``: the simulation's ``Collector``, told of each handler that ran (garbage
    collection at fixed points of the run, ``pathways.sim.collector``).
    """

    def __init__(self, loop, name: str, cpu: str | None = None, cost: float = 0.0, *,
                 meter: Callable[[], float] = thread_cpu, record: bool = False,
                 collector: Collector | None = None):
        if cpu not in CPU_MODES:
            raise ValueError(f"cpu must be one of {CPU_MODES}, not {cpu!r}")
        if not cost >= 0:
            raise ValueError(f"a handler's cost must be >= 0, not {cost!r}")
        self.loop, self.name, self.cpu, self.cost = loop, name, cpu, cost
        self.collector = collector
        self.busy_until = loop.time()
        self.cpu_used = 0.0
        self.handled = 0
        self.spans: list[Span] | None = [] if record else None
        self._meter = meter
        self._queue: list[tuple[float, int, RoleHandle]] = []
        self._order = itertools.count()
        self._timer = None  # the shared loop's timer that runs our next handler
        self._outbox: list[tuple[str, float, object]] | None = None  # while a handler runs
        self._begin = 0.0  # the meter's reading when the running handler began
        self._reads = 0  # times the running handler read the meter through ``now``
        self._used_mark = 0.0  # the CPU it had used at that last reading
        self._wall_mark = 0.0  # perf_counter() then
        self._shown = 0.0  # the most CPU ``now`` has shown it (``now`` never goes back)
        self._read_cost = read_cost(meter) if cpu == "measured" else 0.0

    def time(self) -> float:
        """The shared virtual clock (inside a handler: its start)."""
        return self.loop.time()

    def now(self) -> float:
        """The role's own time: inside a handler, its start plus the CPU it has used so far
        (measured: what a clock on the role's own core would read); else ``time()``. A
        simulated host's clock reads this, so a kernel body's compute counts as a real
        host's does.

        The CPU meter is a system call (~0.8 us, 8x a real host's clock), and a busy host
        reads its clock thousands of times a step; so within ``SAMPLE_EVERY`` seconds of
        its last reading, the used CPU is that reading plus the wall time since (a gap that
        short was spent on the CPU; a longer one, a preemption, is read from the meter),
        never going back."""
        if self._outbox is None or self.cpu != "measured":
            return self.loop.time()
        wall = perf_counter()
        if wall - self._wall_mark > SAMPLE_EVERY:
            self._reads += 1  # what reading the meter costs is the simulator's, not the role's
            self._used_mark = self._meter() - self._begin - self._reads * self._read_cost
            self._wall_mark = wall
            used = self._used_mark
        else:
            used = self._used_mark + (wall - self._wall_mark)
        if used > self._shown:
            self._shown = used
        return self.loop.time() + self._shown

    def run_in_executor(self, executor, fn: Callable, *args):
        """A role has no threads: ``fn(*args)`` runs as a handler of its own, on the role's
        CPU, and the returned (asyncio) future settles when that handler ends."""
        fut = self.loop.create_future()

        def job():
            try:
                result = fn(*args)
            except BaseException as exc:  # the caller gets it, as from a thread
                error = exc
                self.at_end(lambda _end: fut.cancelled() or fut.set_exception(error))
            else:
                self.at_end(lambda _end: fut.cancelled() or fut.set_result(result))

        self.call_soon(job)
        return fut

    # ---- the asyncio scheduling calls the role's code makes -----------------------------------
    def call_soon(self, fn: Callable, *args, context=None) -> RoleHandle:
        return self._submit("later", 0.0, fn, args)

    def call_later(self, delay: float, fn: Callable, *args, context=None) -> RoleHandle:
        return self._submit("later", max(delay, 0.0), fn, args)

    def call_at(self, when: float, fn: Callable, *args, context=None) -> RoleHandle:
        return self._submit("at", when, fn, args)

    def call_soon_threadsafe(self, fn: Callable, *args, context=None) -> RoleHandle:
        """Any thread: the handler is queued from the loop's thread, ready when it gets there."""
        handle = RoleHandle(fn, args)
        self.loop.call_soon_threadsafe(self._push, self.loop.time, handle)
        return handle

    def freeze(self, seconds: float) -> None:
        """The role's process stops for ``seconds`` from now (a SIGSTOP, a swap storm): its
        CPU is busy, so its handlers, ticks and heartbeats wait; messages keep arriving."""
        if not seconds >= 0:
            raise ValueError(f"a freeze lasts >= 0 seconds, not {seconds!r}")
        self.busy_until = max(self.busy_until, self.loop.time()) + seconds
        self._arm()

    @property
    def in_handler(self) -> bool:
        """True while one of this role's handlers runs."""
        return self._outbox is not None

    def at_end(self, fn: Callable[[float], None]) -> None:
        """Run ``fn(end)`` when the running handler ends (now, with the current time, when
        none runs): how a send leaves at the handler's end."""
        if self._outbox is None:
            fn(self.loop.time())
        else:
            self._outbox.append(("end", 0.0, fn))

    def __getattr__(self, attr):  # everything else is the shared loop's
        return getattr(self.loop, attr)

    def __repr__(self) -> str:
        return f"RoleLoop({self.name!r}, cpu={self.cpu!r}, busy_until={self.busy_until!r})"

    # ---- the run queue ------------------------------------------------------------------------
    def _submit(self, kind: str, when: float, fn: Callable, args: tuple) -> RoleHandle:
        handle = RoleHandle(fn, args)
        if self._outbox is not None:  # inside a handler: counts from its end
            self._outbox.append((kind, when, handle))
        else:
            self._push(self.loop.time() + when if kind == "later" else when, handle)
        return handle

    def _push(self, ready, handle: RoleHandle) -> None:
        if callable(ready):  # call_soon_threadsafe: ready when the loop's thread gets here
            ready = ready()
        heapq.heappush(self._queue, (ready, next(self._order), handle))
        self._arm()

    def _arm(self) -> None:
        while self._queue and self._queue[0][2].cancelled:
            heapq.heappop(self._queue)
        if not self._queue:
            return
        at = max(self._queue[0][0], self.busy_until)
        if self._timer is not None:
            if self._timer.when() == at:
                return
            self._timer.cancel()
        self._timer = self.loop.call_at(at, self._wake)

    def _wake(self) -> None:
        self._timer = None
        now = self.loop.time()
        while self._queue and self._queue[0][2].cancelled:
            heapq.heappop(self._queue)
        if self._queue and self._queue[0][0] <= now and self.busy_until <= now:
            ready, _, handle = heapq.heappop(self._queue)
            self._run(ready, now, handle)
        self._arm()

    def _run(self, ready: float, start: float, handle: RoleHandle) -> None:
        outbox: list = []
        self._outbox = outbox
        self._reads = 0
        self._used_mark = self._shown = 0.0
        begin = self._begin = self._meter() if self.cpu == "measured" else 0.0
        self._wall_mark = perf_counter()
        try:
            handle.fn(*handle.args)
        except Exception as exc:  # as asyncio does for a callback: report, go on
            self.loop.call_exception_handler({
                "message": f"exception in a handler of role {self.name}",
                "exception": exc, "handle": handle})
        finally:  # a handler that raised still used its CPU and sent what it sent
            used = self._charge(begin)
            end = start + used
            self._outbox = None
            self.busy_until, self.cpu_used = end, self.cpu_used + used
            self.handled += 1
            if self.spans is not None:
                self.spans.append(Span(ready, start, end, _name(handle.fn)))
            for kind, when, item in outbox:
                if kind == "end":
                    item(end)
                else:
                    self._push(end + when if kind == "later" else when, item)
            if self.collector is not None:  # between handlers: what it frees is queued
                self.collector.handled()

    def _charge(self, begin: float) -> float:
        if self.cpu == "measured":  # never less than a time ``now`` showed
            return max(self._meter() - begin - self._reads * self._read_cost, self._shown)
        return self.cost if self.cpu == "fixed" else 0.0


_READ_COSTS: dict = {}  # meter -> CPU seconds one reading of it takes


def read_cost(meter: Callable[[], float]) -> float:
    """CPU seconds one call of ``meter`` takes (the least of a few batches, measured once per
    meter): ``now`` reads the meter many times a kernel, a cost of the simulator's own."""
    cost = _READ_COSTS.get(meter)
    if cost is None:
        batches = []
        for _ in range(5):
            t0 = meter()
            for _ in range(200):
                meter()
            batches.append((meter() - t0) / 201)
        cost = _READ_COSTS[meter] = max(min(batches), 0.0)
    return cost


def _name(fn: Callable) -> str:
    """A name stable across runs (never a repr, which holds an address)."""
    fn = getattr(fn, "func", fn)
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
