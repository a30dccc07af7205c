"""The clock a host reads: one object handed to everything in ``pathways.host`` that needs the
time, so a host can run on fake (or simulated) time as well as on the real one.

``Clock()`` is real time: ``time.perf_counter`` seconds (``CLOCK_MONOTONIC`` on Linux, the
clock the executor's timerfd alarm is armed in), and waits happen on file descriptors (the
executor's ``select``, the event loop). A fake clock gives a ``sleep(seconds)`` that moves its
time: the executor then calls it for every timed wait instead of waiting for real.

Kernel time limits are the exception: they interrupt a body running on a real thread, so they
are always real time (``pathways.host.watchdog``).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable

__all__ = ["Clock", "MONOTONIC"]


class Clock:
    """``time()``: now, in seconds; ``sleep``: None for real time, else the fake clock's
    ``sleep(seconds)`` (``real`` says which)."""

    __slots__ = ("time", "sleep")

    def __init__(self, time: Callable[[], float] = _time.perf_counter,
                 sleep: Callable[[float], object] | None = None):
        self.time, self.sleep = time, sleep

    @property
    def real(self) -> bool:
        return self.sleep is None

    def __repr__(self) -> str:
        return "Clock(monotonic)" if self.time is _time.perf_counter else f"Clock({self.time!r})"


MONOTONIC = Clock()  # real time: the default everywhere
