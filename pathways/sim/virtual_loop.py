"""An asyncio event loop on a virtual clock that jumps to the next timer instead of sleeping.

The production roles (Plaque endpoints, the coordinator adapter, hosts, the client session) are
asyncio code; in a simulated cluster they run unchanged on this loop. ``loop.time()`` reads a
virtual clock, so ``call_later``, ``asyncio.sleep``, ``wait_for`` and ``asyncio.timeout`` all
count virtual seconds, and an hour of idle waiting costs no real time.

How: the loop is a stock ``SelectorEventLoop`` whose selector is wrapped. asyncio's iteration
computes how long it may block (0 when callbacks are ready, the gap to the earliest timer,
``None`` when there are neither) and calls ``selector.select(timeout)``. The wrapper polls the
real fds without blocking; when nothing is ready it moves the virtual clock
to the earliest timer's exact deadline and returns, so the timer fires on the next pass. Only
``time()`` and the selector (a constructor argument) are replaced: the scheduling, ordering and
cancellation semantics are asyncio's own, and this is more robust than a custom loop or an
override of the private ``_run_once``. (The one private read is ``_scheduled``, to land exactly
on a deadline rather than on ``now + (deadline - now)`` rounded; without it, that sum is used.)

I/O is instantaneous in virtual time: fds (socket pairs, ZeroMQ inproc, the self-pipe behind
``call_soon_threadsafe``) are polled with timeout 0 and never hold the clock back, so bytes a
real thread writes later may arrive after the clock has jumped past pending timers. In a
simulation, threads and real transports are replaced by scheduled work; this loop only promises
that same-thread I/O is seen. When nothing can ever happen (no ready callbacks, no timers) the
loop waits for real on its fds for up to ``stall_timeout`` seconds (another thread may still
call ``call_soon_threadsafe``), then raises ``SimulationStalled`` naming the pending tasks.

CPU charging: ``advance(dt)`` moves the clock by ``dt`` (a role charging its CPU:
``pathways.sim.roles``).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "SimulationStalled", "run"]

T = TypeVar("T")


class SimulationStalled(RuntimeError):
    """The virtual-time loop has no ready callbacks, no timers and no I/O: nothing can ever
    resume the pending tasks (e.g. a future nobody resolves)."""


class _VirtualSelector(selectors.BaseSelector):
    """Delegates registration to a real selector; ``select`` never blocks while a timer is
    pending, it advances the owning loop's virtual clock instead."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualTimeLoop | None = None  # set by the loop once it exists

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout=None):
        if self.loop is None:  # only during the base class's construction
            return self._real.select(0)
        return self.loop._idle(self._real, timeout)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A ``SelectorEventLoop`` whose ``time()`` is virtual seconds from ``start``; when no
    callback and no I/O is ready it jumps to the earliest timer without sleeping.

    ``stall_timeout``: real seconds to wait on fds when nothing is scheduled before raising
    ``SimulationStalled`` (0: raise at once; ``None``: block like a real loop).
    """

    def __init__(
        self,
        start: float = 0.0,
        *,
        stall_timeout: float | None = 10.0,
    ) -> None:
        if stall_timeout is not None and stall_timeout < 0:
            raise ValueError(f"stall_timeout must be >= 0 or None, got {stall_timeout}")
        self._now = float(start)
        self._start = float(start)
        self.stall_timeout = stall_timeout
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        """Virtual seconds (the clock every timer of this loop uses)."""
        return self._now

    @property
    def virtual_elapsed(self) -> float:
        """Virtual seconds since the loop's start time."""
        return self._now - self._start

    def advance(self, dt: float) -> None:
        """Move the clock forward by ``dt`` >= 0 virtual seconds (CPU charged to this role);
        timers that fall due meanwhile fire late, on the next iteration, as on a busy CPU."""
        if not dt >= 0:
            raise ValueError(f"cannot move virtual time by {dt!r}")
        self._now += dt

    def _idle(self, real: selectors.BaseSelector, timeout: float | None):
        """The selector's ``select``: poll fds without blocking, else jump or detect a stall."""
        computed_at = self._now  # asyncio computed ``timeout`` from this reading
        events = real.select(0)
        if not events and timeout is None:
            events = self._wait_or_stall(real)
        elif not events and timeout > 0:
            self._jump(computed_at + timeout)
        return events

    def _jump(self, target: float) -> None:
        """Move to the earliest deadline. asyncio passes a positive timeout only when nothing
        is ready and that timer is not yet due, so no event lies in between; reading it (not
        ``now + timeout``) lands exactly, and past asyncio's one-day cap on a single select."""
        scheduled = getattr(self, "_scheduled", None)
        if scheduled:
            target = scheduled[0].when()
        self._now = max(self._now, target)

    def _wait_or_stall(self, real: selectors.BaseSelector):
        events = real.select(self.stall_timeout)
        if events:
            return events
        pending = [t for t in asyncio.all_tasks(self) if not t.done()]
        names = ", ".join(sorted(t.get_name() for t in pending)[:8]) or "none"
        raise SimulationStalled(
            f"simulation stalled at virtual t={self._now:.6f}s: no ready callbacks, no "
            f"timers, and no I/O for {self.stall_timeout}s of real time; "
            f"{len(pending)} pending task(s): {names}"
        )


def run(
    coro: Coroutine[Any, Any, T],
    start: float = 0.0,
    *,
    stall_timeout: float | None = 10.0,
) -> T:
    """Like ``asyncio.run``, on a fresh ``VirtualTimeLoop`` starting at virtual ``start``:
    run ``coro`` to completion, then cancel what is left, finish async generators and close."""
    loop = VirtualTimeLoop(start, stall_timeout=stall_timeout)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            _cancel_leftovers(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        except SimulationStalled:
            pass  # a task that cannot finish its cancellation: nothing more to wait for
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_leftovers(loop: VirtualTimeLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
