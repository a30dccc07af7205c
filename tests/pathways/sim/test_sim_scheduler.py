"""Tests of the discrete-event scheduler (``pathways.sim.scheduler``). No threads, no I/O; every
time asserted is virtual (costs are modelled, or measured by a fake meter).

What is tested:

- the module docstring's worked example, exactly;
- timers: order by time then by scheduling order, cancel, ``call_later`` from a handler's end;
- messages sent by a handler leave at its end; absolute posts are taken as given;
- the cost of a handler: per post, else the actor's, else the scheduler's default, else the
  fake meter's reading, charged exactly (and a modelled cost never reads the meter);
- a busy actor's messages wait without letting it run ahead of other actors' earlier events;
- ``run``, ``step``, ``run_until`` (a time, a predicate, a deadline);
- errors: the virtual past, a route arriving before its departure, a run inside a handler;
  a handler that raises still charges its CPU and sends what it sent;
- determinism: same seed, same digest; other seeds, other digests; the bounded trace;
- hypothesis: random posts and sends among actors with random costs keep causality (start >=
  arrival, per actor no overlap and arrival order, global start order, arrival >= sender end).
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.errors import PathwaysError
from pathways.sim import Actor, CausalityError, Scheduler, SchedulerError


def _log_on(sched: Scheduler, log: list, tag: str):
    """A handler that records (tag, now, running actor's name)."""
    def handler(*args):
        current = sched.current
        log.append((tag, sched.now, current.name if current else None, *args))
    handler.__qualname__ = f"h_{tag}"
    return handler


def test_the_worked_example_of_the_docstring():
    sched = Scheduler(seed=0)
    a, b = sched.actor("A"), sched.actor("B")
    log = []

    def m1():
        log.append(("m1", sched.now))
        sched.send(b, 0.5, _log_on(sched, log, "reply"))

    a.post(0.0, m1, cost=2.0)
    a.post(1.0, _log_on(sched, log, "m2"), cost=1.0)
    assert sched.run() == 3
    assert log == [("m1", 0.0), ("m2", 2.0, "A"), ("reply", 2.5, "B")]
    assert a.busy_until == 3.0 and a.cpu == 3.0 and a.handled == 2
    assert sched.now == 2.5


def test_timers_run_by_time_then_in_scheduling_order_and_can_be_cancelled():
    sched = Scheduler()
    log = []
    sched.call_at(2.0, log.append, "late")
    sched.call_at(1.0, log.append, "first")
    sched.call_at(1.0, log.append, "second")
    dropped = sched.call_later(1.5, log.append, "cancelled")
    dropped.cancel()
    sched.run()
    assert log == ["first", "second", "late"] and sched.now == 2.0
    assert sched.events_run == 3


def test_relative_times_in_a_handler_count_from_its_end_and_absolute_ones_as_given():
    sched = Scheduler()
    a, b = sched.actor("A", cost=1.0), sched.actor("B", cost=0.0)
    log = []

    def start():
        sched.call_later(0.25, _log_on(sched, log, "timer"))
        sched.send(b, 0.0, _log_on(sched, log, "sent"))
        b.post(0.5, _log_on(sched, log, "posted"))  # absolute: before A's end, as asked
        sched.call_at(0.75, _log_on(sched, log, "at"))

    a.post(0.0, start)
    sched.run()
    assert log == [("posted", 0.5, "B"), ("at", 0.75, None), ("sent", 1.0, "B"),
                   ("timer", 1.25, None)]


def test_a_handler_is_charged_exactly_the_cpu_the_meter_says_it_used():
    meter = {"t": 10.0}
    sched = Scheduler(cpu_meter=lambda: meter["t"])
    a = sched.actor("A")
    log = []

    def hungry(seconds):
        log.append(sched.now)
        meter["t"] += seconds  # "burns" CPU: only the meter moves

    a.post(0.0, hungry, 0.25)
    a.post(0.0, hungry, 0.125)
    a.post(1.0, hungry, 0.5)
    sched.run()
    assert log == [0.0, 0.25, 1.0]
    assert a.busy_until == 1.5 and a.cpu == 0.875


def test_the_cost_is_the_posts_else_the_actors_else_the_default_and_never_metered():
    def meter():
        raise AssertionError("a modelled cost must not read the meter")

    sched = Scheduler(cpu_meter=meter, default_cost=0.5)
    plain, costly = sched.actor("plain"), sched.actor("costly", cost=2.0)
    plain.post(0.0, lambda: None)
    costly.post(0.0, lambda: None)
    costly.post(0.0, lambda: None, cost=0.25)
    sched.run()
    assert plain.cpu == 0.5 and costly.cpu == 2.25


def test_a_busy_actor_does_not_run_ahead_of_other_actors_earlier_events():
    sched = Scheduler()
    a, b = sched.actor("A"), sched.actor("B")
    log = []
    a.post(0.0, _log_on(sched, log, "a1"), cost=5.0)
    a.post(1.0, _log_on(sched, log, "a2"), cost=1.0)  # waits for A's CPU until 5
    b.post(3.0, _log_on(sched, log, "b1"), cost=1.0)
    sched.run()
    assert [(tag, t) for tag, t, _ in log] == [("a1", 0.0), ("b1", 3.0), ("a2", 5.0)]


def test_an_actor_handles_its_waiting_messages_in_arrival_order():
    sched = Scheduler()
    a = sched.actor("A", cost=1.0)
    log = []
    a.post(0.0, _log_on(sched, log, "busy"), cost=4.0)
    a.post(4.0, _log_on(sched, log, "on time"))  # arrives at the free time, after "waited"
    a.post(2.0, _log_on(sched, log, "waited"))
    sched.run()
    assert [(tag, t) for tag, t, _ in log] == [("busy", 0.0), ("waited", 4.0), ("on time", 5.0)]


def test_step_run_and_run_until():
    sched = Scheduler(default_cost=0.0)
    log = []
    for t in (1.0, 2.0, 3.0, 4.0):
        sched.call_at(t, log.append, t)
    assert sched.next_time() == 1.0
    assert sched.step() and log == [1.0]
    assert sched.run_until(2.5) and log == [1.0, 2.0] and sched.now == 2.5
    assert not sched.run_until(lambda: len(log) == 4, deadline=3.5)
    assert log == [1.0, 2.0, 3.0] and sched.now == 3.0
    assert sched.run_until(lambda: len(log) == 4) and sched.now == 4.0
    assert not sched.run_until(lambda: False)  # the events ran out
    assert not sched.step() and sched.next_time() is None
    sched.call_at(5.0, log.append, 5.0)
    sched.call_at(6.0, log.append, 6.0)
    assert sched.run(max_events=1) == 1 and log[-1] == 5.0


def test_run_until_a_time_does_not_start_a_deferred_handler_after_that_time():
    sched = Scheduler()
    a = sched.actor("A")
    a.post(0.0, lambda: None, cost=2.0)
    late = []
    a.post(1.0, late.append, "ran", cost=1.0)
    sched.run_until(1.5)
    assert late == [] and sched.now == 1.5
    sched.run()
    assert late == ["ran"] and sched.now == 2.0


def test_the_virtual_past_and_negative_delays_are_causality_errors():
    sched = Scheduler()
    sched.call_at(1.0, lambda: None)
    sched.run()
    a = sched.actor("A")
    with pytest.raises(CausalityError, match="before now"):
        a.post(0.5, lambda: None)
    with pytest.raises(CausalityError):
        sched.call_at(float("nan"), lambda: None)
    with pytest.raises(CausalityError, match="negative delay"):
        sched.send(a, -1.0, lambda: None)
    with pytest.raises(CausalityError, match="before it left"):
        sched.transmit(a, lambda departure: departure - 0.5, lambda: None)
    assert issubclass(CausalityError, SchedulerError) and issubclass(SchedulerError,
                                                                     PathwaysError)


def test_the_scheduler_cannot_be_run_from_inside_a_handler_or_timer():
    sched = Scheduler(default_cost=0.0)
    errors = []

    def nested():
        with pytest.raises(SchedulerError, match="inside"):
            sched.run()
        errors.append("refused")

    sched.actor("A").post(0.0, nested)
    sched.call_at(1.0, nested)
    sched.run()
    assert errors == ["refused", "refused"]


def test_a_handler_that_raises_is_charged_and_its_sends_leave():
    sched = Scheduler()
    a, b = sched.actor("A", cost=1.0), sched.actor("B", cost=0.0)
    log = []

    def fails():
        sched.send(b, 0.0, _log_on(sched, log, "sent"))
        raise ValueError("boom")

    a.post(0.0, fails)
    with pytest.raises(ValueError, match="boom"):
        sched.run()
    assert a.busy_until == 1.0 and sched.current is None
    sched.run()
    assert log == [("sent", 1.0, "B")]


def test_actor_returns_the_same_actor_and_refuses_a_different_cost():
    sched = Scheduler()
    a = sched.actor("A", cost=1.0)
    assert sched.actor("A") is a and sched.actor("A", cost=1.0) is a
    assert sched.actors == {"A": a} and isinstance(a, Actor)
    with pytest.raises(SchedulerError, match="exists"):
        sched.actor("A", cost=2.0)


def _random_workload(seed: int, events: int = 200) -> Scheduler:
    """Actors bouncing messages with random delays and costs, all drawn from the seed."""
    sched = Scheduler(seed, trace_limit=50)
    rng = sched.random
    actors = [sched.actor(f"host{i}") for i in range(4)]

    def bounce(hops: int) -> None:
        if hops:
            sched.send(rng.choice(actors), rng.random(), bounce, hops - 1, cost=rng.random())

    for i in range(events // 10):
        actors[i % 4].post(rng.random(), bounce, 9, cost=rng.random())
    sched.call_later(0.5, functools.partial(bounce, 0))
    sched.run()
    return sched


def test_the_same_seed_gives_the_same_run_and_other_seeds_other_runs():
    first, again = _random_workload(7), _random_workload(7)
    assert first.trace_digest() == again.trace_digest()
    assert list(first.trace) == list(again.trace) and first.now == again.now
    digests = {_random_workload(seed).trace_digest() for seed in range(5)}
    assert len(digests) == 5


def test_the_trace_is_bounded_but_the_digest_covers_every_event():
    sched = _random_workload(3)
    assert sched.events_run == 201 and len(sched.trace) == 50
    assert sched.trace[-1].time == sched.now
    assert {entry.name for entry in sched.trace} <= {"bounce", "_random_workload.<locals>.bounce"}
    shorter = Scheduler(3)
    shorter.call_at(0.0, lambda: None)
    shorter.run()
    assert shorter.trace_digest() != sched.trace_digest()


@st.composite
def _posts(draw):
    n_actors = draw(st.integers(1, 4))
    times = st.integers(0, 20).map(lambda k: k / 4)  # quarters: exact arithmetic
    costs = st.integers(0, 8).map(lambda k: k / 8)
    post = st.tuples(st.integers(0, n_actors - 1), times, costs,
                     st.lists(st.tuples(st.integers(0, n_actors - 1), times, costs),
                              max_size=3))
    return n_actors, draw(st.lists(post, min_size=1, max_size=25))


@settings(max_examples=60, deadline=None)
@given(_posts())
def test_causality_holds_for_random_posts_and_sends(case):
    n_actors, posts = case
    sched = Scheduler()
    actors = [sched.actor(f"a{i}") for i in range(n_actors)]
    runs = []  # (actor, arrival, start, end, sender's end or None)

    def handler(arrival, cost, sends, sender_end):
        start = sched.now
        runs.append((sched.current.name, arrival, start, start + cost, sender_end))
        for dst, delay, send_cost in sends:
            sched.send(actors[dst], delay, handler, start + cost + delay, send_cost, [],
                       start + cost, cost=send_cost)

    for dst, at, cost, sends in posts:
        actors[dst].post(at, handler, at, cost, sends, None, cost=cost)
    sched.run()

    assert len(runs) == len(posts) + sum(len(sends) for *_, sends in posts)
    starts = [start for _, _, start, _, _ in runs]
    assert starts == sorted(starts)  # one global order in virtual time
    for _, arrival, start, _, sender_end in runs:
        assert start >= arrival
        assert sender_end is None or arrival >= sender_end
    for actor in actors:
        mine = [r for r in runs if r[0] == actor.name]
        for before, after in zip(mine, mine[1:], strict=False):
            assert after[2] >= before[3]  # no overlap on one CPU
            assert after[1] >= before[1]  # arrival order
        assert actor.busy_until == (mine[-1][3] if mine else 0.0)
