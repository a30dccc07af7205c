"""Each role its own virtual CPU (``pathways.sim.roles``): handlers start at max(arrival, the
role's CPU free), take their cost on that role's clock only, and what they send leaves at their
end. Virtual times are asserted exactly (dyadic costs and latencies keep sums exact); real time
never (the measured test asserts only a lower bound on virtual time)."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.sim import (
    RandomFaults,
    RoleLoop,
    SimNet,
    SimTransport,
    VirtualTimeLoop,
    simulated_plaque_cluster,
)
from plaque import Operator
from plaque.testing.operators import chain
from plaque.wire import DATA

pytestmark = pytest.mark.timeout(60)


class Tracked(SimTransport):
    """Remembers when each message (its first frame is a unique id) arrived at it."""

    arrivals: dict

    def _arrive(self, arrival, order, src, channel, frames):
        self.arrivals[frames[0]] = arrival
        super()._arrive(arrival, order, src, channel, frames)


@pytest.fixture
def loop():
    loop = VirtualTimeLoop(stall_timeout=0)
    yield loop
    loop.close()


def drain(loop, seconds=1000.0):
    loop.run_until_complete(_sleep(seconds))


async def _sleep(seconds):
    import asyncio

    await asyncio.sleep(seconds)


def endpoint(net, role, on_message):
    """A ``Tracked`` endpoint started on ``role`` (a RoleLoop, or the net's loop)."""
    t = Tracked(net)
    t.arrivals = {}
    t.start(role, lambda ch, frames: on_message(t, frames))
    return t


def sender(net, *receivers):
    """A plain endpoint (no CPU) connected to each receiver as peer 0, 1, ..."""
    s = SimTransport(net)
    s.start(net.loop, lambda ch, frames: None)
    for i, r in enumerate(receivers):
        s.connect(i, r.address)
    return s


# ---- parallel CPUs ------------------------------------------------------------------------

@pytest.mark.parametrize("shared", [False, True])
def test_independent_roles_work_in_parallel_on_their_own_cores(loop, shared):
    """N receivers, m messages each at t=0, fixed cost c per handler, ideal links: each role
    is done at m*c, in parallel; the same receivers on ONE role need N*m*c."""
    n, m, c = 4, 5, 2.0 ** -6
    net = SimNet(loop)
    one = RoleLoop(loop, "all", "fixed", c, record=True)
    roles = [one if shared else RoleLoop(loop, f"r{i}", "fixed", c, record=True)
             for i in range(n)]
    receivers = [endpoint(net, role, lambda t, f: None) for role in roles]
    s = sender(net, *receivers)
    for k in range(m):
        for i in range(n):
            s.send(i, DATA, [f"{i}.{k}".encode()])
    drain(loop)
    ends = [max(span.end for span in role.spans) for role in set(roles)]
    if shared:
        assert ends == [n * m * c] and one.handled == n * m
    else:
        assert ends == [m * c] * n
        assert [role.handled for role in roles] == [m] * n
        assert all(role.cpu_used == m * c for role in roles)


def test_a_busy_role_delays_only_its_own_later_messages(loop):
    net = SimNet(loop)
    busy = RoleLoop(loop, "busy", "fixed", 1.0, record=True)
    idle = RoleLoop(loop, "idle", "fixed", 0.0, record=True)
    a, b = endpoint(net, busy, lambda t, f: None), endpoint(net, idle, lambda t, f: None)
    s = sender(net, a, b)
    for when in (0.0, 0.25, 0.5):
        for peer in (0, 1):
            loop.call_at(when, s.send, peer, DATA, [f"{peer}@{when}".encode()])
    drain(loop)
    assert [(sp.ready, sp.start, sp.end) for sp in busy.spans] == [
        (0.0, 0.0, 1.0), (0.25, 1.0, 2.0), (0.5, 2.0, 3.0)]
    assert [(sp.ready, sp.start) for sp in idle.spans] == [(0.0, 0.0), (0.25, 0.25),
                                                           (0.5, 0.5)]
    # the shared clock never jumped for the busy role's CPU: deliveries kept their own times
    assert sorted(a.arrivals.values()) == [0.0, 0.25, 0.5]


def test_sends_leave_at_the_handlers_end_along_a_chain(loop):
    """Hop i starts at (i + 1) * L + i * c: each handler takes c, then its send travels L.
    A timer set in a handler counts from its end too."""
    hops, latency, cost, delay = 5, 2.0 ** -4, 2.0 ** -3, 2.0 ** -5
    net = SimNet(loop, latency=latency)
    roles = [RoleLoop(loop, f"r{i}", "fixed", cost, record=True) for i in range(hops)]
    started, timers = [], []

    def forward(i, t, frames):
        started.append((i, loop.time()))
        if i + 1 < hops:
            t.send(0, DATA, frames)
        else:
            roles[i].call_later(delay, lambda: timers.append(loop.time()))

    nodes = [endpoint(net, role, lambda t, f, i=i: forward(i, t, f))
             for i, role in enumerate(roles)]
    for here, there in zip(nodes, nodes[1:]):
        here.connect(0, there.address)
    sender(net, nodes[0]).send(0, DATA, [b"go"])
    drain(loop)
    assert started == [(i, (i + 1) * latency + i * cost) for i in range(hops)]
    assert timers == [hops * (latency + cost) + delay]


# ---- causality and determinism ------------------------------------------------------------

COSTS = st.sampled_from([0.0, 2.0 ** -3, 2.0 ** -2, 1.0])


@settings(max_examples=25, deadline=None)
@given(costs=st.lists(COSTS, min_size=1, max_size=4),
       latency=st.sampled_from([0.0, 2.0 ** -4, 0.5]),
       posts=st.lists(st.tuples(st.integers(0, 16), st.integers(0, 3), st.integers(0, 3)),
                      min_size=1, max_size=20))
def test_no_handler_before_its_arrival_and_no_overlap_on_a_role(costs, latency, posts):
    """Random injections (time k/8, receiver, hops to forward): every handler starts at or
    after its message's arrival and after its role's previous handler ended, takes exactly
    its role's cost, and every message is handled."""
    loop = VirtualTimeLoop(stall_timeout=0)
    try:
        net = SimNet(loop, latency=latency)
        roles = [RoleLoop(loop, f"r{i}", "fixed", c, record=True) for i, c in enumerate(costs)]
        n = len(roles)
        late, handled = [], []

        def on_message(i, t, frames):
            ident, hops = frames[0], int(frames[1])
            handled.append(ident)
            late.append(loop.time() >= t.arrivals[ident])
            if hops:
                t.send((i + 1) % n, DATA, [ident + b"+", str(hops - 1).encode()])

        nodes = [endpoint(net, r, lambda t, f, i=i: on_message(i, t, f))
                 for i, r in enumerate(roles)]
        for node in nodes:
            for j, other in enumerate(nodes):
                node.connect(j, other.address)
        s = sender(net, *nodes)
        for k, (tick, dst, hops) in enumerate(posts):
            loop.call_at(tick / 8, s.send, dst % n, DATA, [b"m%d" % k, str(hops).encode()])
        drain(loop)
        assert all(late)
        assert len(handled) == sum(hops + 1 for _, _, hops in posts)
        for role in roles:
            for span in role.spans:
                assert span.start >= span.ready and span.end == span.start + role.cost
            for before, after in zip(role.spans, role.spans[1:]):
                assert after.start >= before.end
    finally:
        loop.close()


# ---- the Plaque cluster: each endpoint a role ---------------------------------------------


class Burn(Operator):
    """Burns ``BURN`` seconds of this thread's CPU for each value, then forwards it."""

    BURN = 0.02

    def on_input(self, ctx, t, port, value):
        begin = time.thread_time()
        while time.thread_time() - begin < self.BURN:
            pass
        ctx.emit(value)


def check_roles(cluster):
    for role in cluster.roles.values():
        for span in role.spans:
            assert span.start >= span.ready
        for before, after in zip(role.spans, role.spans[1:]):
            assert after.start >= before.end


def session(seed: int, cost: float):
    faults = RandomFaults(delay=0.5, max_delay=2e-3)
    with simulated_plaque_cluster(workers=3, seed=seed, latency=1e-3, faults=faults,
                                  cpu="fixed", cost=cost) as cluster:
        graph = cluster.install(chain(4, workers=3), timeout=10)
        for n in (3, 7):
            got = graph.run(n).result(timeout=10).values("collect")
            assert got == [[(0, i) for i in range(n)]]
        cluster.run_for(2.0)
        check_roles(cluster)
        spans = {name: list(role.spans) for name, role in cluster.roles.items()}
        return list(cluster.net.deliveries), spans, cluster.clock()


def test_the_cluster_has_a_role_per_endpoint_and_replays_exactly_with_fixed_costs():
    first, again = session(seed=3, cost=2.0 ** -10), session(seed=3, cost=2.0 ** -10)
    deliveries, spans, _ = first
    assert set(spans) == {"coordinator", "worker-0", "worker-1", "worker-2"}
    assert len(deliveries) > 50
    assert first == again  # deliveries, every handler's span, the final clock
    assert session(seed=3, cost=0.0)[0] != deliveries  # the costs do move the times


def test_a_busy_worker_does_not_delay_the_other_roles():
    with simulated_plaque_cluster(workers=2, latency=1e-3, cpu="fixed",
                                  costs={"worker-1": 2.0 ** -5}) as cluster:
        graph = cluster.install(chain(3), timeout=10)
        assert graph.run(20).result(timeout=10).values("collect") == [
            [(0, i) for i in range(20)]]
        cluster.run_for(3.0)
        check_roles(cluster)
        busy = cluster.roles["worker-1"]
        assert busy.cpu_used == busy.handled * 2.0 ** -5 > 0
        for name in ("coordinator", "worker-0"):  # cost 0: never waited for a CPU
            assert cluster.roles[name].handled > 0
            assert all(sp.start == sp.ready for sp in cluster.roles[name].spans)
        assert any(sp.start > sp.ready for sp in busy.spans)  # its own messages queued


def test_measured_cpu_is_charged_to_the_role_that_burned_it():
    with simulated_plaque_cluster(workers=2, latency=0.0, cpu="measured") as cluster:
        graph = cluster.install(chain(1, middle=Burn), timeout=10)  # Burn on worker 1
        t0 = cluster.clock()
        assert graph.run(2).result(timeout=10).values("collect") == [[(0, 0), (0, 1)]]
        assert cluster.clock() - t0 >= 2 * Burn.BURN
        burner = cluster.worker_role(1)
        assert burner.cpu_used >= 2 * Burn.BURN
        assert max(sp.end - sp.start for sp in burner.spans) >= Burn.BURN
        check_roles(cluster)


def test_measured_handler_advances_its_roles_clock_by_what_it_burned(loop):
    net = SimNet(loop)
    role = RoleLoop(loop, "r", "measured", record=True)

    def burn(t, frames):
        begin = time.thread_time()
        while time.thread_time() - begin < 0.02:
            pass

    receiver = endpoint(net, role, burn)
    s = sender(net, receiver)
    s.send(0, DATA, [b"a"])
    s.send(0, DATA, [b"b"])
    drain(loop)
    first, second = role.spans
    assert first.end - first.start >= 0.02
    assert second.start >= first.end >= 0.02 and role.busy_until >= 0.04


def test_bad_options_are_refused(loop):
    with pytest.raises(ValueError, match="cpu must be"):
        RoleLoop(loop, "r", "wall")
    with pytest.raises(ValueError, match=">= 0"):
        RoleLoop(loop, "r", "fixed", -1.0)


def test_a_garbage_collection_is_not_charged_to_the_role_it_interrupts():
    """Every role shares the process's heap: a collection during one role's handler scans all
    of them, a pause that role would not have on a machine of its own."""
    import gc

    from pathways.sim.cputime import thread_cpu

    junk = [[object() for _ in range(50)] for _ in range(20_000)]  # a heap worth scanning
    t0, c0 = time.thread_time(), thread_cpu()
    gc.collect()
    spent, charged = time.thread_time() - t0, thread_cpu() - c0
    del junk
    assert spent > 0.005  # the collection took CPU...
    assert charged < spent / 10  # ...that is not charged
