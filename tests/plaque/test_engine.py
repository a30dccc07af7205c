"""End-to-end behaviour of the engine: graphs run on real clusters and give the right answers.

Each test runs on the in-process transport and on worker processes over tcp loopback (the
``cluster`` fixture, one per transport for the module); failure tests use real processes only,
each its own cluster.
"""

import os
import signal
import time

import numpy as np
import pytest
import zmq

import plaque
from plaque import BROADCAST, KEYED, ONE_TO_ONE, Graph, Operator
from plaque.testing.operators import (
    Collect,
    Forward,
    Route,
    Source,
    expected_sparse,
    sparse_graph,
)


@pytest.fixture(scope="module", params=["inproc", "tcp"])
def cluster(request):
    """A 2-worker cluster per transport, shared by this module's tests: each installs graphs
    of its own and none stops or kills a worker of it; one whose graph fails leaves it usable
    (what test_operator_error_names_where_and_cluster_stays_usable checks). A cluster per
    test started 11 tcp clusters, ~13 s of start-ups and shut-downs."""
    with plaque.local_cluster(workers=2, transport=request.param) as c:
        yield c


def test_graph_is_compact_whatever_the_shard_count():
    for n in (1, 8, 1024):
        g = Graph()
        a = g.node("arg", Forward, n)
        b = g.node("A", Forward, n)
        c = g.node("B", Forward, n)
        d = g.node("result", Forward, n)
        for x, y in ((a, b), (b, c), (c, d)):
            g.edge(x, y)
        assert (len(g.nodes), len(g.edges)) == (4, 3)


def test_sparse_exchange_reaches_every_shard_even_empty_ones(cluster):
    ig = cluster.install(sparse_graph())
    res = ig.run(10).result(timeout=30)
    # shards 3..5 receive nothing, yet each is told its input is complete and outputs []
    assert res.outputs["collect"] == expected_sparse(10)


def test_runs_repeat_and_overlap(cluster):
    ig = cluster.install(sparse_graph())
    futures = [ig.run(n) for n in range(12)]
    for n, fut in enumerate(futures):
        res = fut.result(timeout=30)
        assert res.timestamp == n
        assert res.outputs["collect"] == expected_sparse(n)


def test_broadcast_and_several_graphs(cluster):
    g = Graph("bcast")
    s = g.node("src", Source, 2)
    c = g.node("collect", Collect, 3)
    g.edge(s, c, BROADCAST)
    bcast = cluster.install(g)
    sparse = cluster.install(sparse_graph())
    f1, f2 = bcast.run(3), sparse.run(5)
    every = sorted((s, i) for s in range(2) for i in range(3))
    assert f1.result(30).outputs["collect"] == {d: [every] for d in range(3)}
    assert f2.result(30).outputs["collect"] == expected_sparse(5)


class ArraySource(Operator):
    def on_complete(self, ctx, t):
        rng = np.random.default_rng(ctx.shard)
        ctx.emit(rng.standard_normal((256, 512)), shard=1 - ctx.shard)


class ArraySum(Operator):
    def on_input(self, ctx, t, port, value):
        ctx.output(value)


def test_numpy_arrays_arrive_intact(cluster):
    g = Graph("arrays")
    s = g.node("src", ArraySource, 2, placement=[0, 1])
    d = g.node("dst", ArraySum, 2, placement=[0, 1])
    g.edge(s, d, KEYED)
    res = cluster.install(g).run().result(30)
    for shard in (0, 1):
        want = np.random.default_rng(1 - shard).standard_normal((256, 512))
        np.testing.assert_array_equal(res.outputs["dst"][shard][0], want)


class StartTogether(Operator):
    """Each shard outputs the shards its worker started with it in one call."""

    def on_start_shards(self, shards, t):
        together = [ctx.shard for _, ctx in shards]
        for op, ctx in shards:
            ctx.output((ctx.arg, together, op is self))


def test_a_workers_shards_of_a_node_start_in_one_call(cluster):
    """``on_start_shards``: one call per worker for all of its shards of the node, in shard
    order, on the first one's operator."""
    g = Graph("together")
    g.node("n", StartTogether, 5, placement=[0, 1, 0, 1, 0])
    res = cluster.install(g).run(7).result(30)
    assert [res.outputs["n"][s] for s in range(5)] == [[(7, [0, 2, 4], True)], [(7, [1, 3], True)],
                                [(7, [0, 2, 4], False)], [(7, [1, 3], False)],
                                [(7, [0, 2, 4], False)]]


class DeclinesToStartTogether(Operator):
    def on_start_shards(self, shards, t):
        return False

    def on_start(self, ctx, t):
        ctx.output(("alone", ctx.shard))


def test_a_node_that_declines_to_start_together_starts_shard_by_shard(cluster):
    g = Graph("declines")
    g.node("n", DeclinesToStartTogether, 3, placement=[0, 1, 0])
    res = cluster.install(g).run(1).result(30)
    assert [res.outputs["n"][s] for s in range(3)] == [[("alone", s)] for s in range(3)]


class FailsToStart(Operator):
    def on_start_shards(self, shards, t):
        raise ValueError("no start today")


def test_a_failing_start_of_several_shards_fails_the_run_once(cluster):
    g = Graph("fails-together")
    g.node("n", FailsToStart, 4, placement=[0, 1, 0, 1])
    with pytest.raises(plaque.OperatorError, match="no start today") as info:
        cluster.install(g).run(1).result(30)
    assert info.value.node == "n" and info.value.shard in (0, 1)


class Boom(Operator):
    def on_input(self, ctx, t, port, value):
        if value[1] == 3:
            raise ZeroDivisionError("boom at three")
        ctx.emit(value)


def test_operator_error_names_where_and_cluster_stays_usable(cluster):
    g = Graph("boom")
    s = g.node("src", Source, 2)
    b = g.node("boom", Boom, 2)
    c = g.node("collect", Collect, 2)
    g.edge(s, b)
    g.edge(b, c)
    ig = cluster.install(g)
    with pytest.raises(plaque.OperatorError) as info:
        ig.run(5).result(30)
    err = info.value
    assert err.node == "boom" and err.shard in (0, 1) and err.worker in cluster.workers()
    assert "ZeroDivisionError: boom at three" in err.remote_traceback
    assert "in on_input" in err.remote_traceback
    # the same graph still runs (no failing value), and so do others
    assert ig.run(3).result(30).values("collect") == [[(0, 0), (0, 1), (0, 2)],
                                                     [(1, 0), (1, 1), (1, 2)]]
    assert cluster.install(sparse_graph()).run(4).result(30).outputs["collect"] == \
        expected_sparse(4)


class BadKey(Operator):
    def on_complete(self, ctx, t):
        ctx.emit(1, shard=99)


def test_keyed_emit_to_missing_shard_is_an_operator_error(cluster):
    g = Graph("badkey")
    s = g.node("src", BadKey, 1)
    c = g.node("collect", Collect, 2)
    g.edge(s, c, KEYED)
    with pytest.raises(plaque.OperatorError, match=r"needs key=, or shard= in \[0, 2\)"):
        cluster.install(g).run().result(30)


class FailingInit(Operator):
    def __init__(self):
        raise RuntimeError("cannot build this operator")


def test_install_failure_is_a_graph_error(cluster):
    g = Graph("badinit")
    g.node("x", FailingInit, 2)
    with pytest.raises(plaque.GraphError, match="cannot build this operator"):
        cluster.install(g)


def test_bad_graphs_are_refused_at_construction():
    g = Graph()
    a = g.node("a", Forward, 2)
    b = g.node("b", Forward, 3)
    with pytest.raises(plaque.GraphError, match="one-to-one"):
        g.edge(a, b, ONE_TO_ONE)
    g.edge(a, b, KEYED)
    with pytest.raises(plaque.GraphError, match="cycle"):
        g.edge(b, a, KEYED)
    with pytest.raises(plaque.GraphError, match="already used"):
        g.node("a", Forward, 1)
    with pytest.raises(plaque.GraphError, match="positive"):
        g.node("c", Forward, 0)
    with pytest.raises(plaque.GraphError, match="not callable"):
        g.node("d", 42, 1)
    with pytest.raises(plaque.GraphError, match="placement"):
        g.node("e", Forward, 2, placement=[0])


def test_placement_beyond_the_cluster_is_refused(cluster):
    g = Graph()
    g.node("a", Forward, 1, placement=[7])
    with pytest.raises(plaque.GraphError, match="has 2 workers"):
        cluster.install(g)


def test_sparse_exchange_sends_only_what_is_routed():
    """Bytes and tuples on the wire follow what was routed, not the number of shards."""

    class Pick(Operator):
        def on_complete(self, ctx, t):
            for dest in ctx.arg.get(ctx.shard, ()):
                ctx.emit(np.full(100_000, ctx.shard, dtype=np.uint8), shard=dest)

    g = Graph("pick")
    p = g.node("pick", Pick, 4, placement=[0, 0, 0, 0])
    c = g.node("sink", ArraySum, 8, placement=[1] * 8)
    g.edge(p, c, KEYED)
    with plaque.local_cluster(workers=2, transport="tcp") as cluster:
        ig = cluster.install(g)

        def data_to_worker1(routing):
            before = cluster.counters()[0].get(1, {})
            res = ig.run(routing).result(30)
            after = cluster.counters()[0].get(1, {})
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("tuples_sent", "bytes_sent")}
            return res, delta

        res, none = data_to_worker1({})
        # nothing at all: the sinks (no on_complete) need no progress news from worker 0
        assert none["tuples_sent"] == 0 and none["bytes_sent"] < 2_000
        res, some = data_to_worker1({0: [3], 2: [5, 6]})
        assert some["tuples_sent"] == 3
        assert 300_000 <= some["bytes_sent"] <= 300_000 + 4_000
        assert [len(res.outputs["sink"].get(d, [])) for d in range(8)] == [0, 0, 0, 1, 0, 1, 1, 0]


class Stall(Operator):
    def on_complete(self, ctx, t):
        if ctx.arg == ctx.worker:  # the shard on the worker about to be killed never finishes
            time.sleep(60)
        ctx.output(ctx.worker)


def test_lost_worker_fails_its_runs_quickly_and_others_go_on(tcp_cluster3):
    cluster = tcp_cluster3
    w0, w1, w2 = cluster.workers()
    doomed = Graph("doomed")
    doomed.node("stall", Stall, 2, placement=[0, 1])
    safe = Graph("safe")
    safe.node("stall", Stall, 1, placement=[2])
    doomed, safe = cluster.install(doomed), cluster.install(safe)
    fut = doomed.run(w1)
    time.sleep(0.3)
    os.kill(cluster.core.workers[w1].info["pid"], signal.SIGKILL)
    with pytest.raises(plaque.WorkerLost, match=f"worker {w1} lost"):
        fut.result(timeout=15)  # bounded: heartbeats, not a hang
    assert safe.run(None).result(30).values("stall") == [w2]
    with pytest.raises(plaque.WorkerLost):
        doomed.run(None).result(5)
    assert cluster.workers() == [w0, w2]


def test_garbage_on_worker_sockets_is_dropped_and_worker_keeps_serving():
    # insecure: with the default keys no garbage would pass the CURVE handshake to be dropped
    with plaque.local_cluster(workers=2, transport="tcp", insecure=True) as cluster:
        ig = cluster.install(sparse_graph())
        assert ig.run(3).result(30).outputs["collect"] == expected_sparse(3)
        ctx = zmq.Context()
        try:
            for addr in (cluster.core.workers[w].address for w in cluster.workers()):
                for endpoint in addr.split("|"):
                    s = ctx.socket(zmq.PUSH)
                    s.setsockopt(zmq.LINGER, 1000)
                    s.connect(endpoint)
                    for frames in ([b"x"], [b"PQ\x01\x08\x00\x00\x00\x00", b"\x80\x05junk"],
                                   [b"PQ\x09\x08\x00\x00\x00\x00", b""], [b"", b"", b""],
                                   [os.urandom(8), os.urandom(1000)]):
                        s.send_multipart(frames)
                    s.close()
        finally:
            ctx.destroy(linger=1000)  # closes what an exception left open, then terminates
        time.sleep(0.5)
        assert ig.run(7).result(30).outputs["collect"] == expected_sparse(7)
        dropped = sum(c.get("dropped", 0) for w, peers in cluster.counters().items() if w >= 0
                      for c in peers.values())
        assert dropped >= 2 * 2 * 5


def test_worker_started_by_hand_joins_and_exits_when_coordinator_vanishes():
    cluster = plaque.Cluster("tcp://127.0.0.1", heartbeat_timeout=3.0)
    try:
        import subprocess
        import sys

        proc = subprocess.Popen([sys.executable, "-m", "plaque", "worker", "--join",
                                 cluster.address.split("|")[0], "--coordinator-timeout", "1.5",
                                 "--insecure"])  # as its coordinator: plain tcp
        cluster.processes.append(proc)
        cluster.wait_for_workers(1, timeout=30)
        assert cluster.install(sparse_graph(2, 3)).run(2).result(30).outputs["collect"] == \
            expected_sparse(2, 2, 3)
        cluster._call(lambda: cluster._endpoint.stop("vanish"))  # no goodbye to the worker
        assert proc.wait(timeout=15) == 0
    finally:
        cluster.close()


def test_ipc_transport_runs_the_sparse_exchange():
    with plaque.local_cluster(workers=2, transport="ipc") as cluster:
        assert cluster.address.startswith("ipc://")
        ig = cluster.install(sparse_graph())
        assert ig.run(6).result(30).outputs["collect"] == expected_sparse(6)


class Later(Operator):
    """Holds its capability and finishes on another thread, as a device executor would."""

    def on_start(self, ctx, t):
        self.started = t

    def on_complete(self, ctx, t):
        import threading

        cap = ctx.hold()
        shard, started = ctx.shard, self.started

        def work():
            time.sleep(0.05 * (shard + 1))
            if ctx.arg == "fail" and shard == 1:
                cap.post(lambda c: 1 / 0)
            else:
                cap.post(lambda c: (c.emit((shard, started), shard=0), c.release()))

        threading.Thread(target=work).start()


def test_held_capability_delays_completion_until_released(cluster):
    g = Graph("later")
    s = g.node("later", Later, 3)
    c = g.node("collect", Collect, 1)
    g.edge(s, c, KEYED)
    ig = cluster.install(g)
    assert ig.run(None).result(30).values("collect") == [[(0, 0), (1, 0), (2, 0)]]
    with pytest.raises(plaque.OperatorError, match="ZeroDivisionError"):
        ig.run("fail").result(30)
    assert ig.run(None).result(30).values("collect") == [[(0, 2), (1, 2), (2, 2)]]


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_aligned_chains_send_no_progress_between_workers(transport):
    """Shard i of every node on the same worker: nothing another worker does can matter, so
    no progress message crosses workers (the coordinator still hears the end of each run).
    A cluster of its own: the counters are its whole life's."""
    g = Graph("aligned")
    s = g.node("src", Source, 2, placement=[0, 1])
    f = g.node("fwd", Forward, 2, placement=[0, 1])
    c = g.node("collect", Collect, 2, placement=[0, 1])
    g.edge(s, f)
    g.edge(f, c)
    with plaque.local_cluster(workers=2, transport=transport) as cluster:
        ig = cluster.install(g)
        for n in range(3):
            assert ig.run(n).result(30).values("collect") == [
                [(0, i) for i in range(n)], [(1, i) for i in range(n)]]
        counters = cluster.counters()
        w0, w1 = cluster.workers()
    assert counters[w0].get(w1, {}).get("progress_sent", 0) == 0
    assert counters[w1].get(w0, {}).get("progress_sent", 0) == 0


class Busy(Operator):
    """Computes (blocks its worker's event loop) for longer than the heartbeat timeout."""

    def on_complete(self, ctx, t):
        time.sleep(ctx.arg)
        ctx.output("done")


def test_a_busy_worker_is_not_declared_lost():
    with plaque.local_cluster(workers=2, transport="tcp", heartbeat_timeout=2.0) as cluster:
        g = Graph("busy")
        g.node("busy", Busy, 2)
        assert cluster.install(g).run(3.0).result(30).values("busy") == ["done", "done"]
        assert len(cluster.workers()) == 2


def test_a_stalled_coordinator_does_not_declare_its_workers_lost():
    """The coordinator's own loop stalls past the heartbeat timeout (a saturated machine):
    the workers' heartbeats wait unread in its inbox, which is not their silence."""
    with plaque.local_cluster(workers=2, transport="tcp", heartbeat_timeout=2.0) as cluster:
        g = Graph("after-stall")
        g.node("busy", Busy, 2)
        installed = cluster.install(g)
        time.sleep(0.5)  # past the install: the workers' last words are stamped by a tick
        cluster.call_soon(lambda: time.sleep(3.0))
        assert installed.run(0.0).result(30).values("busy") == ["done", "done"]
        assert len(cluster.workers()) == 2


def test_wildcard_binds_are_announced_under_a_dialable_name(monkeypatch):
    monkeypatch.setenv("PLAQUE_ADVERTISE", "127.0.0.1")
    cluster = plaque.Cluster("tcp://0.0.0.0")
    try:
        assert cluster.address.startswith("tcp://127.0.0.1:")
        cluster.start_worker_processes(2, bind="tcp://0.0.0.0")
        cluster.wait_for_workers(2, timeout=30)
        for w in cluster.workers():
            assert "0.0.0.0" not in cluster.core.workers[w].address
        assert cluster.install(sparse_graph()).run(4).result(30).outputs["collect"] == \
            expected_sparse(4)
    finally:
        cluster.close()


class OutputEach(Operator):
    def on_input(self, ctx, t, port, value):
        ctx.output(value)


@pytest.mark.parametrize("sink_notifies", [True, False])
def test_operators_that_need_no_notifications(cluster, sink_notifies):
    """Never-notified nodes drop their capability at once; runs still end exactly when all
    their tuples have been handled, and notified shards downstream still complete correctly."""
    g = Graph("eager")
    s = g.node("src", Source, 2, placement=[0, 1], notify=True)
    r = g.node("router", Route, 2, placement=[1, 0], notify=False)
    if sink_notifies:
        c = g.node("collect", Collect, 6, notify=True)
    else:
        c = g.node("collect", OutputEach, 6, notify=False)
    g.edge(s, r, ONE_TO_ONE)
    g.edge(r, c, KEYED)
    ig = cluster.install(g)
    futures = [ig.run(n) for n in (3, 7, 0, 5)]
    for n, fut in zip((3, 7, 0, 5), futures):
        res = fut.result(30)
        want = expected_sparse(n, 2, 6)
        if sink_notifies:
            assert res.outputs["collect"] == want
        else:
            got = {d: sorted(v) for d, v in res.outputs.get("collect", {}).items()}
            assert got == {d: w[0] for d, w in want.items() if w[0]}
