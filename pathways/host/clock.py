"""The clock a host reads: one object handed to everything in ``pathways.host`` that needs the
time, so a host can run on fake (or simulated) time as well as on the real one.

``Clock()`` is real time: ``time.perf_counter`` seconds (``CLOCK_MONOTONIC`` on Linux, the
clock the executor's timerfd alarm is armed in), and waits happen on file descriptors (the
executor's ``select``, the event loop). A fake clock gives a ``sleep(seconds)`` that moves its
time: the executor then calls it for every timed wait instead of waiting for real. A clock
``on_loop`` is the host's event loop's own (a simulated cluster's virtual time,
``pathways.sim``): timed waits are that loop's timers (``call_at``), and the loop moves the time.

Kernel time limits are the exception: they interrupt a body running on a real thread, so they
are real time, or on a loop's clock the CPU seconds the body uses (``pathways.host.watchdog``).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable

__all__ = ["Clock", "MONOTONIC"]


class Clock:
    """``time()``: now, in seconds; ``sleep``: None for real time, else the fake clock's
    ``sleep(seconds)``; ``on_loop``: the time is the event loop's, waited for with its timers
    (``real`` says whether it is none of these: real time)."""

    __slots__ = ("time", "sleep", "on_loop")

    def __init__(self, time: Callable[[], float] = _time.perf_counter,
                 sleep: Callable[[float], object] | None = None, *, on_loop: bool = False):
        if sleep is not None and on_loop:
            raise ValueError("a clock either sleeps (fake time) or is its loop's, not both")
        self.time, self.sleep, self.on_loop = time, sleep, on_loop

    @property
    def real(self) -> bool:
        return self.sleep is None and not self.on_loop

    def __repr__(self) -> str:
        return "Clock(monotonic)" if self.time is _time.perf_counter else f"Clock({self.time!r})"


MONOTONIC = Clock()  # real time: the default everywhere
