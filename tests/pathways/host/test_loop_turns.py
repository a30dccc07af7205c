"""An executor on its host's event loop gives the loop its say between long kernel bodies.

A host's loop carries Plaque (its ticks judge whether the coordinator is still there) as well
as the devices. Bodies that each run longer than a turn's budget must not run back to back in
one loop callback: after each the turn ends, the loop polls its sockets and runs what they
bring, and a later turn starts the next body. Real time, one device, bodies of 0.1 s (twice
the budget); nothing asserts timing. Whether a read lands before the very next body or one
later depends on the machine's load (the next turn is a 1 ms timer, which libuv may run
before polling when the process was descheduled that long), so what is checked is that each
body has a turn of its own and that the loop reads while bodies are still queued.
"""

from __future__ import annotations

import os
import threading
import time

from executor_drivers import WAIT, start, stopped_after

from pathways.host.device import DeviceWork
from pathways.host.executor import TURN_BUDGET, Executor

BODY = 2 * TURN_BUDGET


class Sleeper(DeviceWork):
    """Notes its start in ``events``, pokes the loop's pipe, then holds the thread."""

    def __init__(self, events: list, poke: int, done: threading.Event):
        self.events, self.poke, self.done = events, poke, done

    def execute(self, device) -> float:
        self.events.append("body")
        os.write(self.poke, b"x")  # the loop sees it only once it gets its turn
        time.sleep(BODY)
        return 0.0

    def on_done(self, finish) -> None:
        self.done.set()


def test_the_loop_reads_its_sockets_between_long_bodies():
    executor = Executor("test-host")
    device = executor.add_device(0)
    events: list = []
    read, poke = os.pipe()
    os.set_blocking(read, False)

    def drain():
        os.read(read, 64)
        events.append("read")

    def on_readable():  # as the ZeroMQ transport does: the reader schedules the drain
        loop.call_soon(drain)

    turn = executor.turn

    def counted_turn():  # the driver calls executor.turn once per loop callback
        events.append("turn")
        turn()

    executor.turn = counted_turn
    try:
        with stopped_after(executor):
            start(executor)
            loop = executor.driver.loop
            ready = threading.Event()
            loop.call_soon_threadsafe(lambda: (loop.add_reader(read, on_readable),
                                               ready.set()))
            assert ready.wait(WAIT)
            done = [threading.Event() for _ in range(3)]
            for seq, finished in enumerate(done):
                device.enqueue(seq, Sleeper(events, poke, finished))
            for finished in done:
                assert finished.wait(WAIT), events
            assert device.wait_idle(WAIT)
            loop.call_soon_threadsafe(loop.remove_reader, read)
    finally:
        os.close(read)
        os.close(poke)
    bodies = [i for i, e in enumerate(events) if e == "body"]
    assert len(bodies) == 3, events
    for a, b in zip(bodies, bodies[1:]):
        assert "turn" in events[a:b], events  # the next body came in a turn of its own
    assert "read" in events[bodies[0]:bodies[-1]], events  # read while bodies were queued
