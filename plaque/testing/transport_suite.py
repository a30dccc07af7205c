"""The conformance suite every ``Transport`` must pass.

The engine relies on a transport for exactly what ``plaque.transport.Transport`` promises:
FIFO delivery per (sender, receiver, channel), multi-frame messages intact, large frames
carried as they are, control never queued behind bulk data, sends that never raise for a dead
peer nor block the loop, KeyError for an unknown peer, idempotent close and re-pointing a peer
with ``connect``. Subclass ``TransportConformance`` with a ``make_transport`` and name the
subclass ``Test...``: pytest runs every test of the suite against it, each on a fresh uvloop
loop (or the loop the subclass's ``make_loop`` gives), every transport closed and the loop
closed even when the test fails; every wait has a deadline, so a lost message fails the test
instead of hanging it.

>>> class TestMyTransport(TransportConformance):
...     def make_transport(self):
...         return MyTransport()
"""

from __future__ import annotations

import asyncio
import random
import threading

import numpy as np
import uvloop

from .. import wire
from ..wire import CONTROL, DATA

__all__ = ["DEADLINE", "TransportConformance", "TransportNet"]

DEADLINE = 5.0  # seconds; generous, since everything here is local


class TransportNet:
    """Transports made by ``make`` on one loop (a fresh uvloop unless ``loop`` is given), each
    with an ``inbox`` of ``(channel, [bytes...])``; a context manager that closes them all,
    and the loop."""

    def __init__(self, make, loop=None):
        self.make = make
        self.loop = uvloop.new_event_loop() if loop is None else loop
        # Exceptions inside loop callbacks (e.g. a transport's receive handler) are otherwise
        # only logged; collect them so that the test fails.
        self.loop_errors: list = []
        self.loop.set_exception_handler(lambda loop, ctx: self.loop_errors.append(ctx))
        self.transports: list = []

    def unstarted(self):
        """A transport that is closed with the others but not started."""
        t = self.make()
        self.transports.append(t)
        return t

    def endpoint(self, on_message=None):
        """A started transport; without ``on_message`` it records copies into its inbox."""
        t = self.unstarted()
        t.inbox = []
        if on_message is None:
            def on_message(channel, frames, inbox=t.inbox):
                inbox.append((channel, [bytes(f) for f in frames]))
        t.start(self.loop, on_message)
        return t

    def pair(self):
        """Two endpoints, A knowing B as peer 1."""
        a, b = self.endpoint(), self.endpoint()
        a.connect(1, b.address)
        return a, b

    def run_until(self, cond, timeout: float = DEADLINE) -> None:
        async def poll():
            while not cond():
                await asyncio.sleep(0.001)

        try:
            self.loop.run_until_complete(asyncio.wait_for(poll(), timeout))
        except TimeoutError:
            raise AssertionError(f"condition not met within {timeout} s") from None
        assert not self.loop_errors, self.loop_errors

    def settle(self, seconds: float = 0.1) -> None:
        """Let the loop run a while, for checking that nothing (more) arrives."""
        self.loop.run_until_complete(asyncio.sleep(seconds))
        assert not self.loop_errors, self.loop_errors

    def close(self) -> None:
        for t in self.transports:
            t.close()
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def msg(tag: bytes, i: int) -> list:
    """A message whose frame count (3-5) and sizes vary with ``i``, always with an empty
    frame."""
    frames = [tag, i.to_bytes(4, "big"), b""]
    frames += [bytes([i % 256]) * (i % 97 + j) for j in range(i % 3)]
    return frames


def seq(frames) -> int:
    return int.from_bytes(frames[1], "big")


def seqs(inbox, channel=None, tag=None) -> list:
    """Sequence numbers of the messages in ``inbox``, optionally of one channel / sender tag."""
    return [seq(f) for ch, f in inbox
            if (channel is None or ch == channel) and (tag is None or f[0] == tag)]


def raises_key_error(fn, *args) -> None:
    try:
        fn(*args)
    except KeyError:
        return
    raise AssertionError(f"{fn.__name__}{args!r:.60} did not raise KeyError")


class TransportConformance:
    """The suite; a subclass says how to make its transport and what else it promises.

    ``control_overtakes_data``: True when control sent after a flood of data arrives before
    the end of it (separate queues per channel), False when delivery follows send order
    across channels, None to check neither.
    """

    control_overtakes_data: bool | None = None

    def make_transport(self):
        """A new, unstarted transport."""
        raise NotImplementedError

    def make_small_queue_transport(self):
        """A transport whose queues fill after a few messages (default: ``make_transport``)."""
        return self.make_transport()

    def queued_locally(self, transport) -> int | None:
        """How many sends wait inside ``transport`` for room (None: it cannot tell)."""
        return None

    def make_loop(self):
        """The event loop a test's transports run on (default: a fresh uvloop loop); a
        simulated transport gives its virtual-time loop. Called before any transport is made."""
        return uvloop.new_event_loop()

    def net(self, make=None) -> TransportNet:
        loop = self.make_loop()
        return TransportNet(make or self.make_transport, loop)

    # ---- ordering and integrity -----------------------------------------------------------

    def test_fifo_and_frames_intact(self):
        with self.net() as net:
            a, b = net.pair()
            n = 1000
            for i in range(n):
                a.send(1, DATA, msg(b"a", i))
            net.run_until(lambda: len(b.inbox) >= n)
            assert [f for _, f in b.inbox] == [msg(b"a", i) for i in range(n)]
            assert {ch for ch, _ in b.inbox} == {DATA}

    def test_a_thread_sends_on_control_through_its_own_sender(self):
        """What the heartbeat thread uses while its loop is busy: another thread sends to a
        peer's address (its CONTROL part), and the frames arrive on CONTROL, in order."""
        with self.net() as net:
            a, b = net.pair()
            send, close = a.thread_sender(b.address)
            try:
                sender = threading.Thread(
                    target=lambda: [send(msg(b"beat", i)) for i in range(20)])
                sender.start()
                sender.join(DEADLINE)
                net.run_until(lambda: len(b.inbox) == 20)
                assert [ch for ch, _ in b.inbox] == [CONTROL] * 20
                assert [f for _, f in b.inbox] == [msg(b"beat", i) for i in range(20)]
            finally:
                close()
            dead = net.endpoint()
            where = dead.address
            dead.close()
            send, close = a.thread_sender(where)
            try:
                send(msg(b"lost", 0))  # nobody there: dropped, never raises nor blocks
            finally:
                close()

    def test_fifo_per_channel_with_both_channels_interleaved(self):
        with self.net() as net:
            a, b = net.pair()
            rng = random.Random(7)
            sent = {CONTROL: 0, DATA: 0}
            for _ in range(1000):
                ch = rng.choice((CONTROL, DATA))
                a.send(1, ch, msg(b"a", sent[ch]))
                sent[ch] += 1
            net.run_until(lambda: len(b.inbox) >= 1000)
            # Order only holds within a channel; across channels there is no promise.
            for ch in (CONTROL, DATA):
                assert seqs(b.inbox, ch) == list(range(sent[ch]))
            assert all(f == msg(b"a", seq(f)) for _, f in b.inbox)

    def test_large_array_out_of_band(self):
        with self.net() as net:
            got = []
            a = net.endpoint()
            b = net.endpoint(lambda ch, frames: got.append(frames))
            a.connect(1, b.address)
            array = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
            frames = wire.encode(wire.Kind.DATA, 3, {"x": array, "n": 1})
            assert len(frames) == 3  # header, body, the array's own frame
            a.send(1, DATA, frames)
            net.run_until(lambda: got)
            assert len(got[0]) == 3 and memoryview(got[0][2]).nbytes == array.nbytes
            kind, sender, payload = wire.decode(got[0])
            assert (kind, sender, payload["n"]) == (wire.Kind.DATA, 3, 1)
            np.testing.assert_array_equal(payload["x"], array)

    def test_control_not_stuck_behind_bulk(self):
        with self.net() as net:
            channels = []
            a = net.endpoint()
            b = net.endpoint(lambda ch, frames: channels.append(ch))  # no copies: 200 MiB
            a.connect(1, b.address)
            n, chunk = 200, bytes(1 << 20)
            for _ in range(n):
                a.send(1, DATA, [chunk])
            a.send(1, CONTROL, [b"urgent"])
            net.run_until(lambda: len(channels) >= n + 1)
            assert channels.count(DATA) == n and channels.count(CONTROL) == 1
            data_before_control = channels.index(CONTROL)
            if self.control_overtakes_data is True:
                # Separate queues per channel and a receiver that drains control first.
                assert data_before_control < n
            elif self.control_overtakes_data is False:
                # Delivery in send order: control comes right after the data queued before it.
                assert data_before_control == n

    def test_fan_in_keeps_per_sender_order(self):
        with self.net() as net:
            a, c, b = net.endpoint(), net.endpoint(), net.endpoint()
            a.connect(1, b.address)
            c.connect(1, b.address)
            n = 500
            for i in range(n):
                a.send(1, DATA, msg(b"a", i))
                c.send(1, DATA, msg(b"c", i))
            net.run_until(lambda: len(b.inbox) >= 2 * n)
            assert seqs(b.inbox, tag=b"a") == list(range(n))
            assert seqs(b.inbox, tag=b"c") == list(range(n))

    def test_fifo_through_backlog_at_high_water_mark(self):
        # With tiny queues, sends hit a full queue and wait in the transport's own backlog;
        # order must survive that and send must still not block.
        with self.net(self.make_small_queue_transport) as net:
            a, b = net.pair()
            n = 400
            for i in range(n):
                a.send(1, DATA, [b"a", i.to_bytes(4, "big"), bytes(4096)])
            queued = self.queued_locally(a)
            if queued is not None:  # send returned without waiting: the rest is queued here
                assert queued > 0 and b.inbox == []
            net.run_until(lambda: len(b.inbox) >= n)
            assert seqs(b.inbox) == list(range(n))

    # ---- peers, errors and lifecycle ------------------------------------------------------

    def test_unknown_and_disconnected_peer_raise_key_error(self):
        with self.net() as net:
            a, b = net.pair()
            raises_key_error(a.send, 2, DATA, [b"x"])
            a.disconnect(1)
            raises_key_error(a.send, 1, CONTROL, [b"x"])
            a.disconnect(1)  # forgetting a forgotten peer is harmless
            net.settle(0.05)
            assert b.inbox == []

    def test_close_is_idempotent(self):
        with self.net() as net:
            a, b = net.pair()
            a.close()
            a.close()
            unstarted = net.unstarted()
            unstarted.close()
            unstarted.close()

    def test_send_to_closed_peer_neither_raises_nor_blocks(self):
        with self.net() as net:
            a, b = net.pair()
            a.send(1, DATA, [b"before"])
            net.run_until(lambda: b.inbox)
            b.close()
            for i in range(2000):  # a blocking send would hang here until the time limit
                a.send(1, DATA, msg(b"a", i))
                a.send(1, CONTROL, msg(b"a", i))
            # The loop keeps turning: a timer set now fires on time.
            fired = []
            net.loop.call_later(0.01, fired.append, True)
            net.run_until(lambda: fired, timeout=1.0)
            net.settle(0.05)
            assert b.inbox == [(DATA, [b"before"])]

    def test_connect_to_new_address_redirects(self):
        with self.net() as net:
            a, b = net.pair()
            c = net.endpoint()
            for i in range(10):
                a.send(1, DATA, msg(b"a", i))
            net.run_until(lambda: len(b.inbox) >= 10)
            a.connect(1, c.address)
            for i in range(10, 20):
                a.send(1, DATA, msg(b"a", i))
                a.send(1, CONTROL, msg(b"a", i))
            net.run_until(lambda: len(c.inbox) >= 20)
            net.settle(0.05)
            assert seqs(b.inbox) == list(range(10))
            assert seqs(c.inbox, DATA) == seqs(c.inbox, CONTROL) == list(range(10, 20))
            a.connect(1, c.address)  # the same address again changes nothing
            a.send(1, DATA, msg(b"a", 20))
            net.run_until(lambda: len(c.inbox) >= 21)

    def test_close_inside_on_message_stops_delivery(self):
        with self.net() as net:
            got = []

            def on_message(channel, frames):
                got.append(channel)
                b.close()  # e.g. a STOP message handled synchronously

            a = net.endpoint()
            b = net.endpoint(on_message)
            a.connect(1, b.address)
            for _ in range(3):
                a.send(1, CONTROL, [b"stop"])
            net.run_until(lambda: got)
            net.settle(0.1)
            assert got == [CONTROL]

    def test_messages_sent_before_receiver_starts_are_delivered(self):
        with self.net() as net:
            a = net.endpoint()
            b = net.unstarted()
            a.connect(1, b.address)
            a.send(1, DATA, [b"early"])
            net.settle(0.05)
            got = []
            b.start(net.loop, lambda ch, frames: got.append([bytes(f) for f in frames]))
            net.run_until(lambda: got, timeout=0.5)
            assert got == [[b"early"]]
