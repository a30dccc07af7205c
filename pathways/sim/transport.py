"""Plaque's transport on virtual time: messages take the time a modelled link gives them.

A ``SimNet`` is the network of one simulated cluster: it knows every ``SimTransport`` by
address, gives each (sender, receiver, channel) its own ``Link`` (latency, bandwidth, FIFO),
draws seeded faults and can record every delivery. All its endpoints share ONE event loop, a
``VirtualTimeLoop``, so there is one clock: a send at virtual time t of n bytes (the frames'
total length) arrives when ``Link.transmit(t, n)`` says, and is delivered there by a loop timer.

Why one link per channel: the real transport has a socket per channel, so control is never
queued behind bulk data, and a control message overtakes a flood of data. Frames are copied at
send, as a socket would. Messages that arrive at the same virtual time are delivered in send
order (a sequence number breaks ties; asyncio's timer heap alone would not keep FIFO).

Started on a role's view of the loop (``pathways.sim.roles.RoleLoop``), an endpoint runs on
that role's virtual CPU: each delivered message is a handler of its own, it starts at
max(arrival, the role's CPU free), and what the handler sends leaves at its end.

``heard_until`` is the arrival time of the oldest message that has arrived but is not yet
delivered (the loop was busy past it), else ``now``: a message still on the wire is not in our
inbox, so it is not our fault that we have not heard it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import zlib
from collections.abc import Callable
from typing import NamedTuple

from plaque.transport import CONTROL, Transport

from .network import NO_FAULT, FaultHook, Link

__all__ = ["Delivery", "SimNet", "SimTransport"]


class Delivery(NamedTuple):
    """One message handed to a receiver: when, who to whom, on which channel, its size and a
    checksum of its frames (so two runs can be compared message by message)."""

    time: float
    src: str
    dst: str
    channel: int
    nbytes: int
    crc: int


class SimNet:
    """The simulated network of one cluster, on ``loop`` (a ``VirtualTimeLoop``).

    Pairs without their own figures (``connect``) get those ``model(src, dst)`` gives, if
    given and not None, else ``Link(latency, bandwidth)``, per direction and channel.
    ``faults(src, dst, nbytes, rng) -> Fault`` (``pathways.sim``'s
    hook) is drawn from ``random`` (seeded by ``seed``) as each message leaves. With
    ``record``, ``deliveries`` lists every ``Delivery`` in the order they happened.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, latency: float = 0.0,
                 bandwidth: float = math.inf, *, seed: int = 0,
                 faults: FaultHook | None = None, record: bool = False,
                 model: Callable[[str, str], tuple[float, float] | None] | None = None):
        Link(latency, bandwidth)  # checks the figures now
        self.loop = loop
        self.latency, self.bandwidth = latency, bandwidth
        self.model = model  # (src, dst) -> (latency, bandwidth), or None for the default
        self.random = random.Random(seed)
        self.faults = faults
        self.dropped = 0
        self.deliveries: list[Delivery] | None = [] if record else None
        self._figures: dict[tuple[str, str], tuple[float, float]] = {}
        self._links: dict[tuple[str, str, int], Link] = {}
        self._endpoints: dict[str, SimTransport] = {}
        self._names = itertools.count()
        self._order = itertools.count()  # ties between equal arrival times: send order

    def transport(self, name: str | None = None) -> SimTransport:
        """A new, unstarted endpoint of this network."""
        return SimTransport(self, name)

    def connect(self, a: str, b: str, latency: float, bandwidth: float = math.inf, *,
                both: bool = True) -> None:
        """Model a -> b (and b -> a if ``both``) with these figures, on both channels; call
        before the first message between them."""
        Link(latency, bandwidth)
        self._figures[(a, b)] = (latency, bandwidth)
        if both:
            self._figures[(b, a)] = (latency, bandwidth)

    def link(self, src: str, dst: str, channel: int) -> Link:
        """The link src -> dst on ``channel`` (created on first use)."""
        found = self._links.get((src, dst, channel))
        if found is None:
            figures = self._figures.get((src, dst)) or (
                self.model and self.model(src, dst)) or (self.latency, self.bandwidth)
            found = self._links[(src, dst, channel)] = Link(*figures)
        return found

    def _register(self, transport: SimTransport, name: str | None) -> str:
        address = f"sim-{next(self._names)}" if name is None else name
        if address in self._endpoints:
            raise ValueError(f"simulated address {address!r} is taken")
        self._endpoints[address] = transport
        return address

    def _unregister(self, address: str) -> None:
        self._endpoints.pop(address, None)

    def post(self, src: str, dst: str, channel: int, frames: list,
             departure: float | None = None) -> None:
        """Send ``frames`` from ``src`` to the endpoint at ``dst`` at ``departure`` (default
        now; loop thread only); lost, like a socket's, when nobody is there or a fault drops
        it."""
        target = self._endpoints.get(dst)
        if target is None:
            return
        copies = [bytes(f) for f in frames]
        nbytes = sum(len(f) for f in copies)
        fault = self.faults(src, dst, nbytes, self.random) if self.faults else NO_FAULT
        if fault.drop:
            self.dropped += 1
            return
        at = self.loop.time() if departure is None else departure
        arrival = self.link(src, dst, channel).transmit(at, nbytes, fault.delay)
        target._arrive(arrival, next(self._order), src, channel, copies)

    def _delivered(self, src: str, dst: str, channel: int, frames: list) -> None:
        if self.deliveries is not None:
            crc = 0
            for f in frames:
                crc = zlib.crc32(f, crc)
            self.deliveries.append(Delivery(self.loop.time(), src, dst, channel,
                                            sum(len(f) for f in frames), crc))


class SimTransport(Transport):
    """An endpoint of a ``SimNet``; passes ``plaque.testing.TransportConformance``. Control
    overtakes data on links that take time (one link per channel); on ideal links everything
    arrives at once, in send order."""

    def __init__(self, net: SimNet, name: str | None = None):
        self.net = net
        self.address = net._register(self, name)
        self._peers: dict[int, str] = {}
        self._on_message: Callable | None = None
        self._closed = False
        self._inbox: list = []  # heap of (arrival, order, src, channel, frames)
        self._timer: asyncio.TimerHandle | None = None
        self._loop = None  # what ``start`` was given: the net's loop, or a role's view of it
        self._role = None  # that ``RoleLoop``, if it was one

    def start(self, loop, on_message) -> None:
        if loop is not self.net.loop and getattr(loop, "loop", None) is not self.net.loop:
            raise ValueError("a SimTransport runs on its SimNet's loop (one virtual clock)")
        self._loop, self._role = loop, (None if loop is self.net.loop else loop)
        self._on_message = on_message
        self._arm()  # what arrived before start, as a socket queues it (nothing: no handler)

    def connect(self, peer, address) -> None:
        self._peers[peer] = address.split("|")[0]

    def disconnect(self, peer) -> None:
        self._peers.pop(peer, None)

    def send(self, peer, channel, frames) -> None:
        dst = self._peers[peer]
        if self._role is None or not self._role.in_handler:
            self.net.post(self.address, dst, channel, frames)
            return
        # on a role's CPU: the message leaves when the handler sending it ends
        copies = [bytes(f) for f in frames]
        self._role.at_end(lambda end: self.net.post(self.address, dst, channel, copies, end))

    def thread_sender(self, address):
        """Any thread: the send is handed to the loop, and leaves at its virtual time."""
        dst, post, loop = address.split("|")[0], self.net.post, self.net.loop

        def send(frames):
            copies = [bytes(f) for f in frames]
            try:
                loop.call_soon_threadsafe(post, self.address, dst, CONTROL, copies)
            except RuntimeError:
                pass  # the loop is closed: nowhere to go
        return send, (lambda: None)

    def heard_until(self, now: float) -> float:
        if self._inbox and self._inbox[0][0] <= now:
            return self._inbox[0][0]
        return now

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_message = None
        self._inbox.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.net._unregister(self.address)

    # ---- receiving (loop thread) -----------------------------------------------------------
    def _arrive(self, arrival: float, order: int, src: str, channel: int, frames: list) -> None:
        heapq.heappush(self._inbox, (arrival, order, src, channel, frames))
        if self._inbox[0][1] == order:  # a new earliest arrival: re-arm the timer
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inbox and self._on_message is not None:
            self._timer = self._loop.call_at(self._inbox[0][0], self._deliver_due)

    def _deliver_due(self) -> None:
        self._timer = None
        now = self.net.loop.time()
        try:
            while self._inbox and self._inbox[0][0] <= now and self._on_message is not None:
                _, _, src, channel, frames = heapq.heappop(self._inbox)
                self.net._delivered(src, self.address, channel, frames)
                self._on_message(channel, frames)
                if self._role is not None:
                    break  # on a role's CPU, each message is a handler of its own
        finally:
            if not self._closed:
                self._arm()
