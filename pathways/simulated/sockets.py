"""The sockets of a simulated Pathways cluster: the clients' and data ports, and the ICI links.

A real cluster moves these messages over ZeroMQ (ROUTER/DEALER request ports, PUSH/PULL ICI);
a simulated one over its ``SimNet``, as the same encoded frames, so what is sent is what would
be sent (its size times the link, its checksum in the trace) and each message is decoded at its
receiver. Each socket belongs to a role (``RoleLoop``): what a handler sends leaves when the
handler ends, and each message that arrives is a handler of the receiving role.

- ``SimSocket``: an address of the net that sends to any other and hands each arrival to
  ``on_frames(sender, frames)``; the sender's address rides as the first frame, as a ROUTER
  socket learns a DEALER's identity.
- ``SimService``: ``pathways.service.RouterService``'s members over a ``SimSocket``: requests
  (batches unpacked) to ``handle(ident, request)``, ``reply(ident, payload)`` back, replies to
  one requester within a handler leaving together.
- ``SimIciLink``: ``pathways.host.ici.IciLink``'s members: values queued in a turn leave as
  one message per peer host at ``flush``; arrivals wake the host's executor (no file
  descriptor). Its link takes no time by default: the device model already books a
  collective's ICI time in the kernel's modelled time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from plaque.logutil import dropped
from plaque.transport import CONTROL
from plaque.wire import ProtocolError

from .. import protocol
from ..host.ici import RECEIVE_BATCH, IciOutbox, decode
from ..service import serve_requests

__all__ = ["COORDINATOR", "SimSocket", "SimService", "SimIciLink"]

COORDINATOR = "coordinator"  # the coordinator's clients' port on the net (a cluster's sim://N)

log = logging.getLogger("pathways.sim.sockets")


class SimSocket:
    """Address ``name`` of ``net``, owned by ``role``: ``send(dst, frames)``; arrivals to
    ``on_frames(sender, frames)``, each a handler of the role."""

    def __init__(self, net, role, name: str, on_frames: Callable[[str, list], None],
                 channel: int = CONTROL):
        self.net, self.role, self.channel = net, role, channel
        self._on_frames = on_frames
        self.transport = net.transport(name)
        self.address = self.transport.address
        self._me = self.address.encode()
        self.closed = False
        self.transport.start(role, self._arrived)

    def _arrived(self, _channel, frames) -> None:
        self._on_frames(bytes(frames[0]).decode(), frames[1:])

    def send(self, dst: str, frames) -> None:
        """Send ``frames`` to the socket at ``dst`` (lost if none is there, as over ZeroMQ
        to a peer that went away); copied now, leaving at the running handler's end."""
        if self.closed:
            return
        copies = [self._me, *(bytes(f) for f in frames)]
        if self.role.in_handler:
            self.role.at_end(lambda end: self.net.post(self.address, dst, self.channel,
                                                       copies, end))
        else:
            self.net.post(self.address, dst, self.channel, copies)

    def close(self) -> None:
        self.closed = True
        self.transport.close()


class SimService:
    """A request port of a simulated role with ``RouterService``'s members (see the module's
    text). ``drained_at``/``waiting``: when requests last waited unread, as the coordinator
    counts client silence only while it could hear."""

    def __init__(self, net, role, name: str, handle, sender: int = protocol.CLIENT,
                 after_batch=None):
        self.handle, self.sender, self.after_batch = handle, sender, after_batch
        self.socket = SimSocket(net, role, name, self._arrived)
        self.role, self.address = role, self.socket.address
        self.loop = None
        self._replies: dict[str, list] = {}  # requester -> replies not sent yet

    def start(self, loop) -> None:
        self.loop = loop  # arrivals are handled from the start: nothing to watch

    @property
    def drained_at(self) -> float:
        return self.socket.transport.heard_until(self.role.time())

    def waiting(self) -> bool:
        """Whether requests have arrived that no handler has read yet."""
        return self.drained_at < self.role.time()

    def _arrived(self, sender: str, frames) -> None:
        serve_requests(sender.encode(), frames, self.handle)
        if self.after_batch is not None:
            self.after_batch()

    def reply(self, ident: bytes, payload) -> None:
        """Send ``payload`` to ``ident``; replies within one handler leave together, packed
        by a handler of their own (as ``RouterService`` packs them in a loop callback)."""
        if self.socket.closed:
            return
        if not self._replies:
            self.role.call_soon(self._send_replies)
        self._replies.setdefault(ident.decode(), []).append(payload)

    def _send_replies(self) -> None:
        replies, self._replies = self._replies, {}
        for dst, payloads in replies.items():
            self.socket.send(dst, protocol.pack(protocol.batch(payloads), self.sender))

    def close(self) -> None:
        self.socket.close()


class SimIciLink(IciOutbox):
    """A simulated host's ICI link with ``IciLink``'s members (see the module's text);
    ``on_arrival()`` is called when values arrive (the host's executor's ``wake``)."""

    fd = None  # nothing to watch: an arrival wakes the executor itself

    def __init__(self, net, role, name: str, worker_of: dict):
        super().__init__(worker_of)
        self.socket = SimSocket(net, role, name, self._arrived)
        self.address = self.socket.address
        self.on_arrival: Callable[[], None] | None = None
        self._inbox: list = []  # frames of each message, decoded when the executor reads

    def transmit(self, worker: int, frames: list) -> None:
        self.socket.send(self.peers[worker], frames)

    def readable(self) -> bool:
        return bool(self._inbox)

    def receive(self) -> list:
        items: list = []
        batch, self._inbox = self._inbox[:RECEIVE_BATCH], self._inbox[RECEIVE_BATCH:]
        for frames in batch:
            try:
                items.extend(decode(frames))
            except ProtocolError as exc:  # a bad message must not stop the link
                dropped(log, "an ICI message", str(exc))
        return items

    def _arrived(self, _sender: str, frames) -> None:
        self._inbox.append(frames)
        if self.on_arrival is not None:
            self.on_arrival()

    def close(self) -> None:
        self.socket.close()
