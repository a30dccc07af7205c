"""A file descriptor that becomes readable at a given ``time.perf_counter()`` instant.

Event loops (uvloop, asyncio's selectors) time their callbacks in whole milliseconds, too
coarse for emulated kernels of a tenth of a millisecond. On Linux a ``timerfd`` armed at an
absolute ``CLOCK_MONOTONIC`` time (the clock behind ``time.perf_counter``) wakes the loop's
poll with the kernel's timer precision; it is reached through ``ctypes`` (Python 3.11 has no
``os.timerfd_create``). ``Alarm.make()`` returns None where that is unavailable, and callers
fall back to the loop's own timers.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    """C ``struct timespec``."""

    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    """C ``struct itimerspec``: an interval and a first expiry."""

    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Alarm:
    """A timerfd: ``set(when)`` arms it for perf_counter time ``when``; ``clear()`` after it
    fired; ``close()`` when done."""

    def __init__(self, libc, fd: int):
        self._libc, self.fd = libc, fd
        self._spec = _Itimerspec()
        self.armed: float | None = None

    @classmethod
    def make(cls) -> Alarm | None:
        if not sys.platform.startswith("linux"):
            return None
        info = time.get_clock_info("perf_counter")
        if "CLOCK_MONOTONIC" not in info.implementation:
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (OSError, AttributeError):
            return None
        return cls(libc, fd) if fd >= 0 else None

    def set(self, when: float) -> None:
        """Become readable once ``time.perf_counter()`` reaches ``when`` (re-arms)."""
        if when == self.armed:
            return
        when = max(when, 1e-9)  # an all-zero time would disarm the timer
        value = self._spec.it_value
        value.tv_sec = int(when)
        value.tv_nsec = int((when - int(when)) * 1e9)
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec),
                                      None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.armed = when

    def clear(self) -> None:
        """Consume an expiry (the fd is readable until read)."""
        self.armed = None
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)
