"""Back-pressure: a client calling in a loop without waiting keeps at most ``max_in_flight``
runs given and not ended (as JAX's dispatch does), so the coordinator's queue stays bounded and
its answers to the client's pings never wait behind an unbounded backlog."""

import numpy as np
import pytest

import pathways as pw
from pathways import P


@pytest.fixture(scope="module")
def twin():
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=2,
                          processes=False) as cluster:
        yield cluster


def test_calls_past_max_in_flight_wait_for_the_oldest_to_end(twin):
    with pw.connect(twin.address, max_in_flight=3) as client:
        mesh = client.mesh((2,), ("d",))
        # 0.5 s of modelled time per call: the first three are in flight within moments,
        # however loaded the machine, so the bound is reached before any run ends
        slow = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"), cost=0.5)
        x = client.put(np.zeros(2), mesh, P("d"))
        most = 0
        for _ in range(6):
            x = slow(x)
            most = max(most, len(client.runs))
        assert most == 3  # reached, never passed
        np.testing.assert_array_equal(x.result(timeout=60), np.full(2, 6.0))


def test_a_full_window_waits_until_a_quarter_has_ended_so_calls_leave_in_bursts(twin):
    with pw.connect(twin.address, max_in_flight=8) as client:
        mesh = client.mesh((2,), ("d",))
        slow = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"), cost=0.2)
        x = client.put(np.zeros(2), mesh, P("d"))
        after = []
        for _ in range(12):
            x = slow(x)
            after.append(len(client.runs))
        assert max(after) == 8  # the window fills...
        i = after.index(8)
        # ...and the next call waits until 6 (room_after(8)) are left, not just one fewer
        assert after[i + 1] <= 7
        np.testing.assert_array_equal(x.result(timeout=60), np.full(2, 12.0))


def test_max_in_flight_is_checked_at_connect(twin):
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="max_in_flight must be an int >= 1"):
            pw.connect(twin.address, max_in_flight=bad)


def test_a_simulated_client_waits_by_driving_its_cluster():
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=2,
                          simulate=True) as cluster, \
            pw.connect(cluster.address, max_in_flight=2) as client:
        mesh = client.mesh((2,), ("d",))
        slow = pw.shard_map(lambda v: v * 2.0, mesh, P("d"), P("d"), cost=0.05)
        x = client.put(np.ones(2), mesh, P("d"))
        for _ in range(10):
            x = slow(x)
            assert len(client.runs) <= 2
        np.testing.assert_array_equal(x.result(), np.full(2, 1024.0))
