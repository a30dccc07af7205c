"""Partitioned input: ``run(arg, parts={node: [one part per shard]})`` gives each shard its
own part (``ctx.part``), sent only to the worker hosting that shard, while ``arg`` still
reaches every shard; parts that do not fit the graph fail the run's future by name."""

from __future__ import annotations

import pytest

import plaque
from plaque import KEYED, Graph, Operator
from plaque.errors import GraphError


class Source(Operator):
    """Emits its shard's part, word by word, keyed by word; and, once, what it saw: its part,
    the run's argument, and which shards' parts its worker holds for this run."""

    def on_start(self, ctx, t):
        held = sorted(ctx.local_graph.parts.get(t, {}))
        ctx.output(("seen", ctx.shard, ctx.worker, ctx.part, ctx.arg, held))
        for word in (ctx.part or "").split():
            ctx.emit(word, key=word)


class Count(Operator):
    def on_input(self, ctx, t, port, word):
        ctx.state[word] = ctx.state.get(word, 0) + 1

    def on_complete(self, ctx, t):
        for word, n in ctx.state.items():
            ctx.output(("count", word, n))


def graph() -> Graph:
    g = Graph("parts")
    src = g.node("src", Source, shards=4)
    count = g.node("count", Count, shards=2)
    g.edge(src, count, KEYED)
    return g


PARTS = ["a b", "b c c", "", "d a"]


@pytest.fixture(scope="module", params=["inproc", None])  # None: worker processes
def installed(request):
    with plaque.local_cluster(workers=2, transport=request.param) as cluster:
        yield cluster.install(graph())


def _outputs(result):
    return result.values("src") + result.values("count")


def test_each_shard_gets_its_own_part_and_only_its_worker_holds_it(installed):
    result = installed.run("shared", parts={"src": PARTS}).result(30)
    seen = sorted(v[1:] for v in _outputs(result) if v[0] == "seen")
    assert [(shard, part, arg) for shard, _, part, arg, _ in seen] == \
        [(i, p, "shared") for i, p in enumerate(PARTS)]
    src = 0  # node index of "src"
    for shard, worker, _, _, held in seen:  # a worker holds the parts of its own shards
        mine = sorted((src, s) for s, w, *_ in seen if w == worker)
        assert held == mine, (shard, worker, held)
    counts = {v[1]: v[2] for v in _outputs(result) if v[0] == "count"}
    assert counts == {"a": 2, "b": 2, "c": 2, "d": 1}


def test_a_run_without_parts_gives_none_and_runs_overlap_with_their_own(installed):
    futures = [installed.run(i, parts={"src": [f"w{i}"] * 4}) for i in range(3)]
    plain = installed.run("no parts").result(30)
    for i, fut in enumerate(futures):
        counts = {v[1]: v[2] for v in _outputs(fut.result(30)) if v[0] == "count"}
        assert counts == {f"w{i}": 4}
    assert {v[3] for v in _outputs(plain) if v[0] == "seen"} == {None}


@pytest.mark.parametrize("parts, message", [
    ({"nope": PARTS}, r"parts for 'nope': graph 'parts' has no such node \(its nodes: 'src',"
                      r" 'count'\)"),
    ({"src": PARTS[:3]}, r"parts for 'src': 3 given for its 4 shards \(one per shard\)"),
    ({"src": 7}, r"parts for 'src' must be a sequence of one part per shard, got int"),
    (["a"], r"parts must be a dict of node name -> one part per shard, got list"),
])
def test_parts_that_do_not_fit_the_graph_fail_the_run_by_name(installed, parts, message):
    with pytest.raises(GraphError, match=message):
        installed.run(None, parts=parts).result(30)
    assert installed.run(None, parts={"src": PARTS}).result(30)  # the graph still runs
