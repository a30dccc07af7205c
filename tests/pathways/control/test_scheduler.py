"""Tests of the island gang scheduler's core: sequence numbers and one consistent order.

What is tested:

- FIFO by worked examples: numbers per device start at 0 and grow by one, a program's gangs
  are numbered back to back, unknown devices start at 0, malformed gangs are refused;
- a policy that holds programs back (``HoldPolicy`` below): ``release_ready`` and
  ``drop_client``;
- hypothesis properties, under FIFO and under a policy that releases held programs in a random
  order at random times: every device's numbers are 0, 1, 2... in release order; any two gangs
  that share devices are ordered the same way on all of them; every program's gangs are
  consecutive on each of its devices, in list order; every gang submitted is released once.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.control.scheduler import FifoPolicy, Gang, IslandScheduler, Policy
from pathways.errors import ProgramError


class HoldPolicy(Policy):
    """Holds every program until the test picks which to release, by position in the queue."""

    def __init__(self) -> None:
        self.held: list[tuple[Gang, ...]] = []
        self.picks: list[int] = []  # positions in ``held`` to release at the next pop_ready

    def add(self, program):
        self.held.append(program)

    def pop_ready(self):
        ready = [self.held.pop(i) for i in self.picks]
        self.picks = []
        return ready

    def drop_client(self, client):
        dropped = [g for p in self.held for g in p if g.client == client]
        self.held = [p for p in self.held if p[0].client != client]
        return dropped


def test_fifo_numbers_each_device_from_zero():
    s = IslandScheduler(island=0)
    assert s.submit([Gang("A", "c", (0, 1))]) == [("A", {0: 0, 1: 0})]
    assert s.submit([Gang("B", "c", (1, 2)), Gang("C", "d", (2,))]) == [
        ("B", {1: 1, 2: 0}),
        ("C", {2: 1}),
    ]
    assert [s.next_seq(d) for d in range(4)] == [1, 2, 2, 0]
    assert s.submit([]) == []
    assert isinstance(s.policy, FifoPolicy) and s.island == 0


def test_program_gangs_are_numbered_back_to_back():
    s = IslandScheduler(island=3)
    s.submit([Gang("x", "c", (0,))])
    released = s.submit([Gang(i, "c", (0, 1)) for i in range(3)])
    assert released == [(0, {0: 1, 1: 0}), (1, {0: 2, 1: 1}), (2, {0: 3, 1: 2})]


@pytest.mark.parametrize("devices, match", [((), "no devices"), ((1, 2, 1), "device twice")])
def test_malformed_gang_is_refused_and_nothing_is_numbered(devices, match):
    s = IslandScheduler(island=0)
    with pytest.raises(ProgramError, match=match):
        s.submit([Gang("ok", "c", (1,)), Gang("bad", "c", devices)])
    assert s.next_seq(1) == 0


def test_held_programs_are_released_later_and_dropped_per_client():
    policy = HoldPolicy()
    s = IslandScheduler(island=0, policy=policy)
    assert s.submit([Gang("a1", "a", (0, 1)), Gang("a2", "a", (1,))]) == []
    assert s.submit([Gang("b1", "b", (1, 2))]) == []
    assert s.submit([Gang("a3", "a", (0,))]) == []
    policy.picks = [1]  # b's program first
    assert s.release_ready() == [("b1", {1: 0, 2: 0})]
    assert s.drop_client("a") == ["a1", "a2", "a3"]
    assert s.release_ready() == [] and s.next_seq(0) == 0
    assert s.drop_client("a") == []


def test_fifo_drop_client_forgets_only_that_client():
    policy = FifoPolicy()
    policy.add((Gang(1, "a", (0,)), Gang(2, "b", (0,))))
    policy.add((Gang(3, "a", (1,)),))
    assert policy.drop_client("a") == [Gang(1, "a", (0,)), Gang(3, "a", (1,))]
    assert policy.pop_ready() == [(Gang(2, "b", (0,)),)]


# -- properties -------------------------------------------------------------------------

DEVICES = 6


def programs(client_count: int = 3):
    """Lists of programs; each a non-empty list of gangs of one client on distinct devices."""
    gang_devices = st.lists(st.integers(0, DEVICES - 1), min_size=1, max_size=DEVICES, unique=True)
    program = st.tuples(
        st.integers(0, client_count - 1), st.lists(gang_devices, min_size=1, max_size=4)
    )
    return st.lists(program, min_size=1, max_size=12)


def run(submissions, hold: bool, data) -> tuple[list, dict]:
    """Submit every program, releasing at random moments if ``hold``; returns all releases.

    Gang ids are ``(program number, position)``; the second result maps each id to its gang.
    """
    policy = HoldPolicy() if hold else FifoPolicy()
    s = IslandScheduler(island=0, policy=policy)
    gangs, released = {}, []
    for p, (client, device_lists) in enumerate(submissions):
        program = [Gang((p, i), client, tuple(ds)) for i, ds in enumerate(device_lists)]
        gangs.update((g.gang_id, g) for g in program)
        released += s.submit(program)
        if hold and data.draw(st.booleans(), label="release now"):
            policy.picks = pick_some(data, len(policy.held))
            released += s.release_ready()
    if hold:
        policy.picks = [0] * len(policy.held)
        released += s.release_ready()
    return released, gangs


def pick_some(data, held: int) -> list[int]:
    """Positions to pop from a queue of ``held`` programs: a random subset in random order."""
    picks = []
    for remaining in range(held, 0, -1):
        if not data.draw(st.booleans(), label="pick another"):
            break
        picks.append(data.draw(st.integers(0, remaining - 1), label="which"))
    return picks


def check_order(released: list, gangs: dict) -> None:
    assert sorted(gid for gid, _ in released) == sorted(gangs)  # each gang released once
    per_device = defaultdict(list)
    for gid, seqs in released:
        assert list(seqs) == list(gangs[gid].devices)
        for device, seq in seqs.items():
            per_device[device].append(seq)
    for seqs in per_device.values():
        assert seqs == list(range(len(seqs)))  # 0, 1, 2... in release order
    seq_of = dict(released)
    for a, b in itertools.combinations(gangs, 2):
        shared = set(seq_of[a]) & set(seq_of[b])
        assert len({seq_of[a][d] < seq_of[b][d] for d in shared}) <= 1  # one order on all


def check_back_to_back(released: list, gangs: dict) -> None:
    seq_of = dict(released)
    by_program = defaultdict(list)
    for gid in sorted(gangs):
        by_program[gid[0]].append(gid)
    for ids in by_program.values():
        for device in {d for gid in ids for d in gangs[gid].devices}:
            seqs = [seq_of[gid][device] for gid in ids if device in seq_of[gid]]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


@settings(max_examples=150, deadline=None)
@given(submissions=programs(), hold=st.booleans(), data=st.data())
def test_any_submissions_give_one_consistent_order(submissions, hold, data):
    released, gangs = run(submissions, hold, data)
    check_order(released, gangs)
    check_back_to_back(released, gangs)


@settings(max_examples=50, deadline=None)
@given(submissions=programs())
def test_next_seq_counts_gangs_released_on_each_device(submissions):
    s = IslandScheduler(island=0)
    count = defaultdict(int)
    for p, (client, device_lists) in enumerate(submissions):
        s.submit([Gang((p, i), client, tuple(ds)) for i, ds in enumerate(device_lists)])
        for ds in device_lists:
            for d in ds:
                count[d] += 1
    assert all(s.next_seq(d) == count[d] for d in range(DEVICES))


# -- windowed policies: proportional share and priority ---------------------------------

from pathways.control.scheduler import PriorityPolicy, ProportionalSharePolicy  # noqa: E402


def one_gang_programs(client, n, devices=(0, 1, 2, 3)):
    return [(Gang((client, i), client, devices),) for i in range(n)]


def drive(policy, submitted, finish_each=True):
    """Release everything through a scheduler, finishing each program as soon as it is
    released (a device that keeps up); returns the clients of the gangs in release order."""
    s = IslandScheduler(0, policy)
    order = []
    programs = {}
    for program in submitted:
        for g in program:
            programs[g.gang_id] = program
    releases = []
    for program in submitted:
        releases += s.submit(program)
    while releases:
        gid, _ = releases.pop(0)
        order.append(programs[gid][0].client)
        if finish_each:
            releases += s.finished(programs[gid])
    return order


@pytest.mark.parametrize("window", [1, 4])
def test_proportional_share_follows_the_weights_while_everyone_is_backlogged(window):
    weights = {"a": 1, "b": 2, "c": 4}
    submitted = [p for c in "abc" for p in one_gang_programs(c, 70)]
    order = drive(ProportionalSharePolicy(weights.get, window=window), submitted)
    first = order[window:window + 70]  # after a's head start, while all three wait
    shares = {c: first.count(c) / len(first) for c in "abc"}
    for c, w in weights.items():
        assert shares[c] == pytest.approx(w / 7, abs=0.03)


def test_proportional_share_counts_device_time_not_programs():
    # b's gangs use 1 device, a's use 4: with equal weights b gets 4 gangs per gang of a
    submitted = one_gang_programs("a", 20) + one_gang_programs("b", 80, devices=(4,))
    order = drive(ProportionalSharePolicy(lambda c: 1.0, window=2), submitted)[2:52]
    assert order.count("b") == pytest.approx(4 * order.count("a"), abs=4)


def test_an_idle_client_saves_up_no_credit():
    policy = ProportionalSharePolicy(lambda c: 1.0, window=1)
    s = IslandScheduler(0, policy)
    a = one_gang_programs("a", 30)
    released = []
    for p in a[:20]:  # a runs alone for a while
        released += s.submit(p)
        while released:
            released.pop(0)
            released += s.finished(p)
    order = []
    for p in a[20:] + one_gang_programs("b", 10):
        released += s.submit(p)
    programs = {g.gang_id: p for p in a + one_gang_programs("b", 10) for g in p}
    while released:
        gid, _ = released.pop(0)
        order.append(programs[gid][0].client)
        released += s.finished(programs[gid])
    # b arrives late: it alternates with a instead of taking 20 turns in a row
    assert order[:6].count("b") == 3


def test_window_bounds_admitted_programs_and_finishing_admits_more():
    policy = ProportionalSharePolicy(lambda c: 1.0, window=2)
    s = IslandScheduler(0, policy)
    progs = one_gang_programs("a", 5)
    released = []
    for p in progs:
        released += s.submit(p)
    assert [gid for gid, _ in released] == [("a", 0), ("a", 1)]
    assert policy.in_flight == 2
    assert [gid for gid, _ in s.finished(progs[0])] == [("a", 2)]


def test_gangs_of_two_clients_interleave_one_gang_at_a_time():
    a = tuple(Gang(("a", i), "a", (0, 1)) for i in range(3))
    b = tuple(Gang(("b", i), "b", (0, 1)) for i in range(3))
    s = IslandScheduler(0, ProportionalSharePolicy(lambda c: 1.0, window=4))
    # submitted one after the other, a (alone at first) is out before b arrives
    released = s.submit(a) + s.submit(b)
    assert [gid[0] for gid, _ in released] == ["a"] * 3 + ["b"] * 3
    a2 = tuple(Gang(("a2", i), "a", (0, 1)) for i in range(3))
    b2 = tuple(Gang(("b2", i), "b", (0, 1)) for i in range(3))
    s2 = IslandScheduler(0, ProportionalSharePolicy(lambda c: 1.0, window=1))
    out = s2.submit(a2) + s2.submit(b2)
    assert [gid for gid, _ in out] == [("a2", 0), ("a2", 1), ("a2", 2)]  # window of one
    out = s2.finished(a2)
    assert [gid for gid, _ in out] == [("b2", 0), ("b2", 1), ("b2", 2)]
    s3 = IslandScheduler(0, ProportionalSharePolicy(lambda c: 1.0, window=4))
    s3.policy.add(a2)
    s3.policy.add(b2)
    out = s3.release_ready()
    assert [gid[0] for gid, _ in out] == ["a2", "b2", "a2", "b2", "a2", "b2"]
    check_order(out, {g.gang_id: g for g in a2 + b2})


def test_priority_serves_the_highest_first_and_fifo_within_a_priority():
    prio = {"low": 0, "high": 10, "high2": 10}
    submitted = (one_gang_programs("low", 3) + one_gang_programs("high", 2)
                 + one_gang_programs("high2", 2))
    policy = PriorityPolicy(prio.get, window=1)
    s = IslandScheduler(0, policy)
    programs = {g.gang_id: p for p in submitted for g in p}
    released = []
    for p in submitted:
        released += s.submit(p)
    order = []
    while released:
        gid, _ = released.pop(0)
        order.append(gid)
        released += s.finished(programs[gid])
    # the first low program went while it was alone; then highs in arrival order, then lows
    assert order == [("low", 0), ("high", 0), ("high", 1), ("high2", 0), ("high2", 1),
                     ("low", 1), ("low", 2)]


@pytest.mark.parametrize("make", [lambda: ProportionalSharePolicy(lambda c: 1.0, window=1),
                                  lambda: PriorityPolicy(lambda c: 0, window=1)])
def test_dropping_a_client_returns_its_waiting_gangs_only(make):
    policy = make()
    s = IslandScheduler(0, policy)
    for p in one_gang_programs("a", 3) + one_gang_programs("b", 2):
        s.submit(p)
    assert sorted(s.drop_client("a")) == [("a", 1), ("a", 2)]  # ("a", 0) was released
    assert [gid for gid, _ in s.finished(one_gang_programs("a", 1)[0])] == [("b", 0)]


@settings(max_examples=100, deadline=None)
@given(submissions=programs(), window=st.integers(1, 4), share=st.booleans(),
       data=st.data())
def test_windowed_policies_give_one_consistent_order(submissions, window, share, data):
    policy = (ProportionalSharePolicy(lambda c: 1.0 + c, window=window) if share
              else PriorityPolicy(lambda c: c % 2, window=window))
    s = IslandScheduler(0, policy)
    gangs, released, programs = {}, [], {}
    for p, (client, device_lists) in enumerate(submissions):
        program = tuple(Gang((p, i), client, tuple(ds)) for i, ds in enumerate(device_lists))
        gangs.update((g.gang_id, g) for g in program)
        programs.update((g.gang_id, program) for g in program)
        released += s.submit(program)
    finished, i = set(), 0
    while i < len(released):  # finish programs, in a random order, once all their gangs are out
        out = {gid for gid, _ in released}
        candidates = [p for p in set(programs.values())
                      if p not in finished and all(g.gang_id in out for g in p)]
        if candidates:
            p = candidates[data.draw(st.integers(0, len(candidates) - 1), label="finish")]
            finished.add(p)
            released += s.finished(p)
        i += 1
        if i == len(released) and len(finished) < len(set(programs.values())):
            i = 0 if len(out) < len(gangs) else len(released)
    check_order(released, gangs)
    per_client = defaultdict(list)  # a client's own gangs keep their submission order
    for gid, _ in released:
        per_client[gangs[gid].client].append(gid)
    assert all(ids == sorted(ids) for ids in per_client.values())


def test_a_run_spanning_islands_is_admitted_past_a_full_window():
    # Island A admitted a's run first, island B b's: with windows of one, each run would wait
    # on the other island forever. Parts of multi-island runs skip the window instead.
    a_on_a, a_on_b = (Gang(("a", 0), "a", (0,)),), (Gang(("a", 1), "a", (10,)),)
    b_on_a, b_on_b = (Gang(("b", 0), "b", (0,)),), (Gang(("b", 1), "b", (10,)),)
    island_a = IslandScheduler(0, ProportionalSharePolicy(lambda c: 1.0, window=1))
    island_b = IslandScheduler(1, ProportionalSharePolicy(lambda c: 1.0, window=1))
    out_a = island_a.submit(a_on_a, spans_islands=True) + island_a.submit(b_on_a,
                                                                           spans_islands=True)
    out_b = island_b.submit(b_on_b, spans_islands=True) + island_b.submit(a_on_b,
                                                                           spans_islands=True)
    assert {gid for gid, _ in out_a} == {("a", 0), ("b", 0)}
    assert {gid for gid, _ in out_b} == {("a", 1), ("b", 1)}
    # single-island programs still respect the window
    c = [(Gang(("c", i), "c", (0,)),) for i in range(3)]
    assert all(island_a.submit(p) == [] for p in c)
    island_a.finished(a_on_a)
    assert [gid for gid, _ in island_a.finished(b_on_a)] == [("c", 0)]
