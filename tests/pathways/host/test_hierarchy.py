"""Hierarchical collectives' plans (``pathways.host.hierarchy``): every host of a group,
following only its own plan, ends with the reduction tree's answer, bitwise; what one host
sends is what another expects; and messages per host follow the tree, not the host count."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.host import hierarchy
from pathways.program.reduction import REDUCTIONS, split_point, tree_fold


def run_plans(owners, values, red, flat_hosts=None, monkeypatch=None):
    """Every host of ``owners`` carries out its plan, exchanging nodes by message in rounds;
    {host: its answer}, {host: messages it received}, the rounds taken."""
    if monkeypatch is not None and flat_hosts is not None:
        monkeypatch.setattr(hierarchy, "FLAT_HOSTS", flat_hosts)
    n = len(owners)
    devs = tuple(100 + p for p in range(n))
    hosts = sorted(set(owners))
    host_of_leader = {}
    for p, h in enumerate(owners):
        host_of_leader.setdefault(devs[p], h)
    plans = {h: hierarchy.plan(devs, tuple(owners), h) for h in hosts}
    have = {h: {} for h in hosts}
    received = {h: 0 for h in hosts}
    outbox: list = []

    def put(h, node, value):
        have[h][node] = value
        for leader in plans[h].sends.get(node, ()):
            outbox.append((host_of_leader[leader], hierarchy.code(node, n), value, h))

    for h in hosts:
        for node, ps in plans[h].local:
            put(h, node, tree_fold([red.leaf(values[p]) for p in ps], red.combine))
    rounds = 0
    while True:
        progress = False
        for h in hosts:
            for node, left, right in plans[h].steps:
                if node not in have[h] and left in have[h] and right in have[h]:
                    put(h, node, red.combine(have[h][left], have[h][right]))
                    progress = True
        if not outbox:
            if not progress:
                break
            continue
        rounds += 1
        delivered, outbox[:] = list(outbox), []
        for dst, src, value, sender in delivered:
            node = hierarchy.node_of(src, n)
            assert plans[dst].expects.get(node) == sender, (dst, node, sender)
            assert node not in have[dst]
            have[dst][node] = value
            received[dst] += 1
    answers = {h: red.result(have[h][plans[h].root], values[0]) for h in hosts}
    for h in hosts:  # everything expected came
        assert all(node in have[h] for node in plans[h].expects)
    return answers, received, rounds


layouts = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.integers(0, 7), min_size=n, max_size=n)))


@settings(max_examples=150, deadline=None)
@given(layout=layouts, flat=st.booleans(), seed=st.integers(0, 2**31))
def test_every_host_ends_with_the_trees_answer_bitwise(layout, flat, seed):
    n, owners = layout
    rng = np.random.default_rng(seed)
    # magnitudes far apart: the order of the additions shows in the bits
    values = [(rng.standard_normal(5) * 10.0 ** rng.integers(-8, 8, 5)).astype(np.float32)
              for _ in range(n)]
    saved = hierarchy.FLAT_HOSTS
    hierarchy.FLAT_HOSTS = 99 if flat else 0
    try:
        for op in ("sum", "max", "gather"):
            red = REDUCTIONS[op]
            answers, _, _ = run_plans(owners, values, red)
            want = red.fold(values)
            for got in answers.values():
                if op == "gather":
                    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
                else:
                    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    finally:
        hierarchy.FLAT_HOSTS = saved


@pytest.mark.parametrize("hosts,per_host", [(32, 32), (64, 32), (8, 4), (16, 1)])
def test_aligned_hosts_take_log2_rounds_and_messages(hosts, per_host, monkeypatch):
    """A group of H hosts of D consecutive positions each: with the tree, log2(H) rounds and
    log2(H) messages into each host (the flat way: H - 1 into each host)."""
    owners = [p // per_host for p in range(hosts * per_host)]
    values = [np.float64(p) for p in range(hosts * per_host)]
    answers, received, rounds = run_plans(owners, values, REDUCTIONS["sum"], 0, monkeypatch)
    depth = int(math.log2(hosts))
    assert rounds == depth and set(received.values()) == {depth}
    assert all(float(a) == sum(range(hosts * per_host)) for a in answers.values())
    _, received, rounds = run_plans(owners, values, REDUCTIONS["sum"], 99, monkeypatch)
    assert rounds == 1 and set(received.values()) == {hosts - 1}


def test_a_host_holding_an_aligned_block_computes_it_alone():
    plan = hierarchy.plan(tuple(range(16)), tuple(p // 4 for p in range(16)), 2)
    assert plan.local == (((8, 12), (8, 9, 10, 11)),)
    assert plan.leader == 8 and plan.position == {8: 8, 9: 9, 10: 10, 11: 11}


def test_the_tree_splits_after_the_largest_power_of_two_below():
    assert [split_point(n) for n in (2, 3, 4, 5, 6, 8, 9, 12)] == [1, 2, 2, 4, 4, 4, 8, 8]
    assert tree_fold(list("abcdef"), lambda a, b: f"({a}{b})") == "(((ab)(cd))(ef))"


def test_node_codes_round_trip_and_are_never_device_ids():
    for n in (1, 2, 7, 2048):
        for node in ((0, n), (0, 1), (n - 1, n)):
            c = hierarchy.code(node, n)
            assert c < 0 and hierarchy.node_of(c, n) == node


def test_chunk_numbers_never_name_a_node():
    n = 12
    nodes = {hierarchy.code((lo, hi), n) for lo in range(n) for hi in range(lo + 1, n + 1)}
    for j in range(n):
        c = hierarchy.chunk_code(j, n)
        assert c not in nodes and hierarchy.chunk_of(c, n) == j
    assert all(hierarchy.chunk_of(c, n) is None for c in nodes)


def test_large_reductions_scatter_on_three_hosts_or_more():
    big = hierarchy.SCATTER_BYTES
    for hosts, want in ((2, False), (3, True), (8, True)):
        plan = hierarchy.plan(tuple(range(hosts * 2)), tuple(p // 2 for p in range(hosts * 2)), 0)
        assert plan.scatters(big, big // 4, "sum") is want
        assert not plan.scatters(big, big // 4, "gather")  # a gather is not cut up
        assert not plan.scatters(big - 1, big // 4, "sum")


def test_the_link_model_counts_rounds_as_documented():
    ici = hierarchy.ICI
    devs, owners = tuple(range(8)), tuple(p // 2 for p in range(8))
    tree = hierarchy.plan(devs, owners, 0, "tree")
    assert tree.link_time([(0, 100), (0, 100)]) == pytest.approx(
        2 * (ici.latency + 100 / ici.bandwidth))
    flat = hierarchy.plan(devs, owners, 0, "flat")
    assert flat.link_time([(0, 100)] * 3) == pytest.approx(ici.latency + 300 / ici.bandwidth)
    scatter = hierarchy.plan(devs, owners, 0, "scatter")
    assert scatter.link_time([(0, 25)] * 3 + [(1, 25)] * 3) == pytest.approx(
        2 * (ici.latency + 75 / ici.bandwidth))


@pytest.mark.parametrize("text", ["abc", "-1", "1.5"])
def test_a_bad_threshold_in_the_environment_is_named(text, monkeypatch):
    monkeypatch.setenv("PATHWAYS_FLAT_HOSTS", text)
    with pytest.raises(ValueError, match=f"PATHWAYS_FLAT_HOSTS must be a non-negative integer,"
                                         f" got '{text}'"):
        hierarchy._setting("PATHWAYS_FLAT_HOSTS", 4)
    monkeypatch.setenv("PATHWAYS_FLAT_HOSTS", "7")
    assert hierarchy._setting("PATHWAYS_FLAT_HOSTS", 4) == 7
