"""Drivers for executors under test (``pathways.host.drivers``).

Hosts run their executor on their event loop (``Executor.run_on``, uvloop, as
``pathways.host.process.serve_host`` and the twin do), so the executor's tests drive that
driver: ``LoopThread`` is a uvloop loop on a thread of its own, ``start_on_loop`` runs an
executor there. Standalone devices keep their thread driver (``Executor.start``).
"""

from __future__ import annotations

import contextlib
import threading

import uvloop

from pathways.host.drivers import LoopDriver, ThreadDriver
from pathways.host.executor import Executor

WAIT = 5.0  # bound on every wait; tests never depend on it being reached
DRIVERS = ("loop", "thread")


class LoopThread:
    """A uvloop event loop running on a daemon thread, until ``close``."""

    def __init__(self):
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop",
                                       daemon=True)
        self.thread.start()

    def call(self, fn) -> None:
        """Run ``fn()`` on the loop's thread and wait for it."""
        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (fn(), done.set()))
        assert done.wait(WAIT), "the loop did not run the call"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the loop's thread did not stop"
        self.loop.close()


_LOOPS: dict[int, LoopThread] = {}  # id(executor) -> the loop it runs on, once started


def start(executor: Executor, driver: str = "loop") -> None:
    """Run ``executor`` by ``driver`` ("loop": on a loop of its own; "thread": ``start()``),
    unless it runs already; ``stop`` stops it."""
    if executor.driver is not None:
        return
    if driver == "thread":
        executor.start()
        assert isinstance(executor.driver, ThreadDriver)
        return
    loop = _LOOPS[id(executor)] = LoopThread()
    loop.call(lambda: executor.run_on(loop.loop))
    assert isinstance(executor.driver, LoopDriver)


def stop(executor: Executor) -> bool:
    """Close ``executor`` and the loop it ran on; whether it stopped in time."""
    try:
        return executor.close(WAIT)
    finally:
        loop = _LOOPS.pop(id(executor), None)
        if loop is not None:
            loop.close()


@contextlib.contextmanager
def stopped_after(executor: Executor):
    """``executor``, always stopped (``stop``) after the block."""
    try:
        yield executor
    finally:
        assert stop(executor), "the executor did not stop"
