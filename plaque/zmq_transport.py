"""The ZeroMQ transport: a PULL socket per channel to receive, PUSH sockets per peer to send.

An endpoint binds two PULL sockets (control and data) and its address is
``"<control endpoint>|<data endpoint>"``; an address with only the control part is enough to
say hello. Receiving drains control before data, and yields to the event loop after a few
milliseconds so that a flood of data cannot starve the turn that flushes progress. Sends never
block: when a peer's queue is at its high-water mark, frames wait in a per-peer backlog that is
retried shortly. Large frames go out and come in without copies (``copy=False``).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import uuid
from collections import deque

import zmq

from . import security, wire
from .transport import Transport
from .wire import CONTROL, DATA

log = logging.getLogger("plaque.transport")

DRAIN_SECONDS = 0.005  # then yield, so the turn that sends what we produced can run
HWM = 100_000
# pyzmq's own socket methods (its Cython class), called past its Python layer: that layer's
# send_multipart and recv_multipart check each frame and do enum arithmetic on every flag, and
# an empty non-blocking read raises zmq.Again (an exception whose constructor imports): about
# 3x the cost of the ZeroMQ calls themselves for a small message, measured. Flags are plain ints.
_send, _recv, _get = zmq.backend.Socket.send, zmq.backend.Socket.recv, zmq.backend.Socket.get
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)


def readable(sock) -> bool:
    """Whether a message waits on ``sock`` (reading this may consume its FD's edge)."""
    return bool(_get(sock, _EVENTS) & _POLLIN)


def recv_frames(sock) -> list | None:
    """The next message waiting on ``sock`` as a list of ``zmq.Frame``s (not copied), or None
    if none waits. Never blocks."""
    if not _get(sock, _EVENTS) & _POLLIN:
        return None
    frames = [_recv(sock, _NOBLOCK, False)]
    while frames[-1].more:  # the rest of a message arrives with its first part
        frames.append(_recv(sock, _NOBLOCK, False))
    return frames


def send_frames(sock, frames, flags: int = 0, copy: bool = False) -> None:
    """Send ``frames`` as one message; ``flags`` and ``copy`` as for ``zmq.Socket.send``
    (uncopied, a large frame's buffer must not change until sent; ``zmq.NOBLOCK`` raises
    zmq.Again at the high-water mark before any part left: ZeroMQ takes a message's later
    parts once it took the first)."""
    last = len(frames) - 1
    more = flags | _SNDMORE
    for i, frame in enumerate(frames):
        _send(sock, frame, more if i < last else flags, copy)


def bind_socket(sock, where: str, keys: str | None = None) -> str:
    """Bind ``sock`` (``tcp://HOST`` picks a free port, ``ipc://DIR/`` and ``inproc://NAME/``
    a fresh name) and return the address peers dial.

    A wildcard bind (``tcp://0.0.0.0``, ``tcp://*``) is announced under this machine's name
    (or ``$PLAQUE_ADVERTISE``), since no peer can dial a wildcard. With keys (the directory
    ``keys``, else ``$PLAQUE_KEYS``) the socket is a CURVE server admitting only the
    cluster's key (``plaque.security``).
    """
    if where.startswith("inproc://"):  # this process only: nothing to authenticate
        if where.endswith("/"):
            where = f"{where}plaque-{uuid.uuid4().hex[:12]}"
        sock.bind(where)
        return where
    security.server(sock, keys)
    if where.startswith("ipc://") and where.endswith("/"):
        where = f"{where}plaque-{uuid.uuid4().hex[:12]}"
    if where.startswith("tcp://") and where.count(":") == 1:
        sock.bind_to_random_port(where)
    else:
        sock.bind(where)
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
        if endpoint.startswith(wildcard):
            name = os.environ.get("PLAQUE_ADVERTISE") or socket.getfqdn()
            endpoint = f"tcp://{name}:{endpoint[len(wildcard):]}"
    return endpoint


def context_for(address: str) -> tuple[zmq.Context, bool]:
    """The ZeroMQ context for sockets of ``address`` and whether the caller owns it (and
    terminates it): ``inproc://`` endpoints are only reachable within one context, so every
    in-process peer shares the process's; anything else gets a context of its own."""
    if security.in_process(address):
        return zmq.Context.instance(), False
    return zmq.Context(), True


class ZmqTransport(Transport):
    """``bind``: ``tcp://HOST`` (random ports), ``ipc://DIR/`` or ``ipc`` (temp dir).
    ``keys``: the CURVE key directory of every socket (default ``$PLAQUE_KEYS``). ``hwm``:
    the high-water mark of every socket, in messages (past it, sends wait in a backlog)."""

    def __init__(self, bind: str = "tcp://127.0.0.1", context: zmq.Context | None = None,
                 keys: str | None = None, hwm: int | None = None):
        if bind == "ipc":
            bind = f"ipc://{tempfile.gettempdir()}/"
        if not bind.startswith(("tcp://", "ipc://")):
            raise ValueError(f"bind address must start with tcp:// or ipc://, got {bind!r}")
        self._own_context = context is None
        self.keys = keys
        self._encrypts = security.encrypts(bind, keys)
        self.hwm = HWM if hwm is None else hwm
        self.ctx = context or zmq.Context()
        self._pull = {}
        for ch in (CONTROL, DATA):
            s = self.ctx.socket(zmq.PULL)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, self.hwm)
            self._pull[ch] = (s, bind_socket(s, bind, keys))
        self.address = f"{self._pull[CONTROL][1]}|{self._pull[DATA][1]}"
        self._push: dict[tuple[int, int], zmq.Socket] = {}
        self._backlog: dict[tuple[int, int], deque] = {}
        self._addresses: dict[int, list[str]] = {}
        self._loop = None
        self._on_message = None
        self._drain_scheduled = False
        self._drained_at = None  # when a drain last found both sockets empty
        self._retry_scheduled = False
        self.closed = False

    def start(self, loop, on_message):
        self._loop, self._on_message = loop, on_message
        for s, _ in self._pull.values():
            loop.add_reader(s.getsockopt(zmq.FD), self._schedule_drain)
        self._schedule_drain()

    def _schedule_drain(self):
        if not self._drain_scheduled and not self.closed:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self):
        self._drain_scheduled = False
        if self.closed:
            return
        ctl, data = self._pull[CONTROL][0], self._pull[DATA][0]
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            frames = recv_frames(ctl)
            if frames is not None:
                self._on_message(CONTROL, frames)
            elif (frames := recv_frames(data)) is not None:
                self._on_message(DATA, frames)
            else:
                self._drained_at = time.monotonic()
                return  # both drained: the next edge of either FD wakes us
            if self.closed:  # a handler may close us
                return
        self._schedule_drain()  # budget used up: let the loop run a turn, then go on

    def heard_until(self, now):
        ctl, data = self._pull[CONTROL][0], self._pull[DATA][0]
        if self.closed or not (readable(ctl) or readable(data)):
            return now
        self._schedule_drain()  # reading EVENTS may have consumed the edge that says so
        return now if self._drained_at is None else self._drained_at

    def connect(self, peer, address):
        parts = address.split("|")[:2]
        old = self._addresses.get(peer, [])
        for i, (ch, where) in enumerate(zip((CONTROL, DATA), parts)):
            if i < len(old) and old[i] == where:
                continue
            sock = self._push.pop((peer, ch), None)
            if sock is not None:
                sock.close(0)
            self._backlog.pop((peer, ch), None)  # meant for the old address
            s = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, self.hwm)
            security.client(s, self.keys)
            try:
                s.connect(where)
            except zmq.ZMQError as exc:  # a garbled address: the peer stays unreachable
                s.close(0)
                log.warning("cannot reach peer %s at %r: %s", peer, where, exc)
                continue
            self._push[(peer, ch)] = s
        self._addresses[peer] = parts + old[len(parts):]

    def disconnect(self, peer):
        self._addresses.pop(peer, None)
        for ch in (CONTROL, DATA):
            sock = self._push.pop((peer, ch), None)
            if sock is not None:
                sock.close(0)
            self._backlog.pop((peer, ch), None)

    def send(self, peer, channel, frames):
        key = (peer, channel)
        sock = self._push.get(key)
        if sock is None:
            if peer not in self._addresses:
                raise KeyError(f"unknown peer {peer}")
            return  # peer announced without a data address yet: nothing can reach it
        if self._encrypts:
            frames = wire.chunked(frames)
        backlog = self._backlog.get(key)
        if backlog:
            backlog.append(frames)
            return
        try:
            send_frames(sock, frames, _NOBLOCK)
        except zmq.Again:
            self._backlog.setdefault(key, deque()).append(frames)
            self._schedule_retry()

    def backlogged(self) -> int:
        """Messages waiting here because their peer's queue was full."""
        return sum(map(len, self._backlog.values()))

    def _schedule_retry(self):
        if not self._retry_scheduled and self._loop is not None:
            self._retry_scheduled = True
            self._loop.call_later(0.001, self._retry)

    def _retry(self):
        self._retry_scheduled = False
        for key, backlog in list(self._backlog.items()):
            sock = self._push.get(key)
            while backlog and sock is not None:
                try:
                    send_frames(sock, backlog[0], _NOBLOCK)
                except zmq.Again:
                    break
                backlog.popleft()
            if not backlog or sock is None:
                del self._backlog[key]
        if self._backlog:
            self._schedule_retry()

    def thread_sender(self, address):
        sock = self.ctx.socket(zmq.PUSH)  # its own: a ZeroMQ socket belongs to one thread
        sock.setsockopt(zmq.LINGER, 0)
        security.connect(sock, address.split("|")[0], self.keys)

        def send(frames):
            try:
                send_frames(sock, frames, _NOBLOCK, copy=True)
            except zmq.Again:
                pass

        return send, lambda: sock.close(0)

    def close(self):
        if self.closed:
            return
        self.closed = True
        for s, where in self._pull.values():
            if self._loop is not None and not self._loop.is_closed():
                try:
                    self._loop.remove_reader(s.getsockopt(zmq.FD))
                except Exception:
                    pass
            s.close(0)
            if where.startswith("ipc://"):
                try:
                    os.unlink(where[len("ipc://"):])
                except OSError:
                    pass
        for s in self._push.values():
            s.close(0)
        self._push.clear()
        if self._own_context:
            security.release(self.ctx)
            self.ctx.term()
