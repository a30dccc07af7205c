"""``SimTransport``: Plaque's transport conformance suite on one virtual-time loop, and the
link model's times, ordering and faults as seen through the transport."""

import math

import pytest

from pathways.sim import Fault, SimNet, VirtualTimeLoop
from plaque.testing import TransportConformance
from plaque.wire import CONTROL, DATA


class TestSimTransport(TransportConformance):
    # Ideal links: data takes no time, so everything arrives at once, in send order.
    control_overtakes_data = False
    latency, bandwidth = 0.0, math.inf

    def make_loop(self):
        self.loop = VirtualTimeLoop(stall_timeout=1.0)
        self.sim = SimNet(self.loop, self.latency, self.bandwidth)
        return self.loop

    def make_transport(self):
        return self.sim.transport()


class TestSimTransportOnSlowLinks(TestSimTransport):
    # 1 ms latency, 1 GB/s: 200 MiB of data take 0.2 virtual s, within the suite's deadlines;
    # control has its own link, so it overtakes that flood.
    control_overtakes_data = True
    latency, bandwidth = 1e-3, 1e9


def started(sim, n):
    """``n`` started endpoints recording ``(virtual time, channel, frames)``."""
    out = []
    for _ in range(n):
        t = sim.transport()
        t.got = []
        t.start(sim.loop, lambda ch, frames, got=t.got: got.append((sim.loop.time(), ch, frames)))
        out.append(t)
    return out


def drain(loop, seconds=100.0):
    loop.run_until_complete(_sleep(seconds))


async def _sleep(seconds):
    import asyncio

    await asyncio.sleep(seconds)


@pytest.fixture
def loop():
    loop = VirtualTimeLoop(stall_timeout=0)
    yield loop
    loop.close()


def test_arrival_is_the_link_model(loop):
    """Latency 0.5 s, 4 B/s: 2 bytes at t=0 arrive at 1.0; 4 bytes sent at t=0.25 wait for
    the wire (0.5..1.5) and arrive at 2.0 (the worked example of ``pathways.sim.network``)."""
    sim = SimNet(loop, latency=0.5, bandwidth=4.0)
    a, b = started(sim, 2)
    a.connect(1, b.address)
    a.send(1, DATA, [b"x", b"y"])
    loop.call_at(0.25, a.send, 1, DATA, [b"abcd"])
    drain(loop)
    assert [(t, ch, f) for t, ch, f in b.got] == [(1.0, DATA, [b"x", b"y"]),
                                                  (2.0, DATA, [b"abcd"])]


def test_channels_are_separate_links(loop):
    sim = SimNet(loop, latency=0.1, bandwidth=100.0)
    a, b = started(sim, 2)
    a.connect(1, b.address)
    a.send(1, DATA, [bytes(100)])  # 1 s on the wire
    a.send(1, CONTROL, [bytes(10)])  # its own link: not behind the data
    drain(loop)
    assert [(round(t, 9), ch) for t, ch, _ in b.got] == [(0.2, CONTROL), (1.1, DATA)]


def test_equal_arrival_times_keep_send_order_across_senders(loop):
    sim = SimNet(loop, latency=0.25)
    *senders, b = started(sim, 4)
    for s in senders:
        s.connect(1, b.address)
    for i in range(30):
        senders[i % 3].send(1, DATA, [bytes([i])])
    drain(loop)
    assert [f[0][0] for _, _, f in b.got] == list(range(30))
    assert {t for t, _, _ in b.got} == {0.25}


def test_frames_are_copied_at_send(loop):
    sim = SimNet(loop, latency=1.0)
    a, b = started(sim, 2)
    a.connect(1, b.address)
    buf = bytearray(b"before")
    a.send(1, DATA, [buf])
    buf[:] = b"after!"
    drain(loop)
    assert b.got[0][2] == [b"before"]


def test_faults_drop_and_delay_from_the_hook(loop):
    def faults(src, dst, nbytes, rng):
        return Fault(drop=nbytes == 1) if nbytes < 3 else Fault(delay=2.0)

    sim = SimNet(loop, latency=1.0, faults=faults)
    a, b = started(sim, 2)
    a.connect(1, b.address)
    a.send(1, DATA, [b"x"])  # dropped
    a.send(1, DATA, [b"xy"])  # on time
    a.send(1, CONTROL, [b"xyz"])  # 2 s late
    drain(loop)
    assert [(t, f) for t, _, f in b.got] == [(1.0, [b"xy"]), (3.0, [b"xyz"])]
    assert sim.dropped == 1


def test_heard_until_is_the_oldest_arrived_undelivered_message(loop):
    sim = SimNet(loop, latency=1.0)
    a, b = started(sim, 2)
    a.connect(1, b.address)
    a.send(1, DATA, [b"x"])
    assert b.heard_until(0.5) == 0.5  # still on the wire: not in our inbox
    assert b.heard_until(5.0) == 1.0  # arrived at 1.0, and the loop has not handed it over
    drain(loop)
    assert b.heard_until(loop.time()) == loop.time()


def test_per_pair_figures_and_recorded_deliveries(loop):
    sim = SimNet(loop, latency=1.0, record=True)
    a, b, c = started(sim, 3)
    sim.connect(a.address, c.address, latency=0.125)
    a.connect(1, b.address)
    a.connect(2, c.address)
    a.send(1, DATA, [b"ab"])
    a.send(2, CONTROL, [b"abc"])
    drain(loop)
    got = [(d.time, d.src, d.dst, d.channel, d.nbytes) for d in sim.deliveries]
    assert got == [(0.125, a.address, c.address, CONTROL, 3),
                   (1.0, a.address, b.address, DATA, 2)]


def test_start_on_another_loop_is_refused(loop):
    sim = SimNet(loop)
    other = VirtualTimeLoop()
    try:
        with pytest.raises(ValueError, match="one virtual clock"):
            sim.transport().start(other, lambda ch, f: None)
    finally:
        other.close()
