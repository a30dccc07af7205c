"""The thin adapter between a core state machine and a transport on an asyncio loop.

Each received message goes to ``core.receive``; one turn per loop iteration runs the core's
local work (``step``) and carries out its commands, so everything produced while handling a
burst of messages leaves together. A periodic tick gives the core the time, and the latest time
the transport's inbox was found empty (``heard_until``: peers' silence is counted only up to
then, ``plaque.liveness``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time

from .commands import Connect, Disconnect, Exit, Send

log = logging.getLogger("plaque.endpoint")


class Endpoint:
    """Drives one core (``WorkerCore`` or ``CoordinatorCore``) over one transport on ``loop``.

    It hands received frames to ``core.receive``, runs turns (``core.step`` when the core has
    one, then the core's commands, then ``after_turn``) and ticks the core every
    ``tick_interval`` seconds of ``clock``. ``on_exit(reason)`` runs once it stops: on an
    ``Exit`` command, or ``stop``. ``stalls(now)``: the process's stalled seconds so far
    (``plaque.liveness.StallMeter``), for a worker core whose loop also runs long work of its
    own: every tick gets them and every message is dated when handled (``receive(frames,
    at)``), so time the loop spent busy counts as the coordinator's silence but time the
    process was stopped does not; None: the core judges by its ticks' lateness.
    """

    def __init__(self, core, transport, loop, tick_interval=0.1, after_turn=None,
                 on_exit=None, clock=time.monotonic, stalls=None):
        self.core, self.transport, self.loop = core, transport, loop
        self.stalls = stalls
        self.tick_interval = tick_interval
        self.after_turn = after_turn
        self.on_exit = on_exit
        self.clock = clock
        self._scheduled = False
        self._timer = None
        self.exit_reason: str | None = None

    def start(self) -> None:
        if hasattr(self.core, "wakeup"):
            self.core.wakeup = self._wake_threadsafe
        self.transport.start(self.loop, self._on_message)
        self._tick()

    def _on_message(self, channel, frames) -> None:
        if self.stalls is None:
            self.core.receive(frames)
        else:  # dated now: the loop's own work may hold up the next tick for long
            self.core.receive(frames, self.clock())
        self.soon()

    def soon(self) -> None:
        """Run a turn on the next loop iteration (coalesced)."""
        if not self._scheduled and self.exit_reason is None:
            self._scheduled = True
            self.loop.call_soon(self.turn)

    def _wake_threadsafe(self) -> None:
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.soon)
            except RuntimeError:
                pass  # loop closed in between: nothing left to wake

    def turn(self) -> None:
        self._scheduled = False
        if self.exit_reason is not None:
            return
        step = getattr(self.core, "step", None)
        if step is not None:
            step()
        self._execute(self.core.take_commands())
        if self.after_turn is not None:
            self.after_turn()

    def _execute(self, commands) -> None:
        do = self._DO
        for cmd in commands:
            do[type(cmd)](self, cmd)
            if self.exit_reason is not None:
                return  # stopped: the transport is closed, the rest cannot be carried out

    def _send(self, cmd: Send) -> None:
        try:
            self.transport.send(cmd.peer, cmd.channel, cmd.frames)
        except KeyError:
            log.debug("no route to peer %s; message dropped", cmd.peer)

    def _connect(self, cmd: Connect) -> None:
        self.transport.connect(cmd.peer, cmd.address)

    def _disconnect(self, cmd: Disconnect) -> None:
        self.transport.disconnect(cmd.peer)

    def _exit(self, cmd: Exit) -> None:
        self.stop(cmd.reason)

    _DO = {Send: _send, Connect: _connect, Disconnect: _disconnect, Exit: _exit}

    def _tick(self) -> None:
        if self.exit_reason is not None:
            return
        now = self.clock()
        if self.stalls is None:
            self.core.tick(now, self.transport.heard_until(now))
        else:
            self.core.tick(now, self.transport.heard_until(now), self.stalls(now))
        self.turn()
        self._timer = self.loop.call_later(self.tick_interval, self._tick)

    def stop(self, reason: str = "stopped") -> None:
        if self.exit_reason is not None:
            return
        self.exit_reason = reason
        if self._timer is not None:
            self._timer.cancel()
        self.transport.close()
        if self.on_exit is not None:
            self.on_exit(reason)


async def serve_worker_core(core, transport, on_exit=None) -> str:
    """Run a worker core on the running loop until it exits; returns why it exited.
    ``on_exit(reason)`` runs at once when it exits, in the loop callback that decided it
    (before any other callback of the loop: work queued behind it can be dropped there).

    Adds what a worker process needs around the endpoint: a heartbeat thread for while the
    loop is busy in an operator (whose wake-ups also tell the core when the process, not just
    its loop, stalled), and SIGINT/SIGTERM as a clean stop (when run on the main thread: a
    worker in a thread of another program leaves its signals alone).
    """
    from .heartbeat import HeartbeatThread

    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def exited(reason: str) -> None:
        if on_exit is not None:
            on_exit(reason)
        if not done.done():
            done.set_result(reason)

    beats = HeartbeatThread(core, transport)
    endpoint = Endpoint(core, transport, loop, on_exit=exited, stalls=beats.stalled)
    endpoint.start()
    beats.start()
    if threading.current_thread() is threading.main_thread():  # else: not the process's own
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, endpoint.stop, f"signal {sig.name}")
    try:
        return await done
    finally:
        beats.stop()
