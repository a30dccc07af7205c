"""Progress tracking end to end, on a simulated network driven by hypothesis.

One ``CoordinatorCore`` and W ``WorkerCore`` state machines (W in 1..4) talk through
``plaque.testing.SimulatedCluster``: one FIFO queue per (sender, receiver, channel), which is
exactly what the transport guarantees, and nothing more. No sockets, threads, clocks or event
loop. Hypothesis picks which non-empty queue delivers next, so messages from different
senders and on the DATA and CONTROL channels interleave arbitrarily while each queue stays in
order.

Graphs are random DAGs of 1-5 nodes with 1-4 shards, random routings and placements; every
operator logs what it sees. Each node works in one of four modes, so graphs mix them: per tuple
(``on_input``, ``emit(shard=)``), per tuple with keys (``emit(key=)``), in batches of lists
(``on_batch``, ``emit_batch(keys=)``, per-run sums in ``ctx.state``) and in batches of numpy
arrays (``emit_batch(array, shards=)``). The properties:

- safety: a shard never gets a tuple at t after it was told "complete for t", completions
  come in timestamp order, and ``run_done`` only comes once every shard completed the run;
- liveness: once the network drains, every shard completed every run, each run finished
  exactly once, and every shard received exactly what a sequential reference computation of
  the same graph says (which also shows no shard completed before its input was in);
- the number of PROGRESS messages of a run does not grow with shards x shards.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from plaque import stable_shard, stable_shards
from plaque.events import RunDone, RunFailed
from plaque.graph import BROADCAST, KEYED, ONE_TO_ONE, Graph
from plaque.operator import Operator
from plaque.testing import COORD
from plaque.testing import SimulatedCluster as SimNet
from plaque.wire import CONTROL, DATA, Kind

MOD = 1009


# ---- operators and their sequential reference -------------------------------------------------
# A node is described by a plain spec so that operators (shipped to workers by cloudpickle)
# and the reference computation below share one definition of what each shard does.
# spec = (node index, is_source, outs, mode) with outs = ((port, routing, destination shards),
# ...) and mode one of MODES (how the operator receives and sends; never what), or "forward":
# a node that is never notified (notify=False) and only forwards; it has no completion sum.
MODES = ("tuple", "key", "batch", "array", "forward")


def derive(value, node, shard, port):
    """The value a shard sends on ``port`` for ``value``: deterministic, order-free."""
    return (value * 31 + node * 7 + shard * 3 + port) % MOD


def targets(value, routing, shard, dst_shards):
    """Destination shards of ``value``; KEYED drops one value in (dst_shards + 1) and sends
    the others to the shard of their stable key."""
    if routing is ONE_TO_ONE:
        return [shard]
    if routing is BROADCAST:
        return list(range(dst_shards))
    return [] if value % (dst_shards + 1) == dst_shards else [stable_shard(value, dst_shards)]


def forwards(value):
    """Non-source nodes forward only some inputs, so broadcast fan-out stays small."""
    return value % 3 != 0


class SimOp(Operator):
    """Logs ("input", t, port, value) and ("complete", t) per shard; emits and outputs."""

    def __init__(self, spec):
        self.node, self.is_source, self.outs, self.mode = spec
        self.events = []
        self.sums = {}

    def send(self, ctx, values):
        """Send what ``values`` derive to, as this node's mode does."""
        for port, routing, dst_shards in self.outs:
            derived = [derive(v, self.node, ctx.shard, port) for v in values]
            if routing is KEYED:
                derived = [v for v in derived if targets(v, routing, ctx.shard, dst_shards)]
            self.emit(ctx, port, derived, dst_shards if routing is KEYED else None)

    def emit(self, ctx, port, values, keyed_shards):
        if self.mode == "batch":
            ctx.emit_batch(values, port=port, keys=None if keyed_shards is None else values)
        elif self.mode == "array":
            rows = np.array(values, dtype=np.int64)
            dests = None if keyed_shards is None else stable_shards(rows, keyed_shards)
            ctx.emit_batch(rows, port=port, shards=dests)
        else:
            for v in values:
                if keyed_shards is None:
                    ctx.emit(v, port=port)
                elif self.mode == "key":
                    ctx.emit(v, port=port, key=v)
                else:
                    ctx.emit(v, port=port, shard=stable_shard(v, keyed_shards))

    def on_batch(self, ctx, t, port, values):
        if self.mode in ("tuple", "key", "forward"):
            return super().on_batch(ctx, t, port, values)  # on_input, tuple by tuple
        values = [int(v) for v in values]
        for v in values:
            self.events.append(("input", t, port, v))
            if v % 4 == 0:
                ctx.output(("in", v))
        ctx.state["sum"] = ctx.state.get("sum", 0) + sum(values)
        self.send(ctx, [v for v in values if forwards(v)])

    def on_input(self, ctx, t, port, value):
        self.events.append(("input", t, port, value))
        self.sums[t] = self.sums.get(t, 0) + value
        if forwards(value):
            self.send(ctx, [value])
        if value % 4 == 0:
            ctx.output(("in", value))

    def on_complete(self, ctx, t):
        self.events.append(("complete", t))
        if self.is_source:
            self.send(ctx, list(ctx.arg))
            for a in ctx.arg:
                ctx.output(("src", a))
        else:  # emission during completion, from everything received: wrong if completed early
            batched = self.mode in ("batch", "array")
            total = ctx.state.get("sum", 0) if batched else self.sums.pop(t, 0)
            self.send(ctx, [total + t])
            ctx.output(("sum", total))


class SimOpFactory:
    """A picklable zero-argument factory (Graph.node wants a callable)."""

    def __init__(self, spec):
        self.spec = spec

    def __call__(self):
        return SimOp(self.spec)


def shard_sends(spec, shard, value):
    """(port, destination shard, value) of every tuple one shard sends for ``value``."""
    node, _, outs, _ = spec
    out = []
    for port, routing, dst_shards in outs:
        v = derive(value, node, shard, port)
        out += [(port, s, v) for s in targets(v, routing, shard, dst_shards)]
    return out


def reference(setup, t, arg):
    """Sequential run t: per (node, shard), the sorted inputs (port, value) and outputs."""
    inputs = {(n, s): [] for n, k in enumerate(setup.shards) for s in range(k)}
    outputs = {key: [] for key in inputs}
    dst_of_port = {port: dst for port, (_, dst, _) in enumerate(setup.edges)}
    for n, k in enumerate(setup.shards):  # index order is a topological order
        spec = setup.spec(n)
        for s in range(k):
            sends, got = [], inputs[(n, s)]
            if spec[1]:
                for a in arg:
                    sends += shard_sends(spec, s, a)
                    outputs[(n, s)].append(("src", a))
            else:
                for _, v in got:
                    sends += shard_sends(spec, s, v) if forwards(v) else []
                    outputs[(n, s)] += [("in", v)] if v % 4 == 0 else []
                if spec[3] != "forward":
                    total = sum(v for _, v in got)
                    sends += shard_sends(spec, s, total + t)
                    outputs[(n, s)].append(("sum", total))
            for port, dst_shard, v in sends:
                inputs[(dst_of_port[port], dst_shard)].append((port, v))
    return ({k: sorted(v) for k, v in inputs.items()},
            {k: sorted(v) for k, v in outputs.items()})


class Setup:
    """A random test case: graph shape, placement, workers and runs."""

    def __init__(self, workers, shards, edges, placements, runs, modes=None):
        self.workers, self.shards, self.edges = workers, shards, edges
        self.placements, self.runs = placements, runs  # runs: [(arg, deliveries before next)]
        self.modes = modes or ["tuple"] * len(shards)

    def spec(self, n):
        # Each edge has its own output port and input port (its index), so KEYED choices and
        # the reference can tell edges apart even between the same two nodes.
        outs = tuple((port, routing, self.shards[dst])
                     for port, (src, dst, routing) in enumerate(self.edges) if src == n)
        return (n, not any(dst == n for _, dst, _ in self.edges), outs, self.modes[n])

    def graph(self):
        g = Graph("sim")
        nodes = [g.node(f"n{n}", SimOpFactory(self.spec(n)), k, self.placements[n],
                        notify=self.modes[n] != "forward")
                 for n, k in enumerate(self.shards)]
        for port, (src, dst, routing) in enumerate(self.edges):
            g.edge(nodes[src], nodes[dst], routing, src_port=port, dst_port=port)
        return g

    def __repr__(self):
        return (f"Setup(workers={self.workers}, shards={self.shards}, edges={self.edges},"
                f" placements={self.placements}, runs={self.runs}, modes={self.modes})")


def shard_logs(net, gid):
    """(node, shard) -> the operator's event list, from every worker that hosts the graph."""
    logs = {}
    for core in net.workers():
        g = core.graphs.get(gid)
        for key, (op, _) in (g.ops.items() if g else ()):
            logs[key] = op.events
    return logs


# ---- random cases -----------------------------------------------------------------------------


@st.composite
def setups(draw):
    workers = draw(st.integers(1, 4))
    n = draw(st.integers(1, 5))
    base = draw(st.integers(1, 4))
    # Most nodes share one shard count so that ONE_TO_ONE chains are common.
    shards = [draw(st.sampled_from([base, base, 1, 2, 3, 4])) for _ in range(n)]
    edges = []
    for src, dst in itertools.combinations(range(n), 2):
        kinds = [None, None, KEYED, BROADCAST]
        kinds += [ONE_TO_ONE, ONE_TO_ONE] if shards[src] == shards[dst] else []
        routing = draw(st.sampled_from(kinds))
        if routing is not None:
            edges.append((src, dst, routing))
    placements = [draw(st.none() | st.tuples(*[st.integers(0, workers - 1)] * k))
                  for k in shards]
    args = st.lists(st.integers(0, 60), max_size=3)
    runs = draw(st.lists(st.tuples(args, st.integers(0, 25)), min_size=1, max_size=3))
    sources = set(range(n)) - {dst for _, dst, _ in edges}  # they emit when complete
    modes = [draw(st.sampled_from(MODES[:-1] if i in sources else MODES)) for i in range(n)]
    return Setup(workers, shards, edges, placements, runs, modes)


def hypothesis_chooser(data, budget=400):
    """Let hypothesis pick each delivery; past ``budget`` picks, drain the first queue."""
    left = [budget]

    def choose(n):
        if n == 1 or left[0] <= 0:
            return 0
        left[0] -= 1
        return data.draw(st.integers(0, n - 1), label="queue")

    return choose


def check_run_done_is_not_early(net, gid, setup, ts):
    """A run is reported done only once every shard of every notified node completed it and
    every never-notified shard has all of its input."""
    shards = [(n, s) for n, k in enumerate(setup.shards) for s in range(k)]
    notified = [key for key in shards if setup.modes[key[0]] != "forward"]

    def on_event(ev):
        if isinstance(ev, RunDone) and ev.gid == gid:
            logs, t = shard_logs(net, gid), ev.t
            late = [key for key in notified if ("complete", t) not in logs[key]]
            assert not late, f"run {t} done while {late} had not completed it"
            want_in, _ = reference(setup, t, setup.runs[ts.index(t)][0])
            for key in set(shards) - set(notified):
                got = sorted(e[2:] for e in logs[key] if e[0] == "input" and e[1] == t)
                assert got == want_in[key], f"run {t} done before {key} had all its input"

    return on_event


def check_safety(logs):
    """Per shard: no input at t after "complete for t"; completions in increasing t."""
    for key, events in logs.items():
        completed = -1
        for ev in events:
            assert ev[1] > completed, f"shard {key}: {ev} after complete for t={completed}"
            if ev[0] == "complete":
                completed = ev[1]


def check_liveness(net, gid, setup, ts, logs):
    assert not net.pending()
    done = [ev for ev in net.events if isinstance(ev, (RunDone, RunFailed))]
    assert sorted(ev.t for ev in done) == ts, done
    assert all(isinstance(ev, RunDone) for ev in done), done
    results = {ev.t: ev.result for ev in done}
    for t, (arg, _) in zip(ts, setup.runs):
        want_in, want_out = reference(setup, t, arg)
        for (n, s), events in logs.items():
            if setup.modes[n] != "forward":
                assert ("complete", t) in events, f"shard {(n, s)} never completed t={t}"
            got = sorted(ev[2:] for ev in events if ev[0] == "input" and ev[1] == t)
            assert got == want_in[(n, s)], f"shard {(n, s)} at t={t}"
            got_out = results[t].outputs.get(f"n{n}", {}).get(s, [])
            assert sorted(got_out) == want_out[(n, s)], f"outputs of {(n, s)} at t={t}"
    assert len(logs) == sum(setup.shards)


def assert_nothing_dropped(net):
    for core in net.cores.values():
        assert all(c.dropped == 0 for c in core.counters.peers.values())


@settings(max_examples=150, deadline=None)
@given(setup=setups(), data=st.data())
def test_progress_is_safe_and_live_under_any_interleaving(setup, data):
    net = SimNet(setup.workers)
    net.join()
    gid = net.install(setup.graph())
    net.choose = hypothesis_chooser(data)
    ts = []
    net.on_event = check_run_done_is_not_early(net, gid, setup, ts)
    for arg, deliveries_before_next in setup.runs:  # later runs may start mid-flight
        ts.append(net.start(gid, arg))
        net.run(limit=deliveries_before_next)
    net.run()
    logs = shard_logs(net, gid)
    check_safety(logs)
    check_liveness(net, gid, setup, ts, logs)
    assert_nothing_dropped(net)


# ---- progress traffic does not grow with shards x shards --------------------------------------


class EmitToEveryShard(Operator):
    """A source whose every shard sends one tuple to every shard of the KEYED destination."""

    def on_complete(self, ctx, t):
        for s in range(ctx.num_shards):  # the destination has as many shards
            ctx.emit((ctx.shard, s), shard=s)


class CountInputs(Operator):
    def __init__(self):
        self.got = 0

    def on_input(self, ctx, t, port, value):
        self.got += 1


def traffic_of_one_run(shards, choose):
    """(PROGRESS messages, tuples received) of one run of A(N) -KEYED-> B(N) on 2 workers."""
    g = Graph("exchange")
    g.edge(g.node("a", EmitToEveryShard, shards), g.node("b", CountInputs, shards), KEYED)
    net = SimNet(2)
    net.join()
    gid = net.install(g)
    before = net.sent[Kind.PROGRESS]
    net.choose = choose
    net.start(gid, None)
    net.run()
    assert [type(ev) for ev in net.events].count(RunDone) == 1
    received = sum(op.got for (node, _), (op, _) in
                   itertools.chain(*(w.graphs[gid].ops.items() for w in net.workers()))
                   if node == 1)
    return net.sent[Kind.PROGRESS] - before, received


def test_progress_messages_per_run_do_not_grow_with_shards_squared():
    # Changes made in one turn travel as one batch per peer, however many shards and tuples
    # they concern, so the count depends on turns and workers, not on N.
    for choose in (lambda n: 0, lambda n: n - 1):  # two fixed delivery orders
        counts = {}
        for n in (2, 8, 32):
            counts[n], received = traffic_of_one_run(n, choose)
            assert received == n * n
        assert counts[32] == counts[8] == counts[2], counts
        assert counts[2] <= 16, counts  # a few turns x 2 workers x (peer + coordinator)


# ---- a run's argument when its tuples overtake its START --------------------------------------


class EmitArg(Operator):
    def on_complete(self, ctx, t):
        ctx.emit(ctx.arg)


class RecordArg(Operator):
    def __init__(self):
        self.seen = []

    def on_input(self, ctx, t, port, value):
        self.seen.append((t, value, ctx.arg))


def test_run_arg_is_visible_when_data_overtakes_start():
    # DATA (worker 0 -> worker 1) and START (coordinator -> worker 1) travel on different
    # connections, so the tuple may arrive first. on_input must still see the run's argument.
    g = Graph("overtake")
    g.edge(g.node("a", EmitArg, 1, placement=[0]), g.node("b", RecordArg, 1, placement=[1]),
           ONE_TO_ONE)
    net = SimNet(2)
    net.join()
    assert net.routes[COORD] == {0: "w0", 1: "w1"}
    gid = net.install(g)
    net.start(gid, "the-arg")
    net.deliver(COORD, "w0", CONTROL)  # START reaches worker 0 only; a0 emits at once
    net.deliver("w0", "w1", DATA)  # ... and its tuple reaches worker 1 before START does
    net.run()
    assert (RunDone, gid, 0) in [(type(ev), getattr(ev, "gid", None), getattr(ev, "t", None))
                                 for ev in net.events]
    (op, _), = net.cores["w1"].graphs[gid].ops.values()
    assert op.seen == [(0, "the-arg", "the-arg")]


# ---- small outputs ride on the progress report to the coordinator -----------------------------


class OutputSize(Operator):
    def on_complete(self, ctx, t):
        ctx.output(b"x" * ctx.arg)


def test_small_outputs_ride_on_the_final_progress_report_and_large_ones_do_not():
    g = Graph("outputs")
    g.node("out", OutputSize, 2, placement=[0, 1])
    net = SimNet(2)
    net.join()
    gid = net.install(g)
    for size, kinds in ((10, {Kind.REPORT: 2}), (1 << 20, {Kind.OUTPUT: 2, Kind.PROGRESS: 2})):
        before = Counter(net.sent)
        net.start(gid, size)
        net.run()
        sent = net.sent - before
        assert {k: sent[k] for k in (Kind.REPORT, Kind.OUTPUT, Kind.PROGRESS) if sent[k]} == kinds
        done = [ev for ev in net.events if isinstance(ev, RunDone)][-1]
        assert done.result.values("out") == [b"x" * size] * 2
