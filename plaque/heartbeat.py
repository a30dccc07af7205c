"""A worker's heartbeat while its event loop is busy.

The event loop sends heartbeats on its ticks, but an operator that computes for longer than
the coordinator's timeout would stop them and get a healthy worker declared lost. This thread
steps in while the loop has not beaten for a while, on its own socket, and stops stepping in
once the loop has been silent for ``stale_after`` seconds: a loop stuck that long is treated
as dead, so a real hang is still detected.

Its wake-ups also measure the process's own stalls (``plaque.liveness.StallMeter``): it is
late only when the whole process was stopped or starved, not when the loop is busy.
"""

from __future__ import annotations

import threading
import time

import zmq

from . import wire
from .liveness import StallMeter
from .wire import Kind

HEARTBEAT_INTERVAL = 0.5


class HeartbeatThread:
    """Beats go out through ``transport.thread_sender`` (the worker's transport: its own
    socket for this thread, or the in-process delivery, which any thread may use)."""

    def __init__(self, core, transport, interval: float = HEARTBEAT_INTERVAL,
                 stale_after: float = 60.0, clock=time.monotonic):
        self.core, self.transport = core, transport
        self.interval, self.stale_after, self.clock = interval, stale_after, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plaque-heartbeat", daemon=True)
        self._meter = StallMeter(clock(), interval)

    def stalled(self, now: float) -> float:
        """Seconds the process was stopped or starved so far (any thread)."""
        return self._meter.stalled(now)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        send = close = None
        try:
            while not self._stop.wait(self.interval):
                self._meter.woke(self.clock())
                core = self.core
                last = core.last_tick
                if core.id is None or last is None or not core.coordinator_control:
                    continue
                if send is None:  # connect early: the first beat must not wait for TCP
                    send, close = self.transport.thread_sender(core.coordinator_control)
                silent = self.clock() - last
                if silent < 1.5 * self.interval or silent > self.stale_after:
                    continue  # the loop beats by itself, or it is stuck, not busy
                send(wire.encode(Kind.HEARTBEAT, core.id, self.clock()))
        except zmq.ContextTerminated:
            pass  # the worker is shutting down: its transport ended the context
        finally:
            if close is not None:
                close()
