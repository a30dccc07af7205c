"""Failure detection under load, deterministically: the coordinator's and the worker's liveness
checks driven with injected times, no sockets or clocks (``plaque.liveness``).

A busy machine must never make a healthy peer look dead: heartbeats that wait unread in our own
inbox (we were stalled, or behind a backlog) are not the peer's silence. A really dead peer is
still declared dead within a bounded time. Nor may a busy loop hide a dead peer: a worker whose
loop runs long operators back to back (a host's kernel bodies) is running, not stalled, and
notices a dead coordinator within its timeout (plus the operator running then)."""

import pytest

from plaque import wire
from plaque.commands import Exit
from plaque.coordinator import CoordinatorCore
from plaque.events import Membership
from plaque.liveness import GRACE_TIMEOUTS, STALL, Listening, StallMeter
from plaque.wire import COORDINATOR, UNKNOWN_SENDER, Kind
from plaque.worker import WorkerCore

TIMEOUT = 3.0
TICK = 0.1
BEAT = 0.5


def joined(at: float = 0.0) -> CoordinatorCore:
    """A coordinator with worker 0 joined and stamped at time ``at``."""
    core = CoordinatorCore("coordinator", heartbeat_timeout=TIMEOUT)
    core.receive(wire.encode(Kind.HELLO, UNKNOWN_SENDER, ("tcp://w0:1|tcp://w0:2", {})))
    core.tick(at, at)
    core.take_commands()
    core.take_events()
    return core


def beat(core: CoordinatorCore, now: float) -> None:
    core.receive(wire.encode(Kind.HEARTBEAT, 0, now))


def lost(core: CoordinatorCore) -> bool:
    return core.live_workers() == []


def ticks(start: float, end: float):
    """Tick times from ``start`` (exclusive) to ``end`` (inclusive), every TICK."""
    n = round((end - start) / TICK)
    return [start + TICK * (i + 1) for i in range(n)]


def test_listening_counts_up_to_the_last_empty_inbox_within_the_grace():
    listening = Listening(grace=10.0)
    assert listening.tick(1.0) == (0.0, 1.0)
    assert listening.tick(1.1, 0.5) == (0.0, 0.5)  # a backlog: silence counts up to 0.5
    assert listening.tick(30.0, 0.5)[1] == 20.0  # at most ``grace`` behind now
    assert listening.tick(30.1, 31.0)[1] == 30.1  # never ahead of now
    late = 30.1 + TICK + 0.9 * STALL
    assert listening.tick(late)[0] == 0.0  # late, but running: it counts
    blind, _ = listening.tick(40.0, 35.0)
    assert blind == pytest.approx(40.0 - late - TICK)  # stalled: the delay is forgiven


def test_a_dead_worker_is_lost_after_the_timeout_when_the_coordinator_keeps_up():
    core = joined()
    for now in ticks(0.0, TIMEOUT):
        core.tick(now, now)
        assert not lost(core)
    core.tick(TIMEOUT + TICK, TIMEOUT + TICK)
    assert lost(core)
    assert Membership([]) in core.take_events()


def test_a_stalled_coordinator_keeps_a_worker_whose_beats_wait_in_its_inbox():
    core = joined()
    for now in ticks(0.0, 1.0):  # beating every 0.5 s, heard at once
        if round(now / TICK) % round(BEAT / TICK) == 0:
            beat(core, now)
        core.tick(now, now)
    # our loop stalls for 5 s; the worker's beats queue up unread: the inbox is not empty
    core.tick(6.0, 1.0)
    assert not lost(core)
    for now in ticks(6.0, 7.0):  # the backlog is read: the worker was alive all along
        beat(core, now)
        core.tick(now, now)
    assert not lost(core)


def test_a_stalled_coordinator_forgives_its_own_stall_even_if_the_inbox_looks_empty():
    # woken up before the I/O thread moved the worker's beats into the inbox
    core = joined()
    core.tick(1.0, 1.0)
    core.tick(6.0, 6.0)
    assert not lost(core)
    beat(core, 6.05)
    core.tick(6.1, 6.1)
    assert not lost(core)


def test_a_backlog_defers_the_verdict_but_a_dead_worker_is_lost_within_the_grace():
    core = joined()
    grace = GRACE_TIMEOUTS * TIMEOUT
    end = TIMEOUT + grace
    for now in ticks(0.0, end - 2 * TICK):  # ticking, but the inbox never empties after 1.0
        core.tick(now, min(now, 1.0))
        assert not lost(core), now
    for now in ticks(end - 2 * TICK, end + 2 * TICK):
        core.tick(now, 1.0)
    assert lost(core)


def test_a_dead_worker_is_lost_after_a_stall_once_the_coordinator_listens_again():
    core = joined()
    core.tick(1.0, 1.0)
    core.tick(10.0, 10.0)  # stalled 9 s; nothing arrived
    assert not lost(core)
    now = 10.0
    while not lost(core):
        now += TICK
        core.tick(now, now)
        assert now < 10.0 + TIMEOUT, "a dead worker outlived a full timeout of listening"


def test_a_stalled_worker_keeps_its_coordinator_while_the_beats_wait_in_its_inbox():
    worker = WorkerCore("tcp://w0:1|tcp://w0:2", "tcp://c:1|tcp://c:2", coordinator_timeout=10.0)
    worker.receive(wire.encode(Kind.WELCOME, COORDINATOR, (0, "")))
    worker.tick(0.0, 0.0)
    worker.tick(30.0, 0.0)  # our loop stalled 30 s with the coordinator's beats unread
    worker.receive(wire.encode(Kind.HEARTBEAT, COORDINATOR, 29.0))
    worker.tick(30.1, 30.1)
    assert not worker.exited
    for now in ticks(30.1, 39.9):  # then the coordinator really goes silent
        worker.tick(now, now)
        assert not worker.exited
    worker.tick(40.2, 40.2)
    assert worker.exited
    assert any(isinstance(c, Exit) for c in worker.take_commands())


def joined_worker() -> WorkerCore:
    worker = WorkerCore("tcp://w0:1|tcp://w0:2", "tcp://c:1|tcp://c:2", coordinator_timeout=10.0)
    worker.receive(wire.encode(Kind.WELCOME, COORDINATOR, (0, "")), 0.0)
    return worker


def test_the_stall_meter_counts_only_late_wake_ups_and_a_stall_under_way():
    meter = StallMeter(0.0, interval=BEAT)
    for i in range(1, 10):  # on time (or a little late): no stall
        meter.woke(i * BEAT + 0.1)
    assert meter.stalled(5.0) == 0.0
    # stopped from 5.0 to 20.0: counted before the thread wakes, and no more after
    during = meter.stalled(20.0)
    assert during == pytest.approx(20.0 - 4.6 - BEAT)
    meter.woke(20.05)
    assert meter.stalled(20.05) == pytest.approx(during + 0.05)
    meter.woke(20.05 + BEAT)
    assert meter.stalled(21.0) == pytest.approx(during + 0.05)


def test_a_worker_busy_in_long_operators_notices_a_dead_coordinator():
    """Each tick comes 5 s late (the loop ran an operator), the process never stalled (the
    meter says 0): that is silence, and the worker exits once it passes the timeout."""
    worker = joined_worker()
    worker.tick(0.0, 0.0, 0.0)
    for now in (5.0, 10.0):
        worker.tick(now, now, 0.0)
        assert not worker.exited
    worker.tick(15.0, 15.0, 0.0)
    assert worker.exited


def test_a_stopped_worker_forgives_its_stall_by_the_meter():
    worker = joined_worker()
    worker.tick(0.0, 0.0, 0.0)
    worker.tick(30.0, 30.0, 29.5)  # stopped 29.5 s; the I/O thread has not caught up yet
    assert not worker.exited
    worker.receive(wire.encode(Kind.HEARTBEAT, COORDINATOR, 30.0), 30.05)
    worker.tick(30.1, 30.1, 29.5)
    assert not worker.exited


def test_a_message_counts_from_when_it_was_handled_not_the_next_tick():
    """The coordinator's last word was handled at 1.0; the loop then ran an operator until
    6.0: its silence counts from 1.0, not from the late tick."""
    worker = joined_worker()
    worker.tick(0.0, 0.0, 0.0)
    worker.receive(wire.encode(Kind.HEARTBEAT, COORDINATOR, 1.0), 1.0)
    worker.tick(6.0, 6.0, 0.0)
    assert not worker.exited
    worker.tick(11.5, 11.5, 0.0)
    assert worker.exited
