"""The inter-chip links between hosts: collective contributions go host to host directly.

Each host binds one PULL socket; a receiver thread puts what arrives straight into the host's
Rendezvous, where the waiting device thread picks it up. Device threads send on their own
PUSH sockets (ZeroMQ sockets belong to one thread), gathering what one exchange sends to each
host into one message that leaves just before the device starts waiting. Neither direction
passes through an event loop, so a collective between hosts costs one network hop.
"""

from __future__ import annotations

import logging
import threading

import zmq

from plaque import security, wire
from plaque.logutil import dropped
from plaque.zmq_transport import bind_socket

from . import protocol

log = logging.getLogger("pathways.ici")


class IciLink:
    def __init__(self, ctx: zmq.Context, bind: str, rendezvous):
        self.ctx, self.rendezvous = ctx, rendezvous
        self._pull = ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self.address = bind_socket(self._pull, bind)
        self.peers: dict[int, str] = {}  # worker id -> ICI address
        self._local = threading.local()
        self._sockets: list[zmq.Socket] = []
        self._sockets_lock = threading.Lock()
        self.sent = {"messages": 0, "bytes": 0}  # what left for other hosts (under the lock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="ici-receiver",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _receive(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                items = protocol.unpack(self._pull.recv_multipart(copy=False))[1]
                for key, src, dst, value in items:
                    self.rendezvous.deliver(key, src, dst, value)
            except Exception as exc:  # a bad message must not stop the link
                dropped(log, "an ICI message", repr(exc))

    # ---- device threads -------------------------------------------------------------------
    def send(self, worker: int, key, src, dst, value) -> None:
        """Queue one contribution for ``worker``; it leaves at this thread's next flush."""
        out = getattr(self._local, "out", None)
        if out is None:
            out = self._local.out = {}
        out.setdefault(worker, []).append((key, src, dst, value))

    def flush(self) -> None:
        """Send this thread's queued contributions, one message per destination host."""
        out = getattr(self._local, "out", None)
        if not out:
            return
        self._local.out = {}
        for worker, items in out.items():
            frames = protocol.pack(("ici", items))
            self._socket(worker).send_multipart(frames, copy=False)
            with self._sockets_lock:
                self.sent["messages"] += 1
                self.sent["bytes"] += wire.frame_bytes(frames)

    def _socket(self, worker: int) -> zmq.Socket:
        socks = getattr(self._local, "socks", None)
        if socks is None:
            socks = self._local.socks = {}
        s = socks.get(worker)
        if s is None:
            s = socks[worker] = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            security.client(s)
            s.connect(self.peers[worker])
            with self._sockets_lock:
                self._sockets.append(s)
        return s

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        with self._sockets_lock:
            for s in self._sockets:
                s.close(0)
        self._pull.close(0)
