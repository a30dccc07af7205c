"""One executor per host: a single thread runs every emulated device of the host as a timeline.

A device is a record (``EmulatedDevice``): a queue of kernels by sequence number, the modelled
time it is free again (``free_at``), its HBM and its timeline. The executor thread takes each
device's next kernel in sequence order and runs it when it can start, in *virtual* time:

    start = max(device free_at, real time its dispatch reached the host, inputs ready)
    end   = start + max(real compute, modelled) + time spent waiting for peers in collectives

where an input is ready at its producer's modelled end (same host) or at its real arrival
(data from another host or a client, plus its modelled link time). A kernel's body runs only
once real time has reached its start, and what it produces (``on_done``: store puts,
capability releases, progress) happens only once real time has reached its end: one timer
heap and one precise wait for the whole host, never a sleep per kernel. A late wake-up of the
executor delays publication but is not booked as device time, so utilization means what the
paper means: the dispatch arrived before the device was free.

Bodies run in greenlets. Whatever a body raises -- any ``BaseException``: ``SystemExit``,
``KeyboardInterrupt``, ``GeneratorExit``, even ``GreenletExit`` -- fails its kernel (and so
its gang) and nothing else: the device goes on with its next kernel. A collective parks the
shard -- not a thread -- until its peers have delivered (``pathways.host.exchange``); the
device stays occupied meanwhile, so an inconsistent gang order deadlocks as on TPUs and ends
in ``CollectiveTimeout`` (a timer). HBM back-pressure is "not finished yet": a kernel whose
outputs do not fit keeps its device until frees make room (without a bound: a client that
waits for such a kernel before deleting what holds the room waits for ever).

Kernels are objects with ``execute(device) -> modelled seconds`` and ``name``/``labels``;
optional: ``input_keys()`` (object-store keys to wait for), ``not_before`` (a modelled arrival
of data pushed to it), ``output_bytes()`` (HBM its outputs need, taken before ``on_done``),
``on_done()`` and ``on_error(exc)``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

import greenlet

from ..errors import KernelTimeout, PathwaysError
from ..program.cost import DeviceSpec, check_seconds
from .alarm import Alarm
from .device import EmulatedDevice, KernelRecord, device_name, report_error
from .exchange import Exchanges
from .watchdog import Watchdog

log = logging.getLogger("pathways.host.executor")

COLLECTIVE_TIMEOUT = 60.0
KERNEL_LIMIT = 30.0  # seconds a body may run on the host's thread (a host's default)
RUNNERS_KEPT = 64  # idle body greenlets kept for reuse


class _Shard:
    """A kernel that has left its device's queue: waiting for inputs, running or finishing."""

    __slots__ = ("device", "seq", "kernel", "arrived", "keys", "pending", "start", "cursor",
                 "segment", "waited", "glet", "end", "error", "nbytes", "waiting", "deadline",
                 "done", "held", "limit_at")

    def __init__(self, device, seq, kernel, arrived):
        self.device, self.seq, self.kernel, self.arrived = device, seq, kernel, arrived
        self.keys = _input_keys(kernel)  # object-store keys of its inputs
        self.pending = 0  # inputs not resolved yet
        self.start = self.cursor = self.segment = self.end = 0.0
        self.waited = 0.0  # modelled time spent waiting for peers in collectives
        self.glet = None
        self.error: BaseException | None = None
        self.nbytes = 0
        self.waiting = None  # [mailbox key, sources, how many missing] while parked
        self.deadline = 0.0  # when a parked exchange times out
        self.done = False  # the body has returned or raised
        self.held = False  # finished, but its outputs did not fit in HBM: it keeps the device
        self.limit_at = 0.0  # time.monotonic() past which the body is interrupted (0: never)


class Executor:
    """Runs the kernels of a set of devices on one thread (see the module docstring).

    ``store``: the host's object store, for kernels with ``input_keys``. ``link``: what carries
    collective values to other hosts, as ``pathways.host.ici.IciLink`` does (``queue(key, src,
    dsts, value, lag)``, ``flush()``, ``receive() -> [(key, src, dsts, value, lag)]``,
    ``readable()`` and ``fd``). ``clock``/``sleep``: injectable for tests (a fake ``sleep`` is
    used for every timed wait). ``run_on(loop)`` runs it on an event loop instead of a thread.
    """

    def __init__(self, name: str = "host", store=None, link=None,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], object] | None = None,
                 collective_timeout: float = COLLECTIVE_TIMEOUT,
                 kernel_limit: float | None = KERNEL_LIMIT):
        self.name, self.store, self.link = name, store, link
        self.clock, self._sleep = clock, sleep
        self.collective_timeout = collective_timeout
        self.kernel_limit = kernel_limit  # a kernel's own ``limit`` attribute wins; None: none
        self._watchdog: Watchdog | None = None
        self.devices: dict[int, EmulatedDevice] = {}
        self.lock = threading.Lock()  # device queues (enqueued from other threads)
        self.idle = threading.Condition(self.lock)  # wait_idle waiters
        self.idle_waiters = 0
        self._inbox: deque = deque()
        self._wake_pending = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._timers: list = []
        self._tick = itertools.count()
        self._resumable: deque = deque()
        self._hbm_waiting: list = []  # retries of what did not fit in HBM
        self._runners: list = []  # idle greenlets that run bodies
        self.exchanges = Exchanges(self)  # the collectives of the shards it runs
        self._closing = False
        self._closed = False  # the wake pipe is closed
        self._main = None
        self._ident = None  # the thread that runs it
        self._loop = None  # the event loop that runs it (run_on), if not a thread of its own
        self._alarm = None
        self._turn_scheduled = False
        self._in_turn = False  # in _loop_turn (on an event loop)
        self._thread = threading.Thread(target=self._run, name=f"executor-{name}", daemon=True)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def add_device(self, device_id: int, spec=None, name: str | None = None) -> EmulatedDevice:
        """A new device run by this executor (any thread)."""
        device = EmulatedDevice(device_id, spec, name, self)
        with self.lock:
            self.devices[device_id] = device
        self.wake()
        return device

    # -- any thread ------------------------------------------------------------------------

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the executor thread at its next turn (one wake per batch)."""
        self._inbox.append(fn)
        self.wake()

    def wake(self) -> None:
        if self._loop is not None:  # run by an event loop: a turn at its next iteration
            if self.on_thread():
                self._soon()
            elif not self._wake_pending and not self._closing:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._soon)
                except RuntimeError:
                    pass  # the loop is closed
            return
        if not self._wake_pending and not self._closed:
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass  # closed

    def abort_gang(self, gang_key, reason: str) -> None:
        """Fail every exchange, present and future, of ``gang_key`` on this executor."""
        if self.on_thread():
            self.exchanges.abort_gang(gang_key, reason)
        else:
            self.call_soon(lambda: self.exchanges.abort_gang(gang_key, reason))

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the thread; queued kernels of every device are told via ``on_error``."""
        for device in list(self.devices.values()):
            device.close_queue()
        if self._loop is not None:
            return self._close_on_loop()
        self._closing = True
        self.wake()
        if self._started and threading.current_thread() is not self._thread:
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

    def on_thread(self) -> bool:
        return threading.get_ident() == self._ident

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        self._ident, self._main = threading.get_ident(), greenlet.getcurrent()
        while not self._closing:
            try:
                self._turn()
            except BaseException:  # a bug in the executor itself: keep serving
                log.exception("executor %s: internal error", self.name)
            self._wait(self._next_deadline())
        self._stop_running()

    def _stop_running(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        for shard in [d.current for d in self.devices.values() if d.current is not None]:
            if shard.glet is not None and not shard.glet.dead:
                shard.glet.throw(greenlet.GreenletExit)
            report_error(shard.kernel, PathwaysError(
                f"{shard.device.name} closed while seq {shard.seq} ran"))

    # -- or on an event loop's thread ---------------------------------------------------------

    def run_on(self, loop) -> None:
        """Run on ``loop``'s thread instead of a thread of its own (call it there): a host
        then has one thread for Plaque, its data service and its devices, and no hand-off
        between them. The ICI socket and a timerfd (``pathways.host.alarm``, for sub-millisecond
        deadlines) are watched by the loop."""
        self._loop, self._ident, self._main = loop, threading.get_ident(), greenlet.getcurrent()
        self._started = True
        self._alarm = Alarm.make()
        if self._alarm is not None:
            loop.add_reader(self._alarm.fd, self._on_alarm)
        if self.link is not None:
            loop.add_reader(self.link.fd, self._soon)
        self._soon()

    def _soon(self) -> None:
        if not self._turn_scheduled and not self._closing:
            self._turn_scheduled = True
            self._loop.call_soon(self._loop_turn)

    def _on_alarm(self) -> None:
        self._alarm.clear()
        self._soon()

    def _loop_turn(self) -> None:
        self._turn_scheduled = False
        if self._closing:
            return
        self._in_turn = True
        try:
            self._turn()
        except BaseException:  # a bug in the executor itself: keep serving
            log.exception("executor %s: internal error", self.name)
        finally:
            self._in_turn = False
        deadline = self._next_deadline()
        if deadline is not None and deadline <= self.clock() or (
                self.link is not None and self.link.readable()):
            self._soon()
        elif deadline is not None:
            if self._alarm is not None:
                self._alarm.set(deadline)
            else:  # the loop's own timer: millisecond precision
                self._loop.call_later(max(0.0, deadline - self.clock()), self._soon)

    def _close_on_loop(self) -> bool:
        if not self._closing:
            self._closing = True
            for fd in ([self._alarm.fd] if self._alarm is not None else []) + (
                    [self.link.fd] if self.link is not None else []):
                try:
                    self._loop.remove_reader(fd)
                except Exception:
                    pass
            if self._alarm is not None:
                self._alarm.close()
            self._stop_running()
            self._closed = True
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        return True

    def _turn(self) -> None:
        self._wake_pending = False
        while self._inbox:
            fn = self._inbox.popleft()
            try:
                fn()
            except Exception:
                log.exception("executor %s: a queued call failed", self.name)
        if self.link is not None:
            now = self.clock()
            receive = self.exchanges.receive
            for key, src, dsts, value, lag in self.link.receive():
                receive(key, src, dsts, value, now + min(lag, 0.0))
        busy = True
        while busy:
            busy = self._fire_timers()
            while self._resumable:
                self._resume(*self._resumable.popleft())
                busy = True
            for device in list(self.devices.values()):
                if device.current is None:
                    busy |= self._take_next(device)
        if self.link is not None:
            self.link.flush()

    def _next_deadline(self) -> float | None:
        if self._inbox or self._resumable:
            return 0.0
        return self._timers[0][0] if self._timers else None

    def _wait(self, deadline: float | None) -> None:
        timeout = None if deadline is None else max(0.0, deadline - self.clock())
        if timeout == 0.0:
            return
        if self.link is not None and self.link.readable():
            return
        if self._sleep is not None and timeout is not None and not self._inbox:
            self._sleep(timeout)  # injected (fake) time
            return
        fds = [self._wake_r] + ([self.link.fd] if self.link is not None else [])
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except (OSError, ValueError):
            return  # closed meanwhile
        if self._wake_r in ready:
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass

    def at(self, when: float, fn: Callable[[], object]) -> None:
        """Executor thread: call ``fn()`` once the clock has reached ``when``."""
        heapq.heappush(self._timers, (when, next(self._tick), fn))
        self._changed()

    def _in_own_turn(self) -> bool:
        return self.on_thread() and (self._loop is None or self._in_turn)

    def _changed(self) -> None:
        """On an event loop, work added outside a turn (a store callback, a message) needs
        a turn to look at it; a thread of its own looks after every turn anyway."""
        if self._loop is not None and not self._in_turn:
            self._soon()

    def park(self) -> None:
        """In a shard's greenlet: give the thread back until ``resume_later`` is called."""
        self._main.switch()

    def resume_later(self, shard: _Shard, error: BaseException | None) -> None:
        """Resume a parked shard at this turn, or raise ``error`` in it."""
        self._resumable.append((shard, error))
        self._changed()

    def _fire_timers(self) -> bool:
        fired = False
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            _, _, fn = heapq.heappop(self._timers)
            fn()
            fired = True
        return fired

    # -- a device's next kernel --------------------------------------------------------------

    def _take_next(self, device: EmulatedDevice) -> bool:
        item = device.take_next()
        if item is None:
            return False
        seq, kernel, arrived = item
        shard = device.current = _Shard(device, seq, kernel, arrived)
        keys = shard.keys
        if keys:
            if self.store is None:
                return self._failed_early(shard, PathwaysError(
                    f"{device.name}: kernel {kernel!r} has inputs but no object store"))
            ready = self.store.ready_at(keys)
            if ready is not None:  # the common case: inputs made before, no callbacks
                self._inputs_ready(shard, ready)
                return True
            shard.pending = len(keys) + 1  # +1: released below, once all are registered
            for key in keys:
                try:
                    self.store.add_done_callback(key, lambda _k, s=shard: self._input_done(s))
                except Exception as exc:  # e.g. the input was deleted
                    shard.error = exc
                    self._input_done(shard)
            self._input_done(shard)
        else:
            self._inputs_ready(shard)
        return True

    def _input_done(self, shard: _Shard) -> None:
        if not self._in_own_turn():  # a store callback from elsewhere: do it in a turn
            self.call_soon(lambda: self._input_done(shard))
            return
        shard.pending -= 1
        if shard.pending == 0:
            self._inputs_ready(shard)

    def _inputs_ready(self, shard: _Shard, inputs_at: float | None = None) -> None:
        if shard.error is not None:
            self._failed_early(shard, shard.error)
            return
        device, kernel = shard.device, shard.kernel
        if inputs_at is None:
            inputs_at = max((self.store.arrival(k) for k in shard.keys), default=0.0)
        ready = max(device.free_at, shard.arrived, inputs_at,
                    getattr(kernel, "not_before", 0.0) or 0.0)
        shard.start = ready
        if ready > self.clock():
            self.at(ready, lambda: self._begin(shard))
        else:
            self._begin(shard)

    def _failed_early(self, shard: _Shard, error: BaseException) -> bool:
        shard.start = shard.end = max(shard.device.free_at, shard.arrived)
        shard.error, shard.done = error, True
        self._finish(shard)
        return True

    def _begin(self, shard: _Shard) -> None:
        shard.cursor = shard.start
        shard.segment = self.clock()
        limit = self._limit(shard.kernel)
        if limit:
            shard.limit_at = time.monotonic() + limit
        glet = None
        while self._runners and glet is None:
            glet = self._runners.pop()
            if glet.dead:  # a time-limit interrupt landed in it between two bodies
                glet = None
        if glet is None:
            glet = greenlet.greenlet(self._runner, parent=self._main)
        shard.glet = glet
        self._switch(shard, glet.switch, shard)

    def _runner(self, shard: _Shard) -> None:
        """A greenlet that runs bodies, one after the other (made once, reused)."""
        while True:
            self._body(shard)
            if len(self._runners) < RUNNERS_KEPT:
                self._runners.append(greenlet.getcurrent())
                shard = self._main.switch()  # resumed with the next shard to run
            else:
                return

    def _body(self, shard: _Shard):
        device = shard.device
        try:
            modelled = check_seconds(shard.kernel.execute(device),
                                     f"duration returned by {shard.kernel!r}")
            shard.nbytes = int(getattr(shard.kernel, "output_bytes", _zero)())
        except greenlet.GreenletExit as exc:
            if self._closing:  # the executor stops the greenlet (_stop_running)
                raise
            shard.error, modelled = exc, 0.0  # raised by the body itself
        except KernelTimeout:
            shard.error, modelled = self._timed_out(shard), 0.0
        except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the body's failure,
            shard.error, modelled = exc, 0.0  # never the host's (it would hold the device)
        self._ended(shard, modelled)

    def _ended(self, shard: _Shard, modelled: float) -> None:
        shard.cursor += self.clock() - shard.segment
        # occupied for its compute (real or modelled, whichever is longer) plus its waits
        shard.end = max(shard.cursor, shard.start + shard.waited + modelled)
        shard.done = True

    def _limit(self, kernel) -> float | None:
        """Seconds ``kernel``'s body may run: its own ``limit``, else the executor's."""
        return getattr(kernel, "limit", None) or self.kernel_limit

    def _timed_out(self, shard: _Shard) -> KernelTimeout:
        kernel = shard.kernel
        return KernelTimeout(
            f"{getattr(kernel, 'name', kernel)!s} on {shard.device.name} ran longer than its"
            f" limit of {self._limit(kernel):g} s and was stopped (shard_map(..., limit=seconds)"
            " sets a function's limit, 'pathways host --kernel-limit' a host's default)")

    def _switch(self, shard: _Shard, switch, *args) -> None:
        """Run the shard's greenlet until it parks or ends; then schedule its end."""
        if shard.limit_at:
            self._switch_watched(shard, switch, args)
        else:
            switch(*args)
        if shard.done:
            shard.glet = None
            if shard.end > self.clock():
                self.at(shard.end, lambda: self._finish(shard))
            else:
                self._finish(shard)

    def _switch_watched(self, shard: _Shard, switch, args) -> None:
        """``switch`` with the body under the watchdog: past its deadline it is interrupted."""
        if self._watchdog is None:
            self._watchdog = Watchdog(threading.get_ident())
        self._watchdog.watch(shard, shard.limit_at)
        try:
            switch(*args)
        except KernelTimeout:
            pass  # it landed outside the body's own try (see pathways.host.watchdog)
        if self._watchdog.unwatch() is not shard or shard.done:
            return
        if shard.glet is None or shard.glet.dead:  # it ended the greenlet itself
            shard.error = self._timed_out(shard)
            self._ended(shard, 0.0)
        else:  # it landed in this thread just after the body parked: fail it there
            err = self._timed_out(shard)
            self.call_soon(lambda: self._resume(shard, err))

    def _resume(self, shard: _Shard, error: BaseException | None) -> None:
        if shard.glet is None or shard.glet.dead or shard.done:
            return
        if error is None:
            self._switch(shard, shard.glet.switch)
        else:
            self._switch(shard, shard.glet.throw, error)

    def _finish(self, shard: _Shard) -> None:
        """Real time has reached the kernel's modelled end: publish, record, free the device."""
        device, kernel = shard.device, shard.kernel
        error = shard.error
        if error is None and shard.nbytes:
            try:
                frees = device.hbm.frees
                if not device.hbm.try_allocate(shard.nbytes):
                    shard.held = True  # keeps its device until room is made
                    self.wait_for_hbm(device.hbm, frees, lambda: self._finish(shard))
                    return
            except Exception as exc:  # more than the whole HBM
                error = exc
            else:
                if shard.held:  # the device was held until now
                    shard.end, shard.held = max(shard.end, self.clock()), False
        if error is None:
            try:
                on_done = getattr(kernel, "on_done", None)
                if on_done is not None:
                    on_done()
            except Exception as exc:
                error = exc
        if error is not None:
            report_error(kernel, error)
        device.finished(shard, KernelRecord(
            shard.seq, str(getattr(kernel, "name", type(kernel).__name__)),
            dict(getattr(kernel, "labels", None) or {}), shard.start, shard.end,
            error is not None, shard.arrived, self.clock()))

    def wait_for_hbm(self, hbm, frees: int, retry: Callable[[], object]) -> None:
        """Call ``retry()`` in a turn once some HBM is freed: an allocation on ``hbm`` did
        not fit when it had seen ``frees`` frees (so one that came meanwhile is not lost).
        How back-pressure waits without blocking the host's thread."""
        self._hbm_waiting.append(retry)
        if hbm.frees != frees:
            self.call_soon(self._retry_hbm)

    def hbm_freed(self) -> None:
        """Some device's HBM has room again: retry what waits for it (any thread)."""
        if self._hbm_waiting:
            self.call_soon(self._retry_hbm)

    def _retry_hbm(self) -> None:
        waiting, self._hbm_waiting = self._hbm_waiting, []
        for retry in waiting:
            retry()

def _input_keys(kernel) -> list:
    keys = getattr(kernel, "input_keys", None)
    return keys() if keys is not None else []


def _zero() -> int:
    return 0


def standalone_device(device_id: int, spec: DeviceSpec | None = None,
                      clock: Callable[[], float] = time.perf_counter, name: str | None = None,
                      sleep: Callable[[float], object] | None = None) -> EmulatedDevice:
    """A device with an executor of its own, on its own thread (tests and benchmarks of one
    device); closing the device stops the executor."""
    spec = spec if spec is not None else DeviceSpec()
    executor = Executor(device_name(spec, device_id, name), clock=clock, sleep=sleep)
    device = EmulatedDevice(device_id, spec, name, executor, own_executor=True)
    executor.devices[device_id] = device
    executor.start()
    return device
