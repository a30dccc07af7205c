"""A real Plaque cluster (``CoordinatorCore`` + ``WorkerCore``s behind their ``Endpoint``s) on
one virtual-time loop: exact results, completion times that are the link model's, the same
event order from the same seed, hours of heartbeats in seconds, and liveness in virtual time.
Nothing here reads the wall clock; pytest-timeout guards against hangs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plaque
from pathways.sim import RandomFaults, SimulationError, simulated_plaque_cluster
from plaque.events import Membership
from plaque.heartbeat import HEARTBEAT_INTERVAL
from plaque.testing.operators import chain, expected_sparse, sparse_graph
from plaque.wire import CONTROL

pytestmark = pytest.mark.timeout(60)

TICK = 0.1  # plaque.endpoint's tick interval


def timed_run(cluster, graph, arg):
    """(result, virtual seconds from start to result) of one run of ``graph``."""
    installed = cluster.install(graph, timeout=10)
    t0 = cluster.clock()
    result = installed.run(arg).result(timeout=10)
    return result, cluster.clock() - t0


# ---- results and times --------------------------------------------------------------------

def test_keyed_exchange_gives_exact_results_and_runs_overlap():
    with simulated_plaque_cluster(workers=3, latency=1e-3, bandwidth=1e8) as cluster:
        graph = cluster.install(sparse_graph(), timeout=10)
        futures = [graph.run(n) for n in range(6)]
        for n, fut in enumerate(futures):
            res = fut.result(timeout=10)
            assert res.timestamp == n
            assert res.outputs["collect"] == expected_sparse(n)
        assert 0 < cluster.clock() < 1.0  # virtual seconds; nothing waited on a real timer


@settings(max_examples=12, deadline=None)
@given(crossings=st.integers(0, 6), exponent=st.integers(4, 12))
def test_chain_completes_at_the_link_model_time(crossings, exponent):
    """Without CPU charged, a run ends exactly (crossings + 2) latencies after it starts: the
    start message, one hop per crossing, the report to the coordinator. (Dyadic latencies keep
    the sums exact.)"""
    latency = 2.0 ** -exponent
    with simulated_plaque_cluster(workers=2, latency=latency) as cluster:
        result, took = timed_run(cluster, chain(crossings), 3)
        assert result.values("collect") == [[(0, 0), (0, 1), (0, 2)]]
        assert took == (crossings + 2) * latency


def test_charged_cpu_only_adds_to_the_link_time():
    latency, crossings = 1e-3, 5
    with simulated_plaque_cluster(workers=2, latency=latency, cpu="measured") as cluster:
        result, took = timed_run(cluster, chain(crossings), 50)
        assert result.values("collect") == [[(0, i) for i in range(50)]]
        assert took >= crossings * latency
        assert took > (crossings + 2) * latency  # the handlers' CPU time was charged


def test_bandwidth_is_charged_per_byte():
    """The same chain on links of 1 MB/s takes longer than on ideal ones, by at least the
    bytes of the crossing data messages over the bandwidth."""
    with simulated_plaque_cluster(workers=2, latency=1e-3, bandwidth=1e6) as cluster:
        _, took = timed_run(cluster, chain(3), 2000)
        crossing = [d for d in cluster.net.deliveries if d.channel != CONTROL]
        assert took >= 5e-3 + max(d.nbytes for d in crossing) / 1e6


# ---- determinism --------------------------------------------------------------------------

def trace(seed: int) -> list:
    """Every delivery of a session with random delays on the links, in order."""
    faults = RandomFaults(delay=0.5, max_delay=2e-3)
    with simulated_plaque_cluster(workers=3, seed=seed, latency=1e-3, faults=faults) as cluster:
        graph = cluster.install(sparse_graph(), timeout=10)
        for n in (3, 7):
            assert graph.run(n).result(timeout=10).outputs["collect"] == expected_sparse(n)
        cluster.run_for(2.0)
        return list(cluster.net.deliveries)


def test_same_seed_same_event_order():
    first, again = trace(seed=11), trace(seed=11)
    assert len(first) > 50
    assert first == again  # times, endpoints, channels, sizes and frame checksums
    assert trace(seed=12) != first  # the seed does decide the delays


# ---- time: heartbeats and liveness --------------------------------------------------------

@pytest.mark.timeout(30)
def test_hours_of_heartbeats_in_virtual_time():
    hours = 2
    with simulated_plaque_cluster(workers=2, latency=1e-3) as cluster:
        members = cluster.workers()
        start = cluster.clock()
        cluster.run_for(hours * 3600)
        assert cluster.clock() == pytest.approx(start + hours * 3600)
        assert cluster.workers() == members  # nobody lost: heartbeats kept flowing
        beats = sum(1 for d in cluster.net.deliveries if d.channel == CONTROL)
        # both ways, for each worker, at the first tick at least HEARTBEAT_INTERVAL after the
        # previous beat
        assert beats >= 2 * 2 * hours * 3600 / (HEARTBEAT_INTERVAL + TICK)
        res = cluster.install(sparse_graph(), timeout=10).run(5).result(timeout=10)
        assert res.outputs["collect"] == expected_sparse(5)


def test_a_killed_worker_is_lost_after_the_heartbeat_timeout_in_virtual_time():
    timeout, latency = 3.0, 1e-3
    with simulated_plaque_cluster(workers=2, latency=latency,
                                  heartbeat_timeout=timeout) as cluster:
        graph = cluster.install(chain(1), timeout=10)  # placed on both workers
        cluster.run_for(10.0)
        lost_at = []
        cluster.listeners.append(lambda ev: type(ev) is Membership and lost_at.append(
            (cluster.clock(), ev.workers)))
        killed_at = cluster.clock()
        cluster.kill_inproc_worker(1)
        cluster.run_for(1.0)
        # when the coordinator last heard the killed worker: its messages stopped coming
        to_coord = [d for d in cluster.net.deliveries if d.dst == cluster.address]
        alive = {d.src for d in to_coord if d.time > killed_at + latency}
        last_heard = max(d.time for d in to_coord if d.src not in alive)
        assert killed_at - HEARTBEAT_INTERVAL - TICK <= last_heard <= killed_at + latency
        cluster.run_for(last_heard + timeout - TICK - cluster.clock())
        assert lost_at == []  # silence shorter than the timeout is not a loss
        cluster.run_for(1.0)
        [(when, members)] = lost_at
        assert len(members) == 1
        # declared at the first tick with more than the timeout of silence since the last
        # message, counted from the tick that handled it
        assert timeout < when - last_heard <= timeout + 2 * TICK
        with pytest.raises(plaque.WorkerLost):
            graph.run(1).result(timeout=10)


def test_waits_time_out_in_virtual_time_and_not_from_inside():
    with simulated_plaque_cluster(workers=1, latency=1.0) as cluster:
        start = cluster.clock()
        with pytest.raises(plaque.PlaqueError, match="2 workers"):
            cluster.wait_for_workers(2, timeout=5.0)
        assert cluster.clock() - start == pytest.approx(5.0)
        graph = cluster.install(chain(0, workers=1), timeout=10)
        fut = graph.run(1)  # takes 2 virtual s: start message, then the report
        with pytest.raises(TimeoutError):
            fut.result(timeout=0.5)
        assert fut.result(timeout=10).values("collect") == [[(0, 0)]]
        errors = []

        def nested():
            try:
                graph.run(1).result(timeout=1)
            except SimulationError as exc:
                errors.append(exc)

        cluster.loop.call_soon(nested)
        cluster.run_for(0.5)
        assert len(errors) == 1
