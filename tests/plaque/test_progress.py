"""Unit tests of progress tracking, with no workers, messages or clocks.

What is tested:

- ``ChangeBatch``: deltas accumulate per pointstamp and cancelling deltas vanish (compaction);
- ``Topology``: ``any_path`` / ``aligned_path`` / ``upstream`` on small hand-made graphs
  (ONE_TO_ONE chains, KEYED and BROADCAST edges, diamonds mixing both, unrelated nodes);
- ``ProgressTracker.is_complete`` / ``is_done`` on worked examples, applied change by change as
  a worker would (the example of ``progress.py``'s docstring, empty shards, per-shard precision
  along ONE_TO_ONE chains, earlier timestamps blocking later ones, negative transient counts);
- two hypothesis properties of the tracker alone: it agrees with a brute-force model that
  expands every node into its shards, and completion is monotone under decrements.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plaque.errors import GraphError
from plaque.graph import BROADCAST, KEYED, ONE_TO_ONE, Edge, Graph, Topology
from plaque.progress import CAP, INPUT, SINK, ChangeBatch, ProgressTracker

A, B, C, D = 0, 1, 2, 3


def topo(shards, *edges):
    """A Topology from shard counts and (src, dst, routing) triples."""
    return Topology.of(shards, [Edge(s, d, r) for s, d, r in edges])


def tracker(shards, *edges, runs=(0,)):
    """A tracker whose runs have started (a capability at every shard, as START does)."""
    tr = ProgressTracker(topo(shards, *edges))
    for t in runs:
        tr.update(tr.start_changes(t))
    return tr


def cap(node, shard, t=0):
    return (CAP, node, shard, t)


def inp(node, shard, t=0):
    return (INPUT, node, shard, t)


def complete_shards(tr, node, t=0):
    return [s for s in range(tr.topology.shards[node]) if tr.is_complete(node, s, t)]


# ---- ChangeBatch ------------------------------------------------------------------------------


def test_change_batch_accumulates_per_pointstamp():
    b = ChangeBatch()
    b.add(inp(B, 0), 2)
    b.add(inp(B, 0), -1)
    b.add(cap(A, 0), -1)
    assert len(b) == 2 and b
    assert sorted(b.drain()) == sorted([(inp(B, 0), 1), (cap(A, 0), -1)])


def test_change_batch_cancelling_deltas_vanish():
    # A tuple sent and consumed in the same turn must not travel at all.
    b = ChangeBatch()
    b.add(inp(B, 1), 1)
    b.add(inp(B, 1), -1)
    assert not b and len(b) == 0
    assert b.drain() == []


def test_change_batch_drain_empties_it():
    b = ChangeBatch()
    b.add(cap(A, 0), -1)
    assert b.drain() == [(cap(A, 0), -1)]
    assert not b and b.drain() == []
    b.add(cap(A, 0), -1)  # usable again after a drain
    assert b.drain() == [(cap(A, 0), -1)]


# ---- Topology ---------------------------------------------------------------------------------


def test_one_to_one_chain_is_aligned_not_any():
    tp = topo([3, 3, 3], (A, B, ONE_TO_ONE), (B, C, ONE_TO_ONE))
    assert tp.aligned_path[A][B] and tp.aligned_path[B][C] and tp.aligned_path[A][C]
    assert not any(tp.any_path[n][m] for n in range(3) for m in range(3))
    assert tp.upstream(C) == [(A, False), (B, False)]
    assert tp.upstream(A) == []


@pytest.mark.parametrize("routing", [KEYED, BROADCAST])
def test_exchange_then_one_to_one_reaches_every_shard(routing):
    tp = topo([2, 3, 3], (A, B, routing), (B, C, ONE_TO_ONE))
    assert tp.any_path[A][B] and tp.any_path[A][C]
    assert not tp.aligned_path[A][B] and not tp.aligned_path[A][C]
    assert tp.aligned_path[B][C] and not tp.any_path[B][C]
    assert tp.upstream(C) == [(A, True), (B, False)]


@pytest.mark.parametrize("routing", [KEYED, BROADCAST])
def test_one_to_one_then_exchange_reaches_every_shard(routing):
    tp = topo([2, 2, 5], (A, B, ONE_TO_ONE), (B, C, routing))
    assert tp.aligned_path[A][B] and not tp.aligned_path[A][C]
    assert tp.any_path[A][C] and tp.any_path[B][C]
    assert tp.upstream(C) == [(A, True), (B, True)]


def test_diamond_with_both_kinds_of_path():
    # A -1:1-> B -1:1-> D and A -KEYED-> C -1:1-> D: shard s of A reaches D's shard s along
    # the aligned branch and every shard of D along the keyed one; "every shard" must win.
    tp = topo([2, 2, 2, 2], (A, B, ONE_TO_ONE), (B, D, ONE_TO_ONE), (A, C, KEYED),
              (C, D, ONE_TO_ONE))
    assert tp.aligned_path[A][D] and tp.any_path[A][D]
    assert tp.upstream(D) == [(A, True), (B, False), (C, False)]


def test_aligned_diamond_stays_aligned():
    tp = topo([2, 2, 2, 2], (A, B, ONE_TO_ONE), (A, C, ONE_TO_ONE), (B, D, ONE_TO_ONE),
              (C, D, ONE_TO_ONE))
    assert tp.upstream(D) == [(A, False), (B, False), (C, False)]


def test_unrelated_nodes_and_siblings_are_not_upstream():
    # B and C are siblings under A; D is alone. Nothing reaches backwards or sideways.
    tp = topo([1, 2, 3, 4], (A, B, BROADCAST), (A, C, KEYED))
    assert tp.upstream(B) == [(A, True)]
    assert tp.upstream(C) == [(A, True)]
    assert tp.upstream(D) == []
    assert not tp.any_path[B][A] and not tp.any_path[B][C] and not tp.aligned_path[C][B]
    assert all(not tp.any_path[n][n] and not tp.aligned_path[n][n] for n in range(4))
    assert tp.shards == (1, 2, 3, 4)


def test_topology_refuses_a_cycle():
    with pytest.raises(GraphError):
        topo([1, 1], (A, B, KEYED), (B, A, KEYED))


# ---- ProgressTracker: worked examples ---------------------------------------------------------


def test_docstring_example_keyed_exchange():
    # A(2) -KEYED-> B(2): A0 sends one tuple to B1, A1 sends nothing.
    tr = tracker([2, 2], (A, B, KEYED))
    assert complete_shards(tr, A) == [0, 1]  # sources are complete as soon as the run starts
    assert complete_shards(tr, B) == []
    tr.update([(inp(B, 1), 1), (cap(A, 0), -1)])
    assert complete_shards(tr, B) == []  # A1 may still send to either shard
    tr.update([(cap(A, 1), -1)])
    assert complete_shards(tr, B) == [0]  # B0 got nothing and still learns it is complete
    tr.update([(inp(B, 1), -1)])
    assert complete_shards(tr, B) == [0, 1]
    assert not tr.is_done(0)  # B's capabilities are still held
    tr.update([(cap(B, 0), -1), (cap(B, 1), -1)])
    assert tr.is_done(0) and tr.pending_timestamps() == []


def test_shard_that_receives_nothing_completes():
    tr = tracker([1, 3], (A, B, BROADCAST))
    tr.update([(cap(A, 0), -1)])
    assert complete_shards(tr, B) == [0, 1, 2]


def test_one_to_one_chain_completes_per_shard():
    # Shard 1 of B must not wait for shard 0 of A, which is still busy.
    tr = tracker([2, 2], (A, B, ONE_TO_ONE))
    tr.update([(inp(B, 1), 1), (cap(A, 1), -1)])
    assert complete_shards(tr, B) == []  # B1 has a tuple on its way
    tr.update([(inp(B, 1), -1)])
    assert complete_shards(tr, B) == [1]  # A0 still holds its capability
    tr.update([(cap(A, 0), -1)])
    assert complete_shards(tr, B) == [0, 1]


def test_one_to_one_precision_survives_a_longer_chain():
    tr = tracker([2, 2, 2], (A, B, ONE_TO_ONE), (B, C, ONE_TO_ONE))
    tr.update([(cap(A, 1), -1), (cap(B, 1), -1)])
    assert complete_shards(tr, C) == [1]
    tr.update([(inp(B, 0), 1), (cap(A, 0), -1)])  # A0's tuple sits at B0's input
    assert complete_shards(tr, C) == [1]


def test_exchange_in_a_chain_blocks_every_shard_downstream():
    tr = tracker([2, 2, 2], (A, B, KEYED), (B, C, ONE_TO_ONE))
    tr.update([(cap(A, 1), -1), (cap(B, 1), -1)])
    assert complete_shards(tr, C) == []  # A0 may still send to B1, hence to C1
    tr.update([(cap(A, 0), -1)])
    assert complete_shards(tr, C) == [1]  # B0 still holds its capability


def test_earlier_timestamp_blocks_later_not_the_reverse():
    tr = tracker([1, 1], (A, B, KEYED), runs=(0, 1))
    tr.update([(cap(A, 0, 1), -1)])
    assert not tr.is_complete(B, 0, 1)  # A still holds its capability at t=0 <= 1
    tr.update([(cap(A, 0, 1), 1), (cap(A, 0, 0), -1)])  # now only t=1 is held at A
    assert tr.is_complete(B, 0, 0) and not tr.is_complete(B, 0, 1)
    tr.update([(cap(A, 0, 1), -1)])
    assert tr.is_complete(B, 0, 1)


def test_earlier_input_at_own_shard_blocks_later_timestamp():
    tr = tracker([1, 1], (A, B, KEYED), runs=(0, 1))
    tr.update([(inp(B, 0, 0), 1), (cap(A, 0, 0), -1), (cap(A, 0, 1), -1)])
    assert not tr.is_complete(B, 0, 1)
    tr.update([(inp(B, 0, 0), -1)])
    assert tr.is_complete(B, 0, 1)


def test_own_capability_does_not_block_own_completion():
    tr = tracker([2, 2], (A, B, ONE_TO_ONE))
    tr.update([(cap(A, 0), -1), (cap(A, 1), -1)])
    assert tr.count(cap(B, 0)) == 1 and complete_shards(tr, B) == [0, 1]


def test_negative_transient_counts_do_not_unblock():
    # B0's consumption overtook A0's batch that announced the tuple: INPUT(B,0) is -1 for a
    # while. That must not cancel A0's capability, which is a different pointstamp.
    tr = tracker([1, 1], (A, B, ONE_TO_ONE))
    tr.update([(inp(B, 0), -1), (inp(A, 0), -1)])
    assert tr.count(inp(B, 0)) == -1
    assert not tr.is_complete(B, 0, 0)
    tr.update([(inp(B, 0), 1), (cap(A, 0), -1)])  # the late batch
    assert tr.is_complete(B, 0, 0)
    assert not tr.is_done(0)  # INPUT(A,0) is still -1 and B0's capability is held


def test_negative_count_alone_is_complete_but_not_done():
    tr = tracker([1], runs=())
    tr.update([(inp(A, 0, 5), -1)])
    assert tr.is_complete(A, 0, 5)
    assert not tr.is_done(5) and tr.pending_timestamps() == [5]
    tr.update([(inp(A, 0, 5), 1)])
    assert tr.is_done(5) and tr.pending_timestamps() == []


def test_sink_blocks_done_but_no_shard():
    tr = tracker([1, 1], (A, B, KEYED))
    tr.update([((INPUT, SINK, 0, 0), 1), (cap(A, 0), -1), (cap(B, 0), -1)])
    assert tr.is_complete(B, 0, 0)
    assert not tr.is_done(0)
    tr.update([((INPUT, SINK, 0, 0), -1)])
    assert tr.is_done(0)


def test_start_changes_put_a_capability_at_every_shard():
    tr = ProgressTracker(topo([2, 3], (A, B, KEYED)))
    assert sorted(tr.start_changes(7)) == sorted(
        [(cap(A, s, 7), 1) for s in range(2)] + [(cap(B, s, 7), 1) for s in range(3)])


# ---- ProgressTracker: properties --------------------------------------------------------------

ROUTINGS = [ONE_TO_ONE, KEYED, BROADCAST]


@st.composite
def graphs(draw):
    """A random DAG of 1-4 nodes (edges from lower to higher index) with 1-3 shards each:
    its Topology and its raw edges (the model derives reachability from the latter)."""
    n = draw(st.integers(1, 4))
    shards = [draw(st.integers(1, 3)) for _ in range(n)]
    edges = []
    for src, dst in itertools.combinations(range(n), 2):
        kinds = ROUTINGS if shards[src] == shards[dst] else ROUTINGS[1:]
        routing = draw(st.sampled_from([None, *kinds]))
        if routing is not None:
            edges.append(Edge(src, dst, routing))
    return Topology.of(shards, edges), edges


def draw_changes(draw, tp: Topology, size):
    """Up to ``size`` pointstamp deltas at t in 0..2, negative ones included (transients)."""
    keys = st.tuples(st.sampled_from([INPUT, CAP]), st.integers(0, len(tp.shards) - 1),
                     st.integers(0, 2), st.integers(0, 2)).map(
        lambda k: (k[0], k[1], k[2] % tp.shards[k[1]], k[3]))
    return draw(st.lists(st.tuples(keys, st.sampled_from([-1, 1, 2])), max_size=size))


def shard_reach(shards, edges):
    """Brute force: which (node, shard) pairs reach which, expanding every node into shards."""
    succ = {(n, s): set() for n, k in enumerate(shards) for s in range(k)}
    for e in edges:
        for s in range(shards[e.src]):
            dsts = [s] if e.routing is ONE_TO_ONE else range(shards[e.dst])
            succ[(e.src, s)].update((e.dst, d) for d in dsts)
    reach = {}
    for start in succ:
        seen, todo = set(), [start]
        while todo:
            for nxt in succ[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = seen
    return reach


def model_complete(counts, reach, node, shard, t):
    """No positive pointstamp at t' <= t at this shard's input or at a shard reaching it."""
    for (kind, n, s, t2), c in counts.items():
        if c > 0 and t2 <= t:
            if (n, s) == (node, shard) and kind == INPUT:
                return False
            if (node, shard) in reach[(n, s)]:
                return False
    return True


def check_against_model(tr, counts, reach):
    for node, k in enumerate(tr.topology.shards):
        for shard, t in itertools.product(range(k), range(3)):
            assert tr.is_complete(node, shard, t) == model_complete(counts, reach, node, shard, t)
    for t in range(3):
        assert tr.is_done(t) == all(c == 0 for key, c in counts.items() if key[3] == t)
    assert tr.pending_timestamps() == sorted({k[3] for k, c in counts.items() if c})


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_tracker_agrees_with_shard_level_model(data):
    """is_complete / is_done equal a brute-force model on the graph expanded into shards.

    This checks the per-node reachability with ONE_TO_ONE refinement is exact, not merely an
    over-approximation, and that the incremental positive-key index never drifts.
    """
    tp, edges = data.draw(graphs())
    tr, counts = ProgressTracker(tp), {}
    reach = shard_reach(tp.shards, edges)
    for _ in range(data.draw(st.integers(1, 4))):
        batch = draw_changes(data.draw, tp, 6)
        tr.update(batch)
        for key, delta in batch:
            counts[key] = counts.get(key, 0) + delta
        check_against_model(tr, counts, reach)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_completion_is_monotone_under_decrements(data):
    """Once complete for t, a shard stays complete whatever -1 changes follow."""
    tp, _ = data.draw(graphs())
    tr = ProgressTracker(tp)
    tr.update(tr.start_changes(0))
    tr.update(draw_changes(data.draw, tp, 8))
    done = [(n, s, t) for n, k in enumerate(tp.shards) for s in range(k) for t in range(3)
            if tr.is_complete(n, s, t)]
    for key, _ in draw_changes(data.draw, tp, 12):
        tr.update([(key, -1)])
        assert all(tr.is_complete(*c) for c in done)


def test_interested_workers_follow_real_dependencies():
    from plaque.progress import interested_workers

    g = Graph("interest")
    a = g.node("a", object, 2)
    b = g.node("b", object, 2)
    c = g.node("c", object, 3)
    g.edge(a, b, ONE_TO_ONE)
    g.edge(b, c, KEYED)
    topo = Topology.of([n.shards for n in g.nodes], g.edges)
    placement = [(0, 1), (0, 1), (2, 2, 2)]
    got = interested_workers(topo, placement)
    assert got[(0, 0)] == {0, 2} and got[(0, 1)] == {1, 2}  # aligned to b, keyed on to c
    assert got[(1, 0)] == {0, 2} and got[(2, 1)] == {2}
