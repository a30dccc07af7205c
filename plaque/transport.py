"""The transport interface, and its in-process twin.

A transport moves lists of frames between endpoints, on two channels per peer pair: ``DATA``
for bulk tuples and ``CONTROL`` for progress, heartbeats and housekeeping, so that control is
never queued behind bulk data. Delivery is FIFO per (sender, receiver, channel); there is no
ordering between channels. ``send`` never blocks the event loop.

``InprocTransport`` connects endpoints living in one process (any threads) through a
registry; it copies every frame, as a socket would, so that senders and receivers never
share memory. ``ZmqTransport`` (``zmq_transport.py``) is the real one. Both pass the same
conformance suite (``plaque.testing.TransportConformance``).
"""

from __future__ import annotations

import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from .wire import CONTROL, DATA

__all__ = ["Transport", "InprocTransport", "CONTROL", "DATA"]

OnMessage = Callable[[int, list], None]


class Transport(ABC):
    """Moves lists of frames between endpoints, on two channels (DATA and CONTROL) per peer
    pair, FIFO per (sender, receiver, channel); ``send`` never blocks the loop. Peers are
    small ints, made reachable with ``connect``. Every implementation passes
    ``plaque.testing.TransportConformance``."""

    address: str  # where peers reach this endpoint

    @abstractmethod
    def start(self, loop, on_message: OnMessage) -> None:
        """Begin delivering received messages as ``on_message(channel, frames)`` on ``loop``."""

    @abstractmethod
    def connect(self, peer: int, address: str) -> None:
        """Make ``peer`` reachable at ``address`` (replacing an older address)."""

    @abstractmethod
    def disconnect(self, peer: int) -> None:
        """Forget ``peer``; anything still queued for it is dropped."""

    @abstractmethod
    def send(self, peer: int, channel: int, frames: list) -> None:
        """Queue ``frames`` for ``peer``; raises KeyError for an unknown peer."""

    @abstractmethod
    def close(self) -> None:
        """Stop receiving and release resources; idempotent."""

    @abstractmethod
    def thread_sender(self, address: str):
        """``(send, close)`` for a thread other than the loop's (the heartbeat thread) to send
        frames to the CONTROL endpoint at ``address`` (a peer's address, or its first part);
        ``send`` never blocks and drops what cannot leave at once or has nowhere to go."""

    def heard_until(self, now: float) -> float:
        """The latest time (``time.monotonic``) at which no received message waited here
        unhandled: ``now`` if none waits now. A peer's silence is only counted up to then
        (``plaque.liveness``)."""
        return now


_registry: dict[str, InprocTransport] = {}
_registry_lock = threading.Lock()
_names = itertools.count()


class InprocTransport(Transport):
    """Endpoints of this process (any threads), found by ``address`` in a registry; every
    frame is copied, as a socket would, and delivered on the receiver's loop."""

    def __init__(self, name: str | None = None):
        self.address = f"inproc-{next(_names)}" if name is None else name
        self._peers: dict[int, str] = {}
        self._loop = None
        self._on_message: OnMessage | None = None
        self._early: list = []  # messages that arrived before start(), as a socket queues them
        self._queued = 0  # messages sent to us and not yet delivered
        self._drained_at = None  # when the last of them was delivered
        self._lock = threading.Lock()
        with _registry_lock:
            if self.address in _registry:
                raise ValueError(f"in-process address {self.address!r} is taken")
            _registry[self.address] = self

    def start(self, loop, on_message):
        with self._lock:
            self._loop, self._on_message = loop, on_message
            early, self._early = self._early, []
        for channel, frames in early:
            loop.call_soon_threadsafe(self._deliver, channel, frames)

    def connect(self, peer, address):
        self._peers[peer] = address.split("|")[0]

    def disconnect(self, peer):
        self._peers.pop(peer, None)

    def send(self, peer, channel, frames):
        self._post(self._peers[peer], channel, frames)

    def thread_sender(self, address):
        name = address.split("|")[0]
        return (lambda frames: self._post(name, CONTROL, frames)), (lambda: None)

    @staticmethod
    def _post(address, channel, frames):
        """Deliver to the endpoint at ``address`` on its loop; any thread."""
        target = _registry.get(address)
        if target is None:
            return  # like a socket to a dead peer: the message is lost
        copies = [bytes(f) for f in frames]
        with target._lock:
            loop = target._loop
            if loop is not None and loop.is_closed():
                return
            target._queued += 1
            if loop is None:
                target._early.append((channel, copies))
                return
        loop.call_soon_threadsafe(target._deliver, channel, copies)

    def heard_until(self, now):
        return now if self._queued == 0 or self._drained_at is None else self._drained_at

    def _deliver(self, channel, frames):
        with self._lock:
            self._queued -= 1
            if self._queued == 0:
                self._drained_at = time.monotonic()
        if self._on_message is not None:
            self._on_message(channel, frames)

    def close(self):
        self._on_message = None
        with _registry_lock:
            _registry.pop(self.address, None)
