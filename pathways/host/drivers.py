"""What gives an executor its turns: a thread of its own, or an event loop's thread.

An executor (``pathways.host.executor``) does its work in turns (``Executor.turn``) and says
when it needs the next one (``Executor.next_deadline``). A driver calls it:

- ``LoopDriver`` (``Executor.run_on(loop)``, what every host uses): turns are callbacks of
  the host's event loop, so Plaque, the data service and the devices share one thread with no
  hand-off between them. The ICI socket and a timerfd (``pathways.host.alarm``, for
  sub-millisecond deadlines) are watched by the loop.
- ``ThreadDriver`` (``Executor.start()``: standalone devices, the multi-controller bench): a
  thread that waits in ``select`` on a wake pipe and the ICI socket between turns.

Both are woken from any thread (``wake``) and both, on a fake clock (``Clock.sleep``), move
the clock to the next deadline instead of waiting for it. On a clock that is its loop's own
(``Clock.on_loop``: a simulated host), ``LoopDriver`` waits with the loop's timers, at the
deadline's exact time, and a link without a file descriptor wakes it itself (``wake``).
"""

from __future__ import annotations

import logging
import os
import select
import threading

from .alarm import Alarm

__all__ = ["LoopDriver", "ThreadDriver"]

log = logging.getLogger("pathways.host.executor")

# seconds from a turn cut at its budget to the next: a timer, not call_soon, so that the
# loop first polls its sockets and runs what they bring (uvloop runs call_later(0) as soon)
AFTER_CUT = 0.001


class ThreadDriver:
    """Runs ``executor`` on a daemon thread of its own."""

    def __init__(self, executor):
        self.ex = executor
        self._wake_pending = False
        self._closed = False  # the wake pipe is closed
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._ident = None
        self._thread = threading.Thread(target=self._run, name=f"executor-{executor.name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def on_thread(self) -> bool:
        return threading.get_ident() == self._ident

    def in_turn(self) -> bool:
        return True  # its thread looks at everything after every turn

    def changed(self) -> None:
        pass  # the same: work added on its thread is seen at the end of the turn

    def wake(self) -> None:
        if not self._wake_pending and not self._closed:
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass  # closed

    def close(self, timeout: float) -> bool:
        self.wake()
        if self._thread.ident is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        stopped = not self._thread.is_alive()
        if stopped and not self._closed:
            self._closed = True
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
        return stopped

    def _run(self) -> None:
        ex = self.ex
        self._ident = threading.get_ident()
        ex.attach()
        while not ex.closing:
            self._wake_pending = False
            try:
                ex.turn()
            except BaseException as exc:  # a bug in the executor itself: keep serving
                log.exception("executor %s: internal error", ex.name)
                ex.internal_error(exc)
            self._wait(ex.next_deadline())
        ex.stop_running()

    def _wait(self, deadline: float | None) -> None:
        ex = self.ex
        timeout = None if deadline is None else max(0.0, deadline - ex.now())
        if timeout == 0.0:
            return
        if ex.link is not None and ex.link.readable():
            return
        if not ex.clock.real and timeout is not None and not ex.pending_calls():
            ex.clock.sleep(timeout)  # fake time
            return
        fds = [self._wake_r] + ([ex.link.fd] if ex.link is not None else [])
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except (OSError, ValueError):
            return  # closed meanwhile
        if self._wake_r in ready:
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass


class LoopDriver:
    """Runs ``executor`` on ``loop``'s thread (``start`` is called there)."""

    def __init__(self, executor, loop):
        self.ex, self.loop = executor, loop
        self._ident = None
        self._alarm = None
        self._wake_pending = False
        self._scheduled = False  # a turn is scheduled on the loop
        self._turning = False  # in a turn
        self._closed = False

    def start(self) -> None:
        ex, loop = self.ex, self.loop
        self._ident = threading.get_ident()
        ex.attach()
        self._alarm = Alarm.make() if ex.clock.real else None  # armed in real time
        if self._alarm is not None:
            loop.add_reader(self._alarm.fd, self._on_alarm)
        if ex.link is not None and ex.link.fd is not None:
            loop.add_reader(ex.link.fd, self._soon)
        self._soon()

    def on_thread(self) -> bool:
        return threading.get_ident() == self._ident

    def in_turn(self) -> bool:
        return self._turning

    def changed(self) -> None:
        """Work added on the loop's thread outside a turn (a store callback, a message)
        needs a turn to look at it."""
        if not self._turning:
            self._soon()

    def wake(self) -> None:
        if self.on_thread():
            self._soon()
        elif not self._wake_pending and not self.ex.closing:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self._soon)
            except RuntimeError:
                pass  # the loop is closed

    def close(self, timeout: float) -> bool:
        """Stop on the loop's thread (from another thread: wait up to ``timeout`` for it)."""
        if self._closed or self.on_thread():
            self._close_here()
            return True
        done = threading.Event()
        try:
            self.loop.call_soon_threadsafe(lambda: (self._close_here(), done.set()))
        except RuntimeError:  # the loop is closed: nothing runs there any more
            self._close_here()
            return True
        return done.wait(timeout)

    def _soon(self) -> None:
        if not self._scheduled and not self.ex.closing:
            self._scheduled = True
            self.loop.call_soon(self._turn)

    def _on_alarm(self) -> None:
        self._alarm.clear()
        self._soon()

    def _turn(self) -> None:
        ex = self.ex
        self._scheduled = self._wake_pending = False
        if ex.closing:
            return
        self._turning = True
        try:
            ex.turn()
        except BaseException as exc:  # a bug in the executor itself: keep serving
            log.exception("executor %s: internal error", ex.name)
            ex.internal_error(exc)
        finally:
            self._turning = False
        deadline = ex.next_deadline()
        if ex.turn_cut:  # a long turn: what reached the loop meanwhile (Plaque's messages,
            self._scheduled = True  # its ticks) goes first, then the rest of the work
            self.loop.call_later(AFTER_CUT, self._turn)
        elif deadline is not None and deadline <= ex.now() or (
                ex.link is not None and ex.link.readable()):
            self._soon()
        elif deadline is None:
            return
        elif self._alarm is not None:
            self._alarm.set(deadline)
        elif ex.clock.on_loop:  # the loop's own time: its timer, at the exact deadline
            self.loop.call_at(deadline, self._soon)
        elif not ex.clock.real:
            ex.clock.sleep(deadline - ex.now())  # fake time: moved, not waited for
            self._soon()
        else:  # the loop's own timer: millisecond precision
            self.loop.call_later(max(0.0, deadline - ex.now()), self._soon)

    def _close_here(self) -> None:
        if self._closed:
            return
        self._closed = True
        ex = self.ex
        for fd in ([self._alarm.fd] if self._alarm is not None else []) + (
                [ex.link.fd] if ex.link is not None and ex.link.fd is not None else []):
            try:
                self.loop.remove_reader(fd)
            except Exception:
                pass
        if self._alarm is not None:
            self._alarm.close()
        ex.stop_running()
