"""Fault plans of a simulated cluster (issue 45): hosts are named by the ids ``pathways
status`` prints."""

import numpy as np
import pytest

import pathways as pw
from pathways import P


def lost_after(kill, faults=None) -> tuple[set, dict]:
    """The devices lost after ``kill(cluster)`` and the host of every device before."""
    with pw.local_cluster(hosts_per_island=3, devices_per_host=2, simulate=True, cpu=None,
                          heartbeat_timeout=1.0, faults=faults) as cluster:
        with pw.connect(cluster.address) as client:
            hosts = {d.id: d.host for d in client.devices()}
            kill(cluster)
            cluster.run_for(3.0)  # past the heartbeat timeout
            left = {d.id for d in client.devices()}
    return set(hosts) - left, hosts


def test_kill_host_kills_the_host_with_that_id():
    lost, hosts = lost_after(lambda cluster: cluster.kill_host(2))
    assert lost == {d for d, h in hosts.items() if h == 2}
    assert len(lost) == 2


def test_the_role_of_host_n_is_named_host_n():
    with pw.local_cluster(hosts_per_island=3, devices_per_host=1, simulate=True,
                          cpu=None) as cluster, pw.connect(cluster.address):
        assert [endpoint.core.id for _, _, endpoint in cluster.hosts] == [0, 1, 2]


def test_a_plan_kills_and_freezes_hosts_by_their_ids():
    lost, hosts = lost_after(lambda cluster: None, faults="kill:host-2@0.1")
    assert lost == {d for d, h in hosts.items() if h == 2}
    with pw.local_cluster(hosts_per_island=3, devices_per_host=1, simulate=True, cpu=None,
                          faults="freeze:host-1@0+0.5") as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((3,), ("d",))
            f = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
            np.testing.assert_array_equal(f(client.put(np.zeros(3), mesh, P("d"))).result(),
                                          np.ones(3))
            assert cluster.roles["host-1"].busy_until >= 0.5  # host 1's role: host-1


def test_a_host_id_that_is_not_live_is_named():
    with pytest.raises(ValueError, match=r"kill:host-5: no host 5: the live hosts are \[0, 1\]"):
        with pw.local_cluster(hosts_per_island=2, devices_per_host=1, simulate=True,
                              faults="kill:host-5@1"):
            pass


def test_a_lost_message_is_sent_again_as_over_tcp_and_arrives_late():
    """``drop:P`` loses messages as a TCP connection does: each is sent again after the
    retransmission timeout, so every step ends, late by fractions of a second, never by a
    collective's 60 s timeout."""
    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True, seed=3,
                          cpu="fixed", cost=2e-5, faults="drop:0.05") as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((4,), ("d",))
            step = pw.shard_map(lambda v: pw.psum(v, "d") * 0.25 + 1.0, mesh, P(), P())
            x = client.put(np.zeros(()), mesh, P())
            for i in range(30):
                before = cluster.clock()
                x = step(x)
                assert x.result() == i + 1.0
                assert cluster.clock() - before < 3.0  # a few retransmissions at most
            assert cluster.net.faults.resent > 0


def test_a_wait_that_times_out_names_what_it_waited_for():
    with pw.local_cluster(hosts_per_island=1, devices_per_host=2, simulate=True,
                          cpu=None) as cluster:
        with pw.connect(cluster.address, timeout=1.0) as client:
            mesh = client.mesh((2,), ("d",))
            cluster.freeze("coordinator", 2.0)
            with pytest.raises(TimeoutError, match="the coordinator's answer to Remap did not"
                                                   " come within 1 virtual s"):
                client.remap(mesh)
