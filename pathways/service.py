"""A request/reply socket served on an asyncio loop: the coordinator's client port and each
host's data port.

Requests arrive on a ROUTER socket and are handed to ``handle(ident, request)`` (a batch of
requests sent back to back, one by one); replies go back with ``reply``, those to one
requester within a loop iteration as one message. ZeroMQ's file descriptor is
edge-triggered and shared by both directions, so a send can swallow the edge that announced a
request: after replies the socket is drained again, at most once per loop iteration however
many replies were sent.
"""

from __future__ import annotations

import logging
import time

import zmq

from plaque import security, wire
from plaque.logutil import dropped
from plaque.zmq_transport import bind_socket, readable, recv_frames, send_frames

from . import protocol

log = logging.getLogger("pathways.service")

BATCH = 256  # requests handled before yielding to the loop


def serve_requests(ident: bytes, frames, handle) -> None:
    """Hand each request of one message (a batch unpacked) from ``ident`` to ``handle``; a
    malformed message or a request that fails is logged and dropped, never raised (that
    would stop the socket being served)."""
    try:
        requests = protocol.unbatch(protocol.unpack(frames))
    except Exception as exc:
        dropped(log, "a malformed request", repr(exc))
        return
    for request in requests:
        try:
            handle(ident, request)
        except Exception as exc:
            dropped(log, "a request that could not be handled", repr(exc))


class RouterService:
    """A ROUTER socket served on an event loop: each request (batches unpacked) goes to
    ``handle(ident, request)``; ``reply`` answers the connection it came from."""
    def __init__(self, ctx: zmq.Context, bind: str, handle, sender: int = protocol.CLIENT,
                 after_batch=None):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.address = bind_socket(self.sock, bind)
        self._encrypts = security.encrypts(self.address)  # bind_socket's keys
        self.handle, self.sender, self.after_batch = handle, sender, after_batch
        self.loop = None
        self._scheduled = False
        self.drained_at: float | None = None  # monotonic time the socket was last found empty
        self._replies: dict[bytes, list] = {}  # requester -> replies not sent yet

    def start(self, loop) -> None:
        """Loop thread: begin serving requests."""
        self.loop = loop
        loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain_soon)
        self._drain_soon()

    def _drain_soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        if self.sock.closed:  # a drain scheduled just before close()
            return
        for _ in range(BATCH):
            frames = recv_frames(self.sock)
            if frames is None:
                self.drained_at = time.monotonic()
                break
            serve_requests(frames[0].bytes, frames[1:], self.handle)
        else:
            self._drain_soon()  # more may be waiting: let the loop breathe first
        if self.after_batch is not None:
            self.after_batch()

    def waiting(self) -> bool:
        """Loop thread: whether requests wait unread (then a drain is scheduled)."""
        if self.sock.closed or not readable(self.sock):
            return False
        self._drain_soon()  # reading EVENTS may have consumed the edge that announced them
        return True

    def reply(self, ident: bytes, payload) -> None:
        """Loop thread: send ``payload`` to the requester ``ident``. Replies to one requester
        within a loop iteration leave together, as one message."""
        if self.sock.closed:
            return
        if not self._replies:
            self.loop.call_soon(self._send_replies)
        self._replies.setdefault(ident, []).append(payload)

    def _send_replies(self) -> None:
        replies, self._replies = self._replies, {}
        if self.sock.closed:
            return
        for ident, payloads in replies.items():
            frames = protocol.pack(protocol.batch(payloads), self.sender)
            if self._encrypts:
                frames = wire.chunked(frames)
            send_frames(self.sock, [ident, *frames])
        self._drain_soon()  # a send may have swallowed the readable edge

    def close(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.remove_reader(self.sock.getsockopt(zmq.FD))
            except Exception:
                pass
        self.sock.close(0)
