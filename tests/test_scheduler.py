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

from pathways.errors import ProgramError
from pathways.scheduler import FifoPolicy, Gang, IslandScheduler, Policy


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
