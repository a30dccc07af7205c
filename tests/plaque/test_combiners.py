"""Combining KEYED edges: ``g.edge(a, b, KEYED, combine=f)`` folds what a sender emits under one
key into one accumulator per turn; the receiver gets ``(key, accumulator)`` pairs, each key on
its ``stable_shard``, and the totals equal a plain-Python fold of the same values."""

from __future__ import annotations

import collections
import operator
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plaque
from plaque import KEYED, ONE_TO_ONE, Combiner, Graph, GraphError, Operator, stable_shard


class Words(Operator):
    """Emits every word of its part under its own key, one emit per word."""

    def on_start(self, ctx, t):
        for word in ctx.part:
            ctx.emit(1, key=word)


class WordsBatch(Operator):
    """The same as one ``emit_batch`` with ``keys=``."""

    def on_start(self, ctx, t):
        ctx.emit_batch([1] * len(ctx.part), keys=ctx.part)


class Pairs(Operator):
    """Records every pair it receives, and how many, per run."""

    def on_batch(self, ctx, t, port, pairs):
        ctx.state.setdefault("pairs", []).extend(pairs)

    def on_complete(self, ctx, t):
        ctx.output(ctx.state.get("pairs", []))


def word_graph(source=Words, sources=3, counters=2, combine=operator.add) -> Graph:
    g = Graph("combine")
    src = g.node("src", source, shards=sources)
    count = g.node("count", Pairs, shards=counters)
    g.edge(src, count, KEYED, combine=combine)
    return g


def totals(result, counters: int) -> collections.Counter:
    """Merge the pairs every counter got, checking each key reached its stable shard."""
    got: collections.Counter = collections.Counter()
    for shard, outs in result.outputs.get("count", {}).items():
        for key, n in (pair for pairs in outs for pair in pairs):
            assert stable_shard(key, counters) == shard, (key, shard)
            got[key] += n
    return got


@pytest.fixture(scope="module", params=["inproc", None])  # None: worker processes
def cluster(request):
    with plaque.local_cluster(workers=2, transport=request.param) as c:
        yield c


@pytest.mark.parametrize("source", [Words, WordsBatch])
def test_a_sender_sends_each_key_once_per_turn_with_its_total(cluster, source):
    parts = [["a", "b", "a", "a"], ["b"] * 50 + ["c"], []]
    result = cluster.install(word_graph(source)).run(parts={"src": parts}).result(30)
    pairs = [p for outs in result.outputs["count"].values() for ps in outs for p in ps]
    # each source shard emits in one turn, so it sends one pair per distinct word it has
    assert len(pairs) == sum(len(set(p)) for p in parts) == 4
    assert totals(result, 2) == collections.Counter(w for p in parts for w in p)


class Mean(Operator):
    """Emits (value) under key value % 3 three ways: emit, emit_batch(keys=), emit_batch(key=)."""

    def on_start(self, ctx, t):
        values = ctx.part
        for v in values[:3]:
            ctx.emit(v, key=v % 3)
        ctx.emit_batch(values[3:6], keys=[v % 3 for v in values[3:6]])
        for v in values[6:]:
            ctx.emit_batch([v], key=v % 3)


MEAN = Combiner(add=lambda a, v: (a[0] + v, a[1] + 1), create=lambda v: (v, 1),
                merge=lambda a, b: (a[0] + b[0], a[1] + b[1]))


def test_a_combiner_with_create_and_merge_gives_sums_and_counts(cluster):
    parts = [list(range(10)), list(range(100, 107)), [5]]
    result = cluster.install(word_graph(Mean, combine=MEAN)).run(
        parts={"src": parts}).result(30)
    got: dict = {}
    for outs in result.outputs["count"].values():
        for key, acc in (p for ps in outs for p in ps):
            got[key] = MEAN.merge(got[key], acc) if key in got else acc
    want: dict = {}
    for v in (v for p in parts for v in p):
        s, n = want.get(v % 3, (0, 0))
        want[v % 3] = (s + v, n + 1)
    assert got == want


class Threaded(Operator):
    """Emits from another thread through a held capability, and again from on_complete."""

    def on_start(self, ctx, t):
        cap, words = ctx.hold(), ctx.part

        def work():
            cap.post(lambda c: (c.emit_batch([1] * len(words), keys=words), c.release()))
        threading.Thread(target=work).start()

    def on_complete(self, ctx, t):
        ctx.emit(10, key="late")


def test_capabilities_and_on_complete_fold_too(cluster):
    parts = [["x", "y", "x"], ["y"], ["z"] * 4]
    result = cluster.install(word_graph(Threaded)).run(parts={"src": parts}).result(30)
    want = collections.Counter(w for p in parts for w in p)
    want["late"] = 30
    assert totals(result, 2) == want


class Chain(Operator):
    """A middle node: re-emits every pair it gets under its key, doubled (combining again)."""

    def on_batch(self, ctx, t, port, pairs):
        for key, n in pairs:
            ctx.emit(2 * n, key=key)


def test_two_combining_hops_in_a_row_are_exact(cluster):
    g = Graph("two-hops")
    src = g.node("src", Words, shards=3)
    mid = g.node("mid", Chain, shards=2)
    count = g.node("count", Pairs, shards=3)
    g.edge(src, mid, KEYED, combine=operator.add)
    g.edge(mid, count, KEYED, combine=operator.add)
    parts = [["a", "b"] * 7, ["c", "a"], ["b"]]
    result = cluster.install(g).run(parts={"src": parts}).result(30)
    want = collections.Counter({w: 2 * n for w, n in
                                collections.Counter(w for p in parts for w in p).items()})
    assert totals(result, 3) == want


class Bad(Operator):
    def on_start(self, ctx, t):
        {"no key": lambda: ctx.emit(1),
         "batch no key": lambda: ctx.emit_batch([1, 2]),
         "shard only": lambda: ctx.emit(1, shard=0),
         "keys count": lambda: ctx.emit_batch([1, 2], keys=["a"]),
         "no stable hash": lambda: ctx.emit(1, key=object()),
         }[ctx.arg]()


@pytest.mark.parametrize("what, message", [
    ("no key", r"combining KEYED edge to 'count' needs key="),
    ("batch no key", r"combining KEYED edge to 'count' needs key= or keys="),
    ("shard only", r"combining KEYED edge to 'count' needs key="),
    ("keys count", r"2 values but 1 keys"),
    ("no stable hash", r"a key of type object has no stable hash"),
])
def test_bad_emits_on_a_combining_edge_fail_the_run_by_name(cluster, what, message):
    installed = cluster.install(word_graph(Bad, sources=1))
    with pytest.raises(plaque.OperatorError, match=message):
        installed.run(what).result(30)
    ok = cluster.install(word_graph()).run(parts={"src": [["a"], [], []]}).result(30)
    assert totals(ok, 2) == {"a": 1}  # the worker goes on


class TwoFlushes(Operator):
    """Emits "k" in on_start and again in on_complete: the first pair has been flushed to the
    (remote) bucket before the second comes, so the two meet in ``merge``."""

    def on_start(self, ctx, t):
        ctx.emit(1, key="k")

    def on_complete(self, ctx, t):
        ctx.emit(2, key="k")


def two_flush_graph(merge) -> Graph:
    g = Graph("two-flushes")
    src = g.node("src", TwoFlushes, shards=1, placement=(0,))
    count = g.node("count", Pairs, shards=1, placement=(1,))
    g.edge(src, count, KEYED, combine=Combiner(add=operator.add, merge=merge))
    return g


def test_pairs_flushed_twice_in_a_turn_are_merged_and_a_raising_merge_fails_the_run():
    def boom(a, b):
        raise ArithmeticError("merge exploded")

    with plaque.local_cluster(workers=2, transport="inproc") as c:
        merged = c.install(two_flush_graph(lambda a, b: ("merged", a, b))).run().result(30)
        assert merged.values("count") == [[("k", ("merged", 1, 2))]]
        with pytest.raises(plaque.OperatorError, match="merge exploded"):
            c.install(two_flush_graph(boom)).run().result(30)


@pytest.mark.parametrize("routing", [ONE_TO_ONE, plaque.BROADCAST])
def test_combine_needs_a_keyed_edge_and_a_function(routing):
    g = Graph("bad")
    a, b = g.node("a", Words, shards=2), g.node("b", Pairs, shards=2)
    with pytest.raises(GraphError, match=r"combine= needs a KEYED edge"):
        g.edge(a, b, routing, combine=operator.add)
    with pytest.raises(GraphError, match=r"combine= must be a function f\(acc, value\) or a"):
        g.edge(a, b, KEYED, combine=3)
    with pytest.raises(GraphError, match=r"Combiner merge= must be callable"):
        Combiner(add=operator.add, merge="sum")


words = st.sampled_from(["a", "b", "c", "dd", "é", "", "w1", "w2"])


@settings(max_examples=25, deadline=None)
@given(parts=st.lists(st.lists(words, max_size=30), min_size=1, max_size=4),
       counters=st.integers(1, 4))
def test_combined_counts_equal_counter_for_any_words_and_shapes(parts, counters):
    with plaque.local_cluster(workers=2, transport="inproc") as c:
        g = word_graph(sources=len(parts), counters=counters)
        result = c.install(g).run(parts={"src": parts}).result(30)
    assert totals(result, counters) == collections.Counter(w for p in parts for w in p)


class Echo(Operator):
    def on_batch(self, ctx, t, port, values):
        ctx.output(sorted(values))


def test_a_port_with_a_plain_edge_beside_a_combining_one_feeds_both(cluster):
    g = Graph("beside")
    src = g.node("src", Words, shards=2)
    echo = g.node("echo", Echo, shards=2)
    count = g.node("count", Pairs, shards=2)
    g.edge(src, echo, ONE_TO_ONE)  # gets every value as it was emitted
    g.edge(src, count, KEYED, combine=operator.add)
    parts = [["a", "b", "a"], ["b"]]
    result = cluster.install(g).run(parts={"src": parts}).result(30)
    assert sorted(v for vs in result.values("echo") for v in vs) == [1, 1, 1, 1]
    assert totals(result, 2) == {"a": 2, "b": 2}
