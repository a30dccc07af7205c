"""A client's I/O with the cluster: one event-loop thread that owns every socket.

User calls hand the loop work and return at once: ``send`` queues a message (messages sent back
to back leave together, one per address, with one wake of the loop), ``request`` sends one and
returns a future for its reply. The loop reads replies, answers requests, hands the rest (the
ends of runs, failed installs) to the client, and tells the coordinator every second that the
client lives; a coordinator silent for ``coordinator_timeout`` fails everything in flight.
What the messages mean is the client's business (``pathways.client.client``).

Until the coordinator first answers, a monitor on its socket says how far the connection got
(``Contact``): a handshake the coordinator refuses (keys missing, or given to a cluster without
any) fails the first request at once, and a silence is explained by what the connection saw,
so the error says whether nothing listens there or the keys are what is missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

import uvloop
import zmq
from zmq.utils.monitor import recv_monitor_message

from plaque import security, wire
from plaque.zmq_transport import context_for, recv_frames, send_frames

from .. import protocol
from ..errors import ClientClosed, CoordinatorLost, received

log = logging.getLogger("pathways.client.session")

PING_INTERVAL = 1.0  # seconds between the client's "alive" messages to the coordinator

# what a monitor tells of the way to the coordinator: a refused handshake is final (the two
# ends do not agree on keys); a dropped one (NO_DETAIL) is what wrong keys look like, or a
# coordinator going down mid-handshake, so it only explains a silence
_REFUSED = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_CONTACT_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class Contact:
    """How far the connection to the coordinator got before its first answer, from the
    socket's monitor events; ``no_answer`` says what that means to a user. ``keys``: the key
    directory this client connects with (None: none); ``monitored``: False where no monitor
    reports (an in-process address), so nothing is known."""

    def __init__(self, keys: str | None, monitored: bool = True):
        self.keys, self.monitored = keys, monitored
        self.connected = False  # a connection was accepted at the address
        self.handshake: str | None = None  # "succeeded", "dropped" or "refused"

    def on_event(self, event: int) -> bool:
        """Record a monitor event; True when the handshake was refused (nothing will get
        through: fail now rather than at the timeout)."""
        if event == zmq.EVENT_CONNECTED:
            self.connected = True
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.handshake = "succeeded"
        elif event in _REFUSED:
            self.handshake = "refused"
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self.handshake != "succeeded":
            self.handshake = "dropped"
        return self.handshake == "refused"

    def no_answer(self, address: str, wait: float | None = None) -> str:
        """Why no coordinator answered at ``address`` (within ``wait`` seconds, if given):
        the cluster gone or unreachable first; keys only when they are what is wrong."""
        within = "" if wait is None else f" within {wait:g} s"
        return f"no coordinator answered at {address}{within}: {self._why()}"

    def _why(self) -> str:
        if not self.monitored:
            return "is the address right, and is the cluster running?"
        if self.handshake in ("refused", "dropped"):
            if self.keys is None:
                return ("it requires the cluster's CURVE keys and none were given: connect"
                        " with the address the cluster printed (tcp://HOST:PORT?keys=DIR),"
                        f" keys=DIR or ${security.ENV}")
            if self.handshake == "refused":
                return (f"it refused the keys in {self.keys}: it runs without keys"
                        " (--insecure), or its keys are not these")
            return f"it refused the keys in {self.keys}: they are not this cluster's"
        if not self.connected:
            return ("nothing accepts connections there: the cluster has stopped, or the"
                    " address is wrong or unreachable from here")
        if self.handshake == "succeeded":
            return ("something accepted the connection but sent nothing back: is this the"
                    " address the cluster printed (its coordinator's, not a host's)?")
        return "a connection was made but its handshake never finished"


def split_address(address: str) -> tuple[str, str | None]:
    """``plaque.security.split_address``, and a simulated cluster's ``sim://N`` (which names
    no keys: nothing outside its process reaches it)."""
    if str(address).startswith("sim://"):
        return str(address), None
    return security.split_address(address)


def refuse_stopped(address: str, keys: str | None = None) -> None:
    """Raise ``CoordinatorLost`` if ``address`` is a Unix socket (``ipc://PATH``) that is not
    there, or names a key directory (``?keys=DIR``) that is gone and no other ``keys`` are
    given: the cluster that printed the address has stopped, since a local cluster removes
    its sockets and keys when it stops. That is the news, not a timeout or missing keys."""
    endpoint, named = split_address(address)
    if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://"):]):
        raise CoordinatorLost(
            f"the cluster at {endpoint} has stopped: its socket is gone, as a local cluster's"
            " are once it stops (or this machine does not see it); start the cluster again"
            " and use the address it prints")
    if keys is None and named is not None and not os.path.exists(named):
        raise CoordinatorLost(
            f"the cluster at {endpoint} has stopped: the key directory its address names"
            f" ({named}) is gone, as a local cluster's is once it stops (or this machine"
            " does not see it); start the cluster again and use the address it prints")


# address scheme -> what opens a session at such an address, for clusters not reached over
# ZeroMQ: a simulated cluster (``pathways.sim``) registers "sim" when it starts
OPENERS: dict[str, Callable[..., Session]] = {}


def no_simulated_cluster(address: str) -> CoordinatorLost:
    """The error for a ``sim://N`` address no simulated cluster of this process serves."""
    return CoordinatorLost(f"no simulated cluster at {address}: it has stopped, or was"
                           " started in another process (a simulated cluster lives in the"
                           " process that started it, pw.local_cluster(simulate=True), only"
                           " while it runs)")


def open_session(address: str, keys: str | None, coordinator_timeout: float, for_client,
                 on_message, on_lost) -> Session:
    """A ``Session`` with the coordinator at ``address`` (arguments as ``Session``'s), or
    the one its scheme's opener makes (``OPENERS``)."""
    scheme = address.split("://", 1)[0]
    opener = OPENERS.get(scheme)
    if opener is None and scheme == "sim":
        raise no_simulated_cluster(address)
    return (opener or Session)(address, keys, coordinator_timeout, for_client, on_message,
                               on_lost)


class Session:
    """``address``: the coordinator's; ``keys``: the CURVE key directory (None: plain).
    ``on_message(msg)`` gets, on the loop thread, every message of a class in ``for_client``
    (runs ending, installs failing, the coordinator's notices);
    ``on_lost(err)`` is told, on the loop thread, that everything in flight fails with
    ``err`` (the coordinator went silent, or the client closed)."""

    def __init__(self, address: str, keys: str | None, coordinator_timeout: float,
                 for_client, on_message, on_lost):
        self.address, self.keys = address, keys
        self.coordinator_timeout = coordinator_timeout
        self._for_client, self._on_message = tuple(for_client), on_message
        self._on_lost = on_lost
        self._socks: dict[str, zmq.Socket] = {}
        self._chunked: set[str] = set()  # addresses whose socket uses CURVE (wire.chunked)
        self._pending: dict[int, tuple[cf.Future, str]] = {}  # request -> (future, sent to)
        self._lost_hosts: dict[str, Exception] = {}  # data address of a lost host -> why
        self._req_ids = itertools.count()
        self._outbox: deque = deque()  # (address, payload) for the loop thread to send
        self._flush_posted = False
        self.closed = False
        self._posting = threading.Lock()  # held to post to the loop and to close: what was
        # posted runs before the close's stop, which fails what is still in flight
        self.lost: CoordinatorLost | None = None  # set when the coordinator went silent
        self.contact = Contact(keys, monitored=not security.in_process(address))
        self._monitor: zmq.Socket | None = None  # on the coordinator's socket until it answers
        self._client_id = None
        self.open_io()
        self._heard = self.loop.time()

    # ---- the I/O half: what a simulated session (``pathways.simulated.session``) gives
    # instead: open_io, transmit and close, and it calls received and fail_all
    def open_io(self) -> None:
        """Make ``loop`` and start serving it (here: ZeroMQ sockets on a thread of its
        own)."""
        self.ctx, self._own_ctx = context_for(self.address)
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="pathways-client",
                                        daemon=True)
        self._thread.start()

    def future(self, what: str | None = None) -> cf.Future:
        """A new future for what the user will wait on (replies, runs, saves); ``what`` it
        stands for (a simulated session's futures name it when a wait for it times out)."""
        return cf.Future()

    def on_loop_thread(self) -> bool:
        """Whether the caller runs on the session's loop (a done callback), which must
        never wait for what the loop itself settles."""
        return threading.current_thread() is self._thread

    def clock(self) -> float:
        """The client's time in seconds (monotonic; a simulated session's is virtual)."""
        return time.perf_counter()

    def token(self) -> str:
        """A fresh name of 12 hex digits for what the client makes (a checkpoint's temporary
        directory); a simulated session draws it from its seed."""
        return uuid.uuid4().hex[:12]

    def spawn(self, fn, name: str) -> None:
        """Run ``fn()`` (blocking work the loop thread must not wait for, e.g. a suspension
        the coordinator asked for) on a thread of its own."""
        threading.Thread(target=fn, name=name, daemon=True).start()

    def blocking_executor(self) -> cf.Executor:
        """Where the client does blocking work off the loop thread (awaiting an array,
        committing a checkpoint)."""
        return cf.ThreadPoolExecutor(2, thread_name_prefix="pathways-await")

    # ---- any thread -----------------------------------------------------------------------
    def call(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the loop thread; fails at once once closed or lost."""
        with self._posting:
            self.check_open()
            self.loop.call_soon_threadsafe(fn, *args)

    def check_open(self) -> None:
        """``ClientClosed`` once closed, the ``CoordinatorLost`` error once lost."""
        if self.closed:
            raise ClientClosed("this client is closed")
        if self.lost is not None:  # each raise starts a fresh traceback: raising the one
            raise self.lost.with_traceback(None)  # error again would grow it every time

    def send(self, address, payload) -> None:
        """Send ``payload`` to ``address``. Messages sent back to back (a loop of calls, a
        burst of deletes) leave together, one message per address, with one wake of the
        loop thread."""
        self.check_open()
        self._outbox.append((address, payload))
        if not self._flush_posted:
            self._flush_posted = True
            self.call(self._flush)

    def request(self, address, msg: protocol.Message) -> cf.Future:
        """Send the request ``msg`` (its ``req`` filled in here); the future gets the value
        of its ``Answer``, or the error it was ``Refused`` with."""
        req = next(self._req_ids)
        who = "the coordinator" if address == self.address else address
        fut = self.future(f"{who}'s answer to {type(msg).__name__}")
        lost = self._lost_hosts.get(address)
        if lost is not None:
            fut.set_exception(lost)
            return fut
        self._pending[req] = (fut, address)
        self.send(address, dataclasses.replace(msg, req=req))
        return fut

    def first_answer(self, msg: protocol.Message, wait: float):
        """Send the coordinator the request ``msg`` and return its answer; ``CoordinatorLost``
        saying what the connection saw if none comes within ``wait`` seconds, or at once if
        the coordinator refuses the handshake."""
        try:
            return self.request(self.address, msg).result(wait)
        except cf.TimeoutError:
            raise CoordinatorLost(self.contact.no_answer(self.address, wait)) from None

    def start_pings(self, client_id: int) -> None:
        """Begin telling the coordinator that client ``client_id`` lives."""
        self._client_id = client_id
        self.loop.call_soon_threadsafe(self._ping)

    def close(self, err: Exception) -> None:
        """Stop: everything still in flight fails with ``err``; queued sends still leave."""
        def stop():
            self.fail_all(err)
            self.loop.stop()

        with self._posting:
            self.closed = True
            self.loop.call_soon_threadsafe(stop)
        self._thread.join(10)
        if self._own_ctx:
            self.ctx.term()

    # ---- loop thread ----------------------------------------------------------------------
    def _serve(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self._unmonitor()
        for s in self._socks.values():
            s.close(linger=1000)  # let queued deletes reach the hosts
        self.loop.close()

    def _sock(self, address: str) -> zmq.Socket:
        s = self._socks.get(address)
        if s is None:
            s = self._socks[address] = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            if address == self.address and self.contact.monitored:
                self._monitor = s.get_monitor_socket(_CONTACT_EVENTS)
                self.loop.add_reader(self._monitor.getsockopt(zmq.FD), self._on_contact)
                self._on_contact()  # its FD signals only once a read found nothing
            security.connect(s, address, self.keys)
            if security.encrypts(address, self.keys):  # decided once, as the socket is made
                self._chunked.add(address)
            self.loop.add_reader(s.getsockopt(zmq.FD), self._drain, s)
        return s

    def _on_contact(self):
        """The coordinator socket's monitor: a refused handshake fails what waits for the
        coordinator now (it would only time out)."""
        while self._monitor is not None:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if self.contact.on_event(event):
                self._fail_coordinator_requests(
                    CoordinatorLost(self.contact.no_answer(self.address)))

    def _fail_coordinator_requests(self, err: Exception) -> None:
        for req, (fut, address) in list(self._pending.items()):
            if address == self.address:
                del self._pending[req]
                if not fut.done():
                    fut.set_exception(err)

    def _unmonitor(self):
        """The coordinator answered (or the session ends): no more need to watch the way."""
        if self._monitor is None:
            return
        monitor, self._monitor = self._monitor, None
        self.loop.remove_reader(monitor.getsockopt(zmq.FD))
        self._socks[self.address].disable_monitor()
        monitor.close(linger=0)

    def _drain(self, s):
        while (frames := recv_frames(s)) is not None:
            coordinator = s is self._socks.get(self.address)
            if coordinator:
                self._unmonitor()
            self.received(frames, from_coordinator=coordinator)

    def received(self, frames, from_coordinator: bool = False) -> None:
        """The replies of one message from a coordinator or host, each to ``_on_reply``
        (loop thread); ``from_coordinator``: it came from the coordinator, which is heard
        from (what the coordinator's silence is counted from)."""
        if from_coordinator:
            self._heard = self.loop.time()
        try:
            for reply in protocol.unbatch(protocol.unpack(frames)):
                self._on_reply(reply)
        except Exception:
            log.exception("bad reply")

    def _on_reply(self, msg):
        if isinstance(msg, self._for_client):
            self._on_message(msg)
        elif isinstance(msg, protocol.HostLostNotice):
            self._lost_hosts[msg.data] = msg.error
            for req, (fut, address) in list(self._pending.items()):
                if address == msg.data:
                    del self._pending[req]
                    if not fut.done():
                        fut.set_exception(msg.error)
        elif isinstance(msg, (protocol.Answer, protocol.Refused)):
            fut, _ = self._pending.pop(msg.req, (None, None))
            if fut is None:
                return
            if isinstance(msg, protocol.Refused):
                fut.set_exception(received(msg.error, of_run=False))
            else:
                fut.set_result(msg.value)
        else:
            log.warning("unexpected message %s", type(msg).__name__)

    def _ping(self):
        """Tell the coordinator this client is alive (it frees everything of a client silent
        for its ``--client-timeout``)."""
        if self.closed or self.lost is not None:
            return
        silent = self.loop.time() - self._heard
        if silent > self.coordinator_timeout:
            self._coordinator_lost(f"no word from the coordinator at {self.address} for"
                                   f" {silent:.1f} s")
            return
        self.transmit(self.address, protocol.Ping(self._client_id))
        self.loop.call_later(PING_INTERVAL, self._ping)

    def _coordinator_lost(self, reason: str) -> None:
        """Fail everything in flight; later calls fail at once."""
        log.warning("%s", reason)
        self.lost = CoordinatorLost(reason)
        self.fail_all(self.lost)

    def fail_all(self, err: Exception) -> None:
        """Every run and request still waiting fails with ``err``."""
        self._on_lost(err)
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()

    def _flush(self):
        """Send what ``send`` queued, in order, one message per address."""
        self._flush_posted = False
        batches: dict[str, list] = {}
        while self._outbox:
            address, payload = self._outbox.popleft()
            batches.setdefault(address, []).append(payload)
        for address, payloads in batches.items():
            self.transmit(address, protocol.batch(payloads))

    def chunks(self, address: str) -> bool:
        """Whether messages to ``address`` leave chunked (``plaque.wire.chunked``): its socket
        uses CURVE. Decided when the socket was made; False before."""
        return address in self._chunked

    def transmit(self, address, payload) -> None:
        """Send ``payload`` to ``address`` now (loop thread)."""
        s = self._sock(address)
        frames = protocol.pack(payload)
        if self.chunks(address):
            frames = wire.chunked(frames)
        send_frames(s, frames)
        # A send can consume the edge of the socket's FD that announced an incoming message
        # (ZeroMQ's FD is edge-triggered and shared by both directions): look again.
        self._drain(s)
