"""The discrete-event scheduler of the simulated cluster: virtual time, virtual CPUs, one order.

Everything in a simulation is an event on one heap, ordered by (virtual time, arrival time,
sequence number) -- never by hash or id -- so the seed decides the whole run. Two kinds:

- an *actor* event is a message to a role (client session, coordinator, a host) that owns a
  virtual CPU. It runs at max(its arrival, the actor's CPU free time). If the CPU is still busy
  when the event comes up, the event goes back on the heap at the free time (keeping its
  arrival, so an actor handles its messages in arrival order): handlers of all actors run in
  global start-time order, and none sees state another actor wrote "later". The CPU is then busy
  for the handler's cost: its modelled cost if it has one (per post, else the actor's default,
  else the scheduler's ``default_cost``), or else the CPU time it really used (``cpu_meter``,
  thread CPU time by default). Modelled costs never read the meter: a run replays bit for bit.
- a *timer* (``call_at``, ``call_later``) belongs to no CPU: device timelines, link deliveries.

While a handler runs, ``now`` is its start time. What it schedules *relative* to now (``send``,
``transmit``, ``call_later``) counts from its *end* (start + charged cost): a message leaves
when the handler is done. That is the simplest rule that keeps causality when the cost is only
known afterwards -- a reply never arrives before the work that produced it. Absolute times
(``deliver``/``Actor.post``, ``call_at``) are taken as given and must not lie in the past.

Worked example (modelled costs): actor A gets m1 at t=0 (cost 2) and m2 at t=1 (cost 1). m1
runs 0..2; m2 comes up at 1, finds A busy, goes back on the heap at 2 and runs 2..3. A message
m1 sent to B with delay 0.5 arrives at 2 + 0.5 = 2.5.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from ..errors import PathwaysError

__all__ = ["Actor", "CausalityError", "Handle", "Scheduler", "SchedulerError", "TraceEntry"]

Route = Callable[[float], "float | None"]  # departure time -> arrival time, or None: dropped


class SchedulerError(PathwaysError):
    """The scheduler was used in a way it cannot honour (a run from inside a handler...)."""


class CausalityError(SchedulerError):
    """An event was scheduled in the virtual past, or would run before its time."""


class TraceEntry(NamedTuple):
    """One event that ran: its start time, its actor's name ("-" for a timer), its handler."""

    time: float
    actor: str
    name: str


class Handle:
    """One scheduled event. ``cancel()`` keeps it from running (a no-op once it ran);
    ``dropped`` says the network lost it; ``arrival`` is its time once it is on the heap."""

    __slots__ = ("fn", "args", "actor", "cost", "name", "arrival", "seq", "cancelled",
                 "dropped")

    def __init__(self, fn: Callable, args: tuple, actor: Actor | None, cost: float | None,
                 name: str | None):
        self.fn, self.args, self.actor, self.cost = fn, args, actor, cost
        self.name = name or _handler_name(fn)
        self.arrival: float | None = None
        self.seq = -1
        self.cancelled = self.dropped = False

    def cancel(self) -> None:
        self.cancelled = True


class Actor:
    """A role with a virtual CPU: ``busy_until`` (when its CPU is next free), ``cpu`` (total
    charged), ``handled`` (handlers run). ``cost``: modelled cost of each of its handlers
    (None: measured)."""

    def __init__(self, scheduler: Scheduler, name: str, cost: float | None):
        self.scheduler, self.name, self.cost = scheduler, name, cost
        self.busy_until = 0.0
        self.cpu = 0.0
        self.handled = 0

    def post(self, at: float, fn: Callable, *args, cost: float | None = None,
             name: str | None = None) -> Handle:
        """Deliver ``fn(*args)`` to this actor at virtual time ``at``."""
        return self.scheduler.deliver(self, at, fn, *args, cost=cost, name=name)

    def __repr__(self) -> str:
        return f"Actor({self.name!r}, busy_until={self.busy_until!r})"


class Scheduler:
    """One simulation's clock, event heap, actors and seeded random source (``random``).
    ``cpu_meter`` reads the CPU seconds a measured handler uses; ``default_cost`` models every
    handler without a cost of its own; ``trace`` keeps the last ``trace_limit`` events."""

    def __init__(self, seed: int = 0, *, cpu_meter: Callable[[], float] = time.thread_time,
                 default_cost: float | None = None, trace_limit: int = 10_000):
        self.seed = seed
        self.random = random.Random(seed)
        self.default_cost = default_cost
        self.events_run = 0
        self.trace: deque[TraceEntry] = deque(maxlen=trace_limit)
        self._meter = cpu_meter
        self._now = 0.0
        self._heap: list[tuple[float, float, int, Handle]] = []
        self._seq = 0
        self._actors: dict[str, Actor] = {}
        self._current: Actor | None = None
        self._outbox: list[tuple[Route, Handle]] | None = None  # sends of the running handler
        self._stepping = False
        self._digest = hashlib.sha256()

    @property
    def now(self) -> float:
        """Virtual seconds; inside a handler, the handler's start time."""
        return self._now

    @property
    def current(self) -> Actor | None:
        """The actor whose handler is running, if any."""
        return self._current

    @property
    def actors(self) -> dict[str, Actor]:
        return dict(self._actors)

    def actor(self, name: str, cost: float | None = None) -> Actor:
        """The actor called ``name``, created on first use with default handler ``cost``."""
        found = self._actors.get(name)
        if found is None:
            found = self._actors[name] = Actor(self, name, cost)
        elif cost is not None and cost != found.cost:
            raise SchedulerError(f"actor {name!r} exists with cost {found.cost!r}, not {cost!r}")
        return found

    # -- scheduling ------------------------------------------------------------------------

    def deliver(self, actor: Actor, at: float, fn: Callable, *args, cost: float | None = None,
                name: str | None = None) -> Handle:
        """Run ``fn(*args)`` on ``actor``'s CPU once virtual time reaches ``at``."""
        handle = Handle(fn, args, actor, cost, name)
        self._push(at, handle)
        return handle

    def call_at(self, at: float, fn: Callable, *args, name: str | None = None) -> Handle:
        """Run ``fn(*args)`` at virtual time ``at`` on no CPU (it takes no virtual time)."""
        handle = Handle(fn, args, None, None, name)
        self._push(at, handle)
        return handle

    def call_later(self, delay: float, fn: Callable, *args, name: str | None = None) -> Handle:
        """A timer ``delay`` after now (after the running handler's end, inside one)."""
        return self.transmit(None, _after(delay), fn, *args, name=name)

    def send(self, dst: Actor, delay: float, fn: Callable, *args, cost: float | None = None,
             name: str | None = None) -> Handle:
        """Deliver ``fn(*args)`` to ``dst`` ``delay`` after the running handler's end (or after
        now, outside a handler)."""
        return self.transmit(dst, _after(delay), fn, *args, cost=cost, name=name)

    def transmit(self, dst: Actor | None, route: Route, fn: Callable, *args,
                 cost: float | None = None, name: str | None = None) -> Handle:
        """Like ``send``, with the arrival chosen by ``route(departure)``: a time no earlier
        than the departure, or None to drop the message (``Handle.dropped``). Inside a handler
        the route is called when the handler ends, in the order of the sends."""
        handle = Handle(fn, args, dst, cost, name)
        if self._outbox is not None:
            self._outbox.append((route, handle))
        else:
            self._depart(route, self._now, handle)
        return handle

    def _depart(self, route: Route, departure: float, handle: Handle) -> None:
        if handle.cancelled:
            return
        at = route(departure)
        if at is None:
            handle.dropped = True
            return
        if at < departure:
            raise CausalityError(f"{handle.name} would arrive at {at!r}, before it left at "
                                 f"{departure!r}")
        self._push(at, handle)

    def _push(self, at: float, handle: Handle) -> None:
        if not at >= self._now:  # also refuses NaN
            raise CausalityError(f"{handle.name} scheduled at {at!r}, before now {self._now!r}")
        handle.arrival, handle.seq = at, self._seq
        self._seq += 1
        heapq.heappush(self._heap, (at, at, handle.seq, handle))

    # -- running ---------------------------------------------------------------------------

    def next_time(self) -> float | None:
        """The time of the next pending event (None when there is none)."""
        while self._heap and self._heap[0][3].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def step(self, limit: float = math.inf) -> bool:
        """Run the next event if it starts no later than ``limit``; False if none did."""
        if self._stepping:
            raise SchedulerError("the scheduler cannot be run from inside one of its events")
        while (at := self.next_time()) is not None and at <= limit:
            _, _, _, handle = heapq.heappop(self._heap)
            actor = handle.actor
            if actor is not None and actor.busy_until > at:  # busy: wait for the CPU
                heapq.heappush(self._heap, (actor.busy_until, handle.arrival, handle.seq, handle))
                continue
            self._run(at, handle)
            return True
        return False

    def run(self, max_events: int | None = None) -> int:
        """Run until no event is left (or ``max_events`` ran); the number that ran."""
        count = 0
        while (max_events is None or count < max_events) and self.step():
            count += 1
        return count

    def run_until(self, until: float | Callable[[], bool], *,
                  deadline: float = math.inf) -> bool:
        """Run up to virtual time ``until`` (then now = ``until``), or until the predicate
        ``until()`` holds: False if the events ran out, or the next starts after ``deadline``,
        first."""
        if not callable(until):
            while self.step(until):
                pass
            self._now = max(self._now, until)
            return True
        while not until():
            if not self.step(deadline):
                return False
        return True

    def _run(self, start: float, handle: Handle) -> None:
        actor = handle.actor
        if start < self._now or start < handle.arrival or (actor and start < actor.busy_until):
            raise CausalityError(f"{handle.name} would run at {start!r}: now {self._now!r}, "
                                 f"arrival {handle.arrival!r}, actor {actor!r}")
        self._now = start
        self.events_run += 1
        entry = TraceEntry(start, actor.name if actor else "-", handle.name)
        self.trace.append(entry)
        self._digest.update(f"{entry.time!r}\t{entry.actor}\t{entry.name}\n".encode())
        self._stepping = True
        try:
            if actor is None:
                handle.fn(*handle.args)
            else:
                self._run_on(actor, start, handle)
        finally:
            self._stepping = False

    def _run_on(self, actor: Actor, start: float, handle: Handle) -> None:
        cost = next((c for c in (handle.cost, actor.cost, self.default_cost) if c is not None),
                    None)
        outbox: list[tuple[Route, Handle]] = []
        self._current, self._outbox = actor, outbox
        begin = self._meter() if cost is None else 0.0
        try:
            handle.fn(*handle.args)
        finally:  # a handler that raised still used its CPU and sent what it sent
            used = cost if cost is not None else max(self._meter() - begin, 0.0)
            self._current, self._outbox = None, None
            end = start + used
            actor.busy_until, actor.cpu, actor.handled = end, actor.cpu + used, actor.handled + 1
            for route, sent in outbox:
                self._depart(route, end, sent)

    def trace_digest(self) -> str:
        """A hash of (time, actor, handler name) of every event run so far (not only those
        the bounded ``trace`` keeps): equal digests, same run."""
        return self._digest.copy().hexdigest()


def _after(delay: float) -> Route:
    if not delay >= 0:
        raise CausalityError(f"a negative delay: {delay!r}")
    return lambda departure: departure + delay


def _handler_name(fn: Callable) -> str:
    """A name stable across runs (never a repr, which holds an address)."""
    fn = getattr(fn, "func", fn)  # functools.partial
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
