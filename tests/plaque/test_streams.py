"""Streams: the driver feeds a graph's input node epoch after epoch; each epoch is a run whose
operators are told, in epoch order, when its input is complete, and ``ctx.keyed_state`` lives
across the epochs of a stream until it closes."""

from __future__ import annotations

import collections
import json
import operator
import os
import threading
import time

import pytest

import plaque
from plaque import KEYED, ONE_TO_ONE, Graph, GraphError, JsonlSink, Operator
from plaque.streams import StreamClosed


class Split(Operator):
    def on_batch(self, ctx, t, port, lines):
        for line in lines:
            for word in line.split():
                ctx.emit(1, key=word)


class RunningCount(Operator):
    """Gathers an epoch's pairs in ctx.state; at the epoch's end folds them into the
    stream's keyed_state and outputs (and emits) the running totals of the words it saw in
    this epoch."""

    def on_batch(self, ctx, t, port, pairs):
        epoch = ctx.state.setdefault("epoch", collections.Counter())
        for word, n in pairs:
            epoch[word] += n

    def on_complete(self, ctx, t):
        totals = ctx.keyed_state
        for word, n in ctx.state.get("epoch", {}).items():
            totals[word] = totals.get(word, 0) + n
        running = {w: totals[w] for w in ctx.state.get("epoch", {})}
        ctx.output(running)
        ctx.emit(running)  # to the sink, where there is one


class Probe(Operator):
    """Outputs how many keyed states its worker still holds, and its stream."""

    def on_complete(self, ctx, t):
        ctx.output((len(ctx.local_graph.stream_states), ctx.stream))


def stream_graph(counters=2, sink=None) -> Graph:
    g = Graph("running-count")
    lines = g.input("lines", shards=2)
    split = g.node("split", Split, shards=2)
    count = g.node("count", RunningCount, shards=counters)
    g.edge(lines, split, ONE_TO_ONE)
    g.edge(split, count, KEYED, combine=operator.add)
    g.node("probe", Probe, shards=2, placement=(0, 1))
    if sink is not None:
        g.edge(count, g.node("out", sink, shards=counters), ONE_TO_ONE)
    return g


def merged(result) -> dict:
    out: dict = {}
    for d in result.values("count"):
        assert not set(d) & set(out), "a word on two shards"
        out.update(d)
    return out


EPOCHS = [["a b a", "c"], ["b b", "d a"], [], ["a"]]


@pytest.fixture(scope="module", params=["inproc", None])  # None: worker processes
def installed(request):
    with plaque.local_cluster(workers=2, transport=request.param) as c:
        yield c.install(stream_graph())


def test_a_running_count_over_epochs_sees_exactly_the_epochs_before(installed):
    futures = []
    with installed.stream() as stream:  # advancing without waiting: epochs overlap
        for i, lines in enumerate(EPOCHS):
            for line in lines:
                stream.send([line])
            futures.append(stream.advance() if i < len(EPOCHS) - 1 else stream.close())
    running: collections.Counter = collections.Counter()
    for lines, fut in zip(EPOCHS, futures):
        epoch = collections.Counter(w for line in lines for w in line.split())
        running.update(epoch)
        assert merged(fut.result(30)) == {w: running[w] for w in epoch}
    assert stream.epoch == len(EPOCHS) - 1


def test_keyed_state_is_dropped_when_the_stream_closes_and_runs_see_none(installed):
    stream = installed.stream()
    stream.send(["x y"])
    assert merged(stream.advance().result(30)) == {"x": 1, "y": 1}
    stream.send(["x"])
    assert merged(stream.close().result(30)) == {"x": 2}
    plain = installed.run().result(30)  # a plain run: no stream, and no state left
    assert plain.values("probe") == [(0, None), (0, None)]
    assert plain.values("count") == [{}, {}]


def test_two_streams_at_once_keep_their_own_state(installed):
    s1, s2 = installed.stream(), installed.stream()
    s1.send(["k"]), s2.send(["k k"])
    a1, a2 = s1.advance(), s2.advance()
    s1.send(["k"]), s2.send(["k"])
    b1, b2 = s1.close(), s2.close()
    assert [merged(f.result(30)) for f in (a1, b1, a2, b2)] == \
        [{"k": 1}, {"k": 2}, {"k": 2}, {"k": 3}]


def test_send_routes_by_shard_and_keys_reach_keyed_edges():
    class Tag(Operator):
        def on_batch(self, ctx, t, port, values):
            ctx.output([(ctx.shard, v) for v in values])

    g = Graph("keyed-input")
    inp = g.input("in", shards=3)
    tag = g.node("tag", Tag, shards=4)
    g.edge(inp, tag, KEYED)
    with plaque.local_cluster(workers=2, transport="inproc") as c:
        stream = c.install(g).stream()
        stream.send(["a", "b", "c", "d"], keys=["a", "b", "c", "d"], shard=2)
        got = [p for ps in stream.close().result(30).values("tag") for p in ps]
    assert sorted(got) == sorted((plaque.stable_shard(v, 4), v) for v in "abcd")


def test_an_epoch_that_fails_fails_alone_and_the_stream_goes_on(installed):
    stream = installed.stream()
    stream.send([None])  # the splitter raises: None has no split()
    bad = stream.advance()
    stream.send(["ok"])
    good = stream.close()
    with pytest.raises(plaque.OperatorError, match="'NoneType' object has no attribute"):
        bad.result(30)
    assert merged(good.result(30)) == {"ok": 1}


def test_each_epoch_publishes_its_own_sink_directory(tmp_path):
    with plaque.local_cluster(workers=2, transport="inproc") as c:
        g = stream_graph(sink=JsonlSink(tmp_path / "epoch-{t}"))
        stream = c.install(g).stream()
        stream.send(["a b"])
        first = stream.advance()
        stream.send(["a"])
        second = stream.close()
        results = [first.result(30), second.result(30)]
    for result, want in zip(results, [{"a": 1, "b": 1}, {"a": 2}]):
        directory = tmp_path / f"epoch-{result.timestamp}"
        rows = [json.loads(line) for f in sorted(os.listdir(directory))
                for line in open(directory / f)]
        assert {k: v for d in rows for k, v in d.items()} == want


def test_bad_use_is_named(installed):
    g = Graph("no-input")
    g.node("a", Probe)
    with pytest.raises(GraphError, match=r"graph 'no-input' has no input node to stream into"):
        installed.cluster.install(g).stream()
    stream = installed.stream()
    with pytest.raises(ValueError, match=r"input 'lines' has shards 0..1, got shard=2"):
        stream.send(["x"], shard=2)
    with pytest.raises(ValueError, match=r"'nope' is not an input node \(inputs: \['lines'\]"):
        stream.send(["x"], node="nope")
    with pytest.raises(ValueError, match=r"2 values but 1 keys"):
        stream.send(["x", "y"], keys=["x"])
    stream.close().result(30)
    for call in (lambda: stream.send(["x"]), stream.advance, stream.close):
        with pytest.raises(StreamClosed, match=r"is closed"):
            call()


def test_a_stream_of_a_closed_cluster_fails_its_epochs_and_leaves_no_staging(tmp_path):
    with plaque.local_cluster(workers=2, transport="inproc") as c:
        stream = c.install(stream_graph(sink=JsonlSink(tmp_path / "epoch-{t}"))).stream()
        stream.send(["a"])
        first = stream.advance()
        assert merged(first.result(30)) == {"a": 1}
    with pytest.raises(plaque.ClusterClosed):
        stream.advance().result(5)
    assert sorted(os.listdir(tmp_path)) == [f"epoch-{first.result().timestamp}"]


def test_progress_shows_where_an_open_epoch_waits(installed):
    """An open epoch holds its input's capability, so no worker is done with it: the
    coordinator (told once per worker per run) counts every node not done; a worker knows
    its own shards exactly (the probe, with no inputs, is done there). Once the stream closes,
    the run is gone from both."""
    import time

    stream = installed.stream()
    stream.send(["q"])
    want = {"lines": 2, "split": 2, "count": 2, "probe": 2}
    deadline = time.monotonic() + 30
    while list((runs := installed.progress()).values()) != [want]:  # one run: the epoch
        assert time.monotonic() < deadline, f"progress stuck at {runs}"
        time.sleep(0.05)
    assert installed.cluster.progress()[installed.gid]["nodes"] == want  # shards per node
    assert merged(stream.close().result(30)) == {"q": 1}
    assert installed.progress() == {}


class Gate(Operator):
    """Keeps each epoch unfinished until the test lets it go: says ``held-<t>`` in the
    directory the run's argument names and releases its capability once ``open-<t>`` is
    there (a minute at most: nothing is left hanging)."""

    def on_start(self, ctx, t):
        cap, where = ctx.hold(), ctx.arg
        open(os.path.join(where, f"held-{t}"), "w").close()

        def wait():
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(where, f"open-{t}")) and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
            cap.post(lambda c: c.release())  # on the worker's loop, as it must be
        threading.Thread(target=wait, daemon=True).start()


def release_oldest(where) -> None:
    """Let the oldest epoch held by a Gate finish, once one is held."""
    deadline = time.monotonic() + 30
    while True:
        held = {int(n[5:]) for n in os.listdir(where) if n.startswith("held-")} - \
            {int(n[5:]) for n in os.listdir(where) if n.startswith("open-")}
        if held or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    open(os.path.join(where, f"open-{min(held)}"), "w").close()


def test_advance_waits_while_max_in_flight_epochs_are_unfinished(tmp_path):
    """A driver faster than its graph waits in advance() instead of piling epochs up: with
    two closed epochs held unfinished a third advance cannot close its epoch (here it gives
    up after its timeout, the epoch still open); once the oldest finishes it goes on."""
    g = Graph("gated")
    g.edge(g.input("in", shards=1), g.node("gate", Gate, shards=1), ONE_TO_ONE)
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        stream = c.install(g).stream(str(tmp_path), max_in_flight=2)
        first = stream.advance()
        second = stream.advance()
        assert stream.epoch == 2 and not first.done() and not second.done()
        with pytest.raises(TimeoutError, match=r"2 epochs still running after 0.2 s; epoch 2"
                                               r" stays open"):
            stream.advance(timeout=0.2)
        assert stream.epoch == 2
        release_oldest(tmp_path)
        third = stream.advance(timeout=30)  # the oldest finished: one more may be closed
        assert first.done() and stream.epoch == 3 and not second.done()
        epochs = [first, second, third, stream.close()]
        for _ in epochs[1:]:
            release_oldest(tmp_path)
        stamps = [f.result(30).timestamp for f in epochs]
        assert stamps == sorted(stamps)
        with pytest.raises(ValueError, match="max_in_flight must be an int >= 1, got 0"):
            c.install(g).stream(max_in_flight=0)
