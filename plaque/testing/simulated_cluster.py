"""A coordinator and workers as plain state machines joined by in-memory FIFO queues.

One ``CoordinatorCore`` and W ``WorkerCore`` state machines talk through one FIFO queue per
(sender, receiver, channel), which is exactly what a transport guarantees, and nothing more.
No sockets, threads, clocks or event loop: delivering a message means ``receive`` on the
destination, then ``step`` (workers) and ``take_commands`` (and ``take_events`` for the
coordinator), whose sends are appended to the queues. ``choose`` picks which non-empty queue
delivers next, so a test (or hypothesis) decides how messages from different senders and on
the DATA and CONTROL channels interleave, while each queue stays in order.
"""

from __future__ import annotations

from collections import Counter, deque

from .. import wire
from ..commands import Connect, Send
from ..coordinator import CoordinatorCore
from ..events import Installed
from ..worker import WorkerCore

__all__ = ["COORD", "SimulatedCluster"]

COORD = "c"  # the coordinator's address; workers are "w0", "w1", ...


class SimulatedCluster:
    """A coordinator (``coord``) and ``num_workers`` workers (``cores["w0"]``, ...).

    ``choose(n)`` picks the index of the next of ``n`` non-empty queues to deliver; the
    coordinator's events collect in ``events`` (and go to ``on_event`` as they happen);
    ``sent`` counts the messages sent by ``wire.Kind``.
    """

    def __init__(self, num_workers: int, choose=lambda n: 0):
        self.choose = choose
        self.coord = CoordinatorCore()
        self.cores = {COORD: self.coord}
        self.routes = {COORD: {}}  # endpoint -> peer id -> address (from Connect)
        self.queues: dict[tuple, deque] = {}
        self.events: list = []
        self.sent = Counter()  # message kinds sent, decoded from the frames
        self.on_event = None  # called with each coordinator event as it happens
        for i in range(num_workers):
            name = f"w{i}"
            self.routes[name] = {}
            self.cores[name] = WorkerCore(name, COORD)
            self.collect(name)

    def collect(self, name: str) -> None:
        """Carry out an endpoint's commands: sends go to the queues, connects to routes."""
        core = self.cores[name]
        for cmd in core.take_commands():
            if type(cmd) is Send:
                dst = self.routes[name][cmd.peer]  # KeyError: a send to a peer never announced
                self.sent[wire.decode(cmd.frames)[0]] += 1
                self.queues.setdefault((name, dst, cmd.channel), deque()).append(cmd.frames)
            elif type(cmd) is Connect:
                self.routes[name][cmd.peer] = cmd.address
            else:
                raise AssertionError(f"{name} unexpectedly issued {cmd!r}")
        if core is self.coord:
            for ev in self.coord.take_events():
                self.events.append(ev)
                if self.on_event is not None:
                    self.on_event(ev)

    def pending(self) -> list[tuple]:
        """The (src, dst, channel) of every non-empty queue."""
        return [key for key, q in self.queues.items() if q]

    def deliver_one(self) -> None:
        keys = self.pending()
        self.deliver(*keys[self.choose(len(keys))])

    def deliver(self, src: str, dst: str, channel: int) -> None:
        """Deliver the first message of one queue, and carry out what it caused."""
        core = self.cores[dst]
        core.receive(self.queues[(src, dst, channel)].popleft())
        if core is not self.coord:
            core.step()
        self.collect(dst)

    def run(self, limit: int | None = None) -> int:
        """Deliver until the network is empty (or ``limit`` deliveries); returns the count."""
        n = 0
        while self.pending() and (limit is None or n < limit):
            self.deliver_one()
            n += 1
        return n

    def workers(self) -> list[WorkerCore]:
        return [c for name, c in self.cores.items() if name != COORD]

    def join(self) -> None:
        """Handshake: HELLO / WELCOME / PEERS until every worker knows every other."""
        self.run()
        assert len(self.coord.live_workers()) == len(self.workers())
        assert all(w.id is not None for w in self.workers())

    def install(self, graph) -> int:
        """Install ``graph`` and deliver until it is installed everywhere; its id."""
        gid = self.coord.install(graph)
        self.collect(COORD)
        self.run()
        assert Installed(gid, None) in self.events, self.events
        return gid

    def start(self, gid: int, arg):
        """Start a run (its START messages are queued, not delivered); its timestamp."""
        t = self.coord.start(gid, arg)
        self.collect(COORD)
        return t
