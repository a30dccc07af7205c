"""The executor's body runner: kernel bodies in greenlets on the executor's thread.

A shard whose start has come (``pathways.host.timeline.Start``) runs its body --
``kernel.execute(device)`` -- in a greenlet taken from a small pool. A body that reaches a
collective parks its greenlet (``park``) and gives the thread back; the exchange resumes it
when its peers have delivered (``resume``). When the body returns or raises, its virtual end
is fixed (``Timeline.ended``) and the executor is told (``Executor.body_done``).

Whatever a body raises -- any ``BaseException``: ``SystemExit``, ``KeyboardInterrupt``,
``GeneratorExit``, even ``GreenletExit`` -- fails its kernel and nothing else. A body with a
time limit (its kernel's ``limit``, else the executor's ``kernel_limit``) runs under the
``Watchdog``, which interrupts it with ``KernelTimeout`` past its limit in real time. On a
simulated host (a clock ``on_loop``) the limit counts the CPU seconds the body itself uses on
the thread instead, summed over its turns there: a load on the machine stretches real time,
not the work a body does, and a simulation's outcome must not depend on the machine.
"""

from __future__ import annotations

import threading
import time

import greenlet

from ..errors import KernelTimeout, PathwaysError
from ..program.cost import check_seconds
from .device import DeviceWork, report_error
from .timeline import Lane, Slot
from .watchdog import Watchdog, timer_watchdog

__all__ = ["BodyRunner", "Shard", "kernel_name"]

RUNNERS_KEPT = 64  # idle body greenlets kept for reuse


class Shard(Slot):
    """A kernel that left its device's queue (a ``Slot`` of its device's lane), with what
    running its body needs: waiting for inputs, running, parked or finishing."""

    __slots__ = ("device", "kernel", "keys", "pending", "glet", "error", "nbytes", "waiting",
                 "deadline", "done", "ended_at", "limit_at", "cpu_left", "grant")

    def __init__(self, device, lane: Lane, seq: int, kernel: DeviceWork, arrived: float):
        super().__init__(lane, seq, kernel, arrived)
        self.device = device
        self.kernel = kernel  # its work, by the name kernels go by here (read ~7x a kernel)
        self.keys: list = []  # object-store keys of its inputs
        self.pending = 0  # inputs not resolved yet
        self.glet = None
        self.error: BaseException | None = None
        self.nbytes = 0
        self.waiting = None  # [mailbox key, sources, how many missing] while parked
        self.deadline = 0.0  # when a parked exchange times out
        self.done = False  # the body has returned or raised
        self.ended_at = 0.0  # when it did (real time)
        self.limit_at = 0.0  # time.monotonic() past which the body is interrupted (0: never)
        self.cpu_left = 0.0  # on a simulated host instead: CPU seconds it may still use
        self.grant = None  # the HBM taken for its outputs, once admitted


class BodyRunner:
    """Runs the bodies of ``executor``'s shards on its thread (see the module docstring)."""

    def __init__(self, executor):
        self.ex = executor
        self.main = None  # the driver's greenlet, which bodies park into (``attach``)
        self._runners: list = []  # idle greenlets that run bodies
        self._watchdog: Watchdog | None = None
        self._cpu_watchdog = None  # that watchdog, if it counts CPU seconds (a simulation's)

    def attach(self) -> None:
        """The calling thread's greenlet is the driver's: bodies park into it."""
        self.main = greenlet.getcurrent()

    def park(self) -> None:
        """In a shard's greenlet: give the thread back until ``resume``."""
        self.main.switch()

    def begin(self, shard: Shard, now: float) -> None:
        """Real time (``now``, as the caller just read it) has reached ``shard``'s start:
        run its body until it parks or ends."""
        self.ex.timeline.begin(shard, now)
        limit = self.limit(shard.kernel)
        if limit and self._watcher() is self._cpu_watchdog:
            shard.cpu_left = limit  # simulated: the body's own CPU seconds
        elif limit:
            shard.limit_at = time.monotonic() + limit  # real time: it stops a real thread
        glet = None
        while self._runners and glet is None:
            glet = self._runners.pop()
            if glet.dead:  # a time-limit interrupt landed in it between two bodies
                glet = None
        if glet is None:
            glet = greenlet.greenlet(self._runner, parent=self.main)
        shard.glet = glet
        self._switch(shard, glet.switch, shard)

    def resume(self, shard: Shard, error: BaseException | None) -> None:
        """Resume a parked shard, or raise ``error`` in it."""
        if shard.glet is None or shard.glet.dead or shard.done:
            return
        if error is None:
            self._switch(shard, shard.glet.switch)
        else:
            self._switch(shard, shard.glet.throw, error)

    def stop(self, shards: list[Shard]) -> None:
        """The executor closes: stop the watchdog and the bodies of ``shards``, told so."""
        if self._watchdog is not None:
            self._watchdog.stop()
        for shard in shards:
            if shard.glet is not None and not shard.glet.dead:
                shard.glet.throw(greenlet.GreenletExit)
            report_error(shard.kernel, PathwaysError(
                f"{shard.device.name} closed while seq {shard.seq} ran"))

    def _watcher(self):
        """The watchdog, made on first use: a simulation's hosts share its thread and the
        process's ``TimerWatchdog`` (no thread, CPU seconds); else one with a thread."""
        if self._watchdog is None:
            shared = timer_watchdog() if self.ex.clock.on_loop else None
            self._watchdog = shared or Watchdog(threading.get_ident())
            self._cpu_watchdog = shared
        return self._watchdog

    def limit(self, kernel) -> float | None:
        """Seconds ``kernel``'s body may run: its own ``limit``, else the executor's (per
        program call it runs: a fused kernel runs several)."""
        default = self.ex.kernel_limit
        return kernel.limit or (default * kernel.calls if default else default)

    def _runner(self, shard: Shard) -> None:
        """A greenlet that runs bodies, one after the other (made once, reused)."""
        while True:
            self._body(shard)
            if len(self._runners) < RUNNERS_KEPT:
                self._runners.append(greenlet.getcurrent())
                shard = self.main.switch()  # resumed with the next shard to run
            else:
                return

    def _body(self, shard: Shard) -> None:
        try:
            modelled = check_seconds(shard.kernel.execute(shard.device),
                                     f"duration returned by {shard.kernel!r}")
            if shard.device.spec.real:  # a real device took the time it took
                modelled = 0.0
            shard.nbytes = int(shard.kernel.output_bytes())
        except greenlet.GreenletExit as exc:
            if self.ex.closing:  # the executor stops the greenlet (stop)
                raise
            shard.error, modelled = exc, 0.0  # raised by the body itself
        except KernelTimeout:
            shard.error, modelled = self._timed_out(shard), 0.0
        except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the body's failure,
            shard.error, modelled = exc, 0.0  # never the host's (it would hold the device)
        self._ended(shard, modelled)

    def _ended(self, shard: Shard, modelled: float) -> None:
        shard.ended_at = now = self.ex.now()
        self.ex.timeline.ended(shard, now, modelled)
        shard.done = True

    def _timed_out(self, shard: Shard) -> KernelTimeout:
        kernel = shard.kernel
        return KernelTimeout(
            f"{kernel_name(kernel)} on {shard.device.name} ran longer than its"
            f" limit of {self.limit(kernel):g} s and was stopped (shard_map(..., limit=seconds)"
            " sets a function's limit, 'pathways host --kernel-limit' a host's default)")

    def _switch(self, shard: Shard, switch, *args) -> None:
        """Run the shard's greenlet until it parks or ends; then tell the executor."""
        if shard.limit_at or shard.cpu_left:
            self._switch_watched(shard, switch, args)
        else:
            switch(*args)
        if shard.done:
            shard.glet = None
            self.ex.body_done(shard)

    def _switch_watched(self, shard: Shard, switch, args) -> None:
        """``switch`` with the body under the watchdog: past its deadline it is interrupted."""
        watchdog = self._watchdog or self._watcher()
        cpu_left = shard.cpu_left  # a simulated body's: its turns' CPU seconds are counted
        began = watchdog.clock() if cpu_left else 0.0
        watchdog.watch(shard, shard.limit_at or began + cpu_left)
        try:
            switch(*args)
        except KernelTimeout:
            pass  # it landed outside the body's own try (see pathways.host.watchdog)
        fired = watchdog.unwatch()
        if cpu_left:  # what this turn used; never 0, which means no limit
            shard.cpu_left = max(cpu_left - (watchdog.clock() - began), 1e-9)
        if fired is not shard or shard.done:
            return
        if shard.glet is None or shard.glet.dead:  # it ended the greenlet itself
            shard.error = self._timed_out(shard)
            self._ended(shard, 0.0)
        else:  # it landed in this thread just after the body parked: fail it there
            err = self._timed_out(shard)
            self.ex.call_soon(lambda: self.resume(shard, err))


def kernel_name(kernel: DeviceWork) -> str:
    return str(kernel.name if kernel.name is not None else type(kernel).__name__)
