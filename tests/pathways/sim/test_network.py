"""Tests of the network model (``pathways.sim.network``). No threads, no I/O; every time is
virtual, with dyadic figures so the arithmetic is exact.

What is tested:

- ``Link``: the module docstring's worked example; latency + bytes / bandwidth; FIFO (a small
  message never overtakes a big one; the wire is busy while bytes are on it; an idle link
  sends at once); a delayed message holds back those behind it; infinite bandwidth; bad figures;
- hypothesis: random sends on one link keep arrivals in order, no sooner than latency + bytes /
  bandwidth after the send, with wire intervals that never overlap;
- faults: ``RandomFaults`` drops and delays the same messages for the same seed, draws
  nothing when fault-free, and with ``retransmit`` turns losses into doubling delays (how
  ``SimNet`` applies a hook's faults is tested in test_sim_transport.py).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.sim import Fault, Link, RandomFaults


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


def _faulty_sends(seed: int, faults: RandomFaults) -> list:
    """50 messages sent 0.01 s apart over one link, faults drawn from ``seed``: for each,
    None if it was lost, else when it arrived (as ``SimNet`` sends them)."""
    rng, link, out = random.Random(seed), Link(latency=0.5), []
    for i in range(50):
        fault = faults("src", "sink", 1, rng)
        out.append(None if fault.drop else link.transmit(i * 0.01, 1, fault.delay))
    return out


def test_random_faults_replay_from_the_seed():
    faults = RandomFaults(drop=0.25, delay=0.5, max_delay=4.0)
    sent = _faulty_sends(11, faults)
    assert _faulty_sends(11, faults) == sent
    assert _faulty_sends(12, faults) != sent
    arrived = [t for t in sent if t is not None]
    assert 0 < 50 - len(arrived) < 50
    assert arrived == sorted(arrived) and max(arrived) > 1.0  # some were late, none overtook


def test_random_faults_without_rates_draw_nothing():
    rng = random.Random(1)
    state = rng.getstate()
    assert RandomFaults()("a", "b", 1, rng) == Fault()
    assert rng.getstate() == state
    with pytest.raises(ValueError):
        RandomFaults(drop=1.5)


def test_lost_messages_retransmitted_arrive_late_by_doubling_timeouts():
    """With ``retransmit``, a lost message is sent again after the timeout, then after twice
    that while its copies are lost too: it arrives late by 0.2, 0.6, 1.4... s, never not."""
    faults = RandomFaults(drop=0.5, retransmit=0.2)
    assert None not in _faulty_sends(11, faults)
    assert faults.resent > 0
    rng = random.Random(3)
    lates = {round(faults("a", "b", 1, rng).delay, 9) for _ in range(200)}
    assert {0.0, 0.2, 0.6, 1.4} <= lates <= {round(0.2 * (2**k - 1), 9) for k in range(40)}
    with pytest.raises(ValueError, match="retransmit"):
        RandomFaults(drop=1.0, retransmit=0.2)  # every copy lost: it would never arrive
