"""Tests of the network model (``pathways.sim.network``). No threads, no I/O; every time is
virtual, with dyadic figures so the arithmetic is exact.

What is tested:

- ``Link``: the module docstring's worked example; latency + bytes / bandwidth; FIFO (a small
  message never overtakes a big one; the wire is busy while bytes are on it; an idle link
  sends at once); a delayed message holds back those behind it; infinite bandwidth; bad figures;
- hypothesis: random sends on one link keep arrivals in order, no sooner than latency + bytes /
  bandwidth after the send, with wire intervals that never overlap;
- ``Network``: default and connected links, one per direction; a message sent by a handler
  leaves at its end; delivery to a plain endpoint runs as a timer;
- faults: a dropped message never runs and leaves the link alone; a custom hook gets the
  scheduler's seeded ``random``; ``RandomFaults`` drops and delays the same messages for the
  same seed and draws nothing when fault-free.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.sim import Fault, Link, Network, RandomFaults, Scheduler


def test_the_worked_example_of_the_docstring():
    link = Link(latency=0.5, bandwidth=4)
    assert link.transmit(0.0, 2) == 1.0
    assert link.transmit(0.25, 4) == 2.0
    assert link.free_at == 1.5 and link.messages == 2 and link.bytes == 6


def test_a_small_message_does_not_overtake_a_big_one_and_an_idle_link_sends_at_once():
    link = Link(latency=0.125, bandwidth=8)
    big = link.transmit(0.0, 16)  # on the wire 0..2
    small = link.transmit(0.5, 1)  # waits for the wire: 2..2.125
    assert (big, small) == (2.125, 2.25)
    assert link.transmit(10.0, 8) == 11.125  # idle: starts at its send time


def test_a_delayed_message_holds_back_the_ones_behind_it():
    link = Link(latency=1.0)
    assert link.transmit(0.0, 100, extra_delay=5.0) == 6.0
    assert link.transmit(1.0, 100) == 6.0  # would be 2.0: no overtaking
    assert link.transmit(7.0, 100) == 8.0
    assert link.bandwidth == math.inf


def test_a_link_refuses_negative_latency_and_non_positive_bandwidth():
    with pytest.raises(ValueError, match="latency"):
        Link(-1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        Link(0.0, 0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 64)), min_size=1, max_size=30))
def test_random_sends_on_one_link_keep_order_bandwidth_and_latency(sends):
    latency, bandwidth = 0.25, 16
    link = Link(latency, bandwidth)
    t, wire = 0.0, []
    for gap, nbytes in sends:
        t += gap / 4
        arrival = link.transmit(t, nbytes)
        off_wire = arrival - latency
        wire.append((t, off_wire - nbytes / bandwidth, off_wire, arrival))
        assert arrival >= t + latency + nbytes / bandwidth
    arrivals = [a for *_, a in wire]
    assert arrivals == sorted(arrivals)
    for sent, on, _, _ in wire:
        assert on >= sent
    for (_, _, off, _), (_, on, _, _) in zip(wire, wire[1:], strict=False):
        assert on >= off  # one message on the wire at a time


def test_each_direction_has_its_own_link_default_or_connected():
    net = Network(Scheduler(), latency=0.5, bandwidth=2)
    ab, ba = net.link("a", "b"), net.link("b", "a")
    assert ab is not ba and ab is net.link("a", "b")
    assert (ab.latency, ab.bandwidth) == (0.5, 2)
    net.connect("a", "c", latency=0.125, bandwidth=1024)
    assert net.link("c", "a").latency == 0.125 and net.link("a", "c") is not net.link("c", "a")
    net.connect("x", "y", latency=1.0, both=False)
    assert net.link("x", "y").latency == 1.0 and net.link("y", "x").latency == 0.5
    with pytest.raises(ValueError):
        Network(Scheduler(), latency=-1.0)


def test_a_message_sent_by_a_handler_leaves_at_its_end():
    sched = Scheduler()
    net = Network(sched, latency=0.5, bandwidth=4)
    a, b = sched.actor("A", cost=1.0), sched.actor("B", cost=0.25)
    log = []

    def reply():
        log.append(("B", sched.now))

    def work():
        net.send("A", b, 4, reply)  # leaves at 1, on the wire 1..2, arrives 2.5
        net.send("A", "device0", 4, lambda: log.append(("device0", sched.now)))

    a.post(0.0, work)
    sched.run()
    assert log == [("B", 2.5), ("device0", 2.5)]
    assert b.busy_until == 2.75 and net.link("A", "B").messages == 1


def test_a_dropped_message_never_runs_and_leaves_the_link_alone():
    sched = Scheduler()
    net = Network(sched, latency=0.5, faults=lambda src, dst, n, rng: Fault(drop=dst == "B"))
    b, c = sched.actor("B", cost=0.0), sched.actor("C", cost=0.0)
    ran = []
    lost = net.send("A", b, 8, ran.append, "B")
    kept = net.send("A", c, 8, ran.append, "C")
    sched.run()
    assert ran == ["C"] and lost.dropped and not kept.dropped
    assert net.dropped == 1 and net.link("A", "B").messages == 0 and b.handled == 0


def test_a_fault_hook_gets_the_message_and_the_schedulers_random():
    sched = Scheduler(seed=5)
    seen = []

    def hook(src, dst, nbytes, rng):
        seen.append((src, dst, nbytes, rng is sched.random))
        return Fault(delay=2.0)

    net = Network(sched, latency=0.5, faults=hook)
    arrived = []
    net.send("A", "B", 3, lambda: arrived.append(sched.now))
    sched.run()
    assert seen == [("A", "B", 3, True)] and arrived == [2.5]


def _faulty_run(seed: int, faults: RandomFaults) -> list:
    sched = Scheduler(seed)
    net = Network(sched, latency=0.5, faults=faults)
    sink = sched.actor("sink", cost=0.0)
    arrived = []
    handles = [net.send("src", sink, 1, lambda i=i: arrived.append((i, sched.now)))
               for i in range(50)]
    sched.run()
    return [h.dropped for h in handles], arrived


def test_random_faults_replay_from_the_seed():
    faults = RandomFaults(drop=0.25, delay=0.5, max_delay=4.0)
    dropped, arrived = _faulty_run(11, faults)
    assert _faulty_run(11, faults) == (dropped, arrived)
    assert _faulty_run(12, faults) != (dropped, arrived)
    assert 0 < sum(dropped) < 50 and len(arrived) == 50 - sum(dropped)
    assert {i for i, _ in arrived}.isdisjoint(i for i, d in enumerate(dropped) if d)
    times = [t for _, t in arrived]
    assert times == sorted(times) and max(times) > 0.5  # some were late, none overtook


def test_random_faults_without_rates_draw_nothing():
    sched = Scheduler(seed=1)
    state = sched.random.getstate()
    assert RandomFaults()("a", "b", 1, sched.random) == Fault()
    assert sched.random.getstate() == state
    with pytest.raises(ValueError):
        RandomFaults(drop=1.5)


def test_lost_messages_retransmitted_arrive_late_by_doubling_timeouts():
    """With ``retransmit``, a lost message is sent again after the timeout, then after twice
    that while its copies are lost too: it arrives late by 0.2, 0.6, 1.4... s, never not."""
    faults = RandomFaults(drop=0.5, retransmit=0.2)
    dropped, arrived = _faulty_run(11, faults)
    assert not any(dropped) and len(arrived) == 50
    assert faults.resent > 0
    rng = Scheduler(seed=3).random
    lates = {round(faults("a", "b", 1, rng).delay, 9) for _ in range(200)}
    assert {0.0, 0.2, 0.6, 1.4} <= lates <= {round(0.2 * (2**k - 1), 9) for k in range(40)}
    with pytest.raises(ValueError, match="retransmit"):
        RandomFaults(drop=1.0, retransmit=0.2)  # every copy lost: it would never arrive
