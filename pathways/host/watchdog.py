"""Kernel time limits: interrupt a body that runs longer than its limit on the host's thread.

A host runs every body on its executor's thread, so a body that never returns would hold its
device -- and, with one thread per host, the whole host -- forever. The executor tells the
watchdog whenever a body is on the thread (``watch``: from the switch into the body's greenlet
until it parks or ends; ``unwatch``). A thread of the watchdog's own looks every
``POLL`` seconds and, if a body is still on the thread past its deadline, raises
``KernelTimeout`` in it: through a signal when the executor runs on the main thread (which
also breaks a ``time.sleep`` or a blocking wait), else with ``PyThreadState_SetAsyncExc``
(delivered at the body's next Python instruction: a body blocked inside one long C call is
interrupted when that call returns).

The exception may land in the executor's own code right around a switch; ``unwatch`` takes it
there and cancels one still pending, and the executor treats such a stray as the body's
timeout. A parked body (waiting in a collective) is not on the thread: the collective's own
timeout covers it, and if it resumes past its deadline it is interrupted at once.

A simulated cluster runs every host's bodies on its one thread and starts no thread of its
own: there ``timer_watchdog`` gives the process's one ``TimerWatchdog`` instead, whose
CPU-time interval timer (``ITIMER_VIRTUAL``) ticks while bodies run and raises
``KernelTimeout`` from its signal in a body past its deadline (to within ``TICK`` CPU
seconds), a deadline in the thread's CPU seconds (``time.thread_time``): machine load must not
change a simulation's outcome. A body spinning past its limit is stopped; one blocked without
using CPU is not (a simulated body does not wait on anything real).
"""

from __future__ import annotations

import atexit
import ctypes
import signal
import threading
import time

from ..errors import KernelTimeout

__all__ = ["TimerWatchdog", "Watchdog", "timer_watchdog"]

SIGNAL = signal.SIGUSR2
POLL = 0.05  # seconds between the watchdog's looks when no deadline is nearer
TICK = 0.01  # CPU seconds between a TimerWatchdog's looks while bodies run


class Watchdog:
    """Raises ``KernelTimeout`` in the thread ``ident`` when a watched body passes its
    deadline (``time.monotonic`` seconds), to within ``POLL`` seconds.

    ``watch`` is two attribute stores and ``unwatch`` one uncontended lock: they run at every
    switch into a body. The thread polls (every ``POLL`` seconds, or at the deadline if that
    is sooner) rather than being woken at every switch.
    """

    def __init__(self, ident: int, clock=time.monotonic):
        self.ident, self.clock = ident, clock
        self._lock = threading.Lock()  # the thread fires, and unwatch clears, under it
        self._watched = None  # the body on the thread now
        self._deadline = 0.0
        self._fired = None  # the body an interrupt was sent to, until unwatch
        self._stopped = threading.Event()
        self._use_signal = ident == threading.main_thread().ident
        if self._use_signal:
            signal.signal(SIGNAL, self._on_signal)
        self._thread = threading.Thread(target=self._run, name="kernel-watchdog", daemon=True)
        self._thread.start()

    def watch(self, body, deadline: float) -> None:
        """``body`` is on the thread from now until ``unwatch``, with this deadline."""
        self._deadline = deadline
        self._watched = body  # last: the thread reads it first, then the deadline

    def unwatch(self):
        """The watched body left the thread. Returns it if it was interrupted (the
        ``KernelTimeout`` may have landed anywhere since; none is left pending)."""
        fired = None
        while True:
            try:
                with self._lock:
                    self._watched = None
                    fired, self._fired = self._fired or fired, None
                if fired is not None and not self._use_signal:
                    _async_raise(self.ident, None)  # cancel one not yet delivered
                return fired
            except KernelTimeout:
                continue  # it landed here: the body is still the one that timed out

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(2)

    def _nap(self) -> float:
        if self._watched is None:
            return POLL
        return min(max(self._deadline - self.clock(), 0.0), POLL)

    def _run(self) -> None:
        while not self._stopped.wait(self._nap()):
            with self._lock:
                body = self._watched
                if body is None or self._fired is not None or self.clock() < self._deadline:
                    continue
                self._fired = body
                if self._use_signal:
                    signal.pthread_kill(self.ident, SIGNAL)
                else:
                    _async_raise(self.ident, KernelTimeout)

    def _on_signal(self, signum, frame):
        # Runs on the main thread between two bytecodes; never blocks on the lock (the
        # thread may hold it in unwatch).
        if self._fired is not None and self._fired is self._watched:
            raise KernelTimeout("the kernel's time limit passed")


class TimerWatchdog:
    """``Watchdog``'s interface without a thread, for bodies on the main thread: the
    process's CPU-time interval timer ticks every ``TICK`` CPU seconds while bodies run, and
    its signal interrupts the body on the thread once that body's deadline has passed.

    ``watch`` and ``unwatch`` are attribute stores (they run at every switch into a body:
    two ``setitimer`` calls there were a quarter of a simulation's py-spy samples); the timer is
    armed by the first ``watch`` after it went quiet, and a tick that finds no body on the
    thread disarms it, so a process that stops running bodies is not signalled for long."""

    def __init__(self, clock=time.thread_time):
        self.clock = clock  # what deadlines are read on: the thread's CPU seconds
        self._watched = None
        self._deadline = 0.0
        self._fired = None
        self._armed = False
        signal.signal(signal.SIGVTALRM, self._on_signal)

    def watch(self, body, deadline: float) -> None:
        self._fired = None
        self._deadline = deadline
        self._watched = body
        if not self._armed:  # read after _watched is set: a tick in between saw no body
            self._armed = True
            signal.setitimer(signal.ITIMER_VIRTUAL, TICK, TICK)

    def unwatch(self):
        """The watched body left the thread: the body interrupted, or None."""
        while True:
            try:
                fired, self._watched, self._fired = self._fired, None, None
                return fired
            except KernelTimeout:
                continue  # it landed here: the body is still the one that timed out

    def stop(self) -> None:
        """Shared by every host of the process: the timer goes quiet (the next ``watch``
        arms it again). Also at exit, where a tick would find the signal's default action
        (ending the process) restored."""
        self._armed = False
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)

    def _on_signal(self, signum, frame):
        watched = self._watched
        if watched is None:  # no body on the thread: go quiet until the next watch
            self.stop()
        elif self._fired is None and self.clock() >= self._deadline:
            self._fired = watched
            raise KernelTimeout("the kernel's time limit passed")


_timer: list = []  # the process's TimerWatchdog, once made


def timer_watchdog() -> TimerWatchdog | None:
    """The process's ``TimerWatchdog``, or None off the main thread (signals go there)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if not _timer:
        _timer.append(TimerWatchdog())
        atexit.register(_timer[0].stop)
    return _timer[0]


def _async_raise(ident: int, exc) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                               ctypes.py_object(exc) if exc else None)
