"""Hosts joining and leaving a running Pathways cluster."""

import os
import signal
import time

import numpy as np
import pytest

import pathways as pw
from pathways import P


def psum_step(mesh):
    return pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, mesh, P(), P())


def test_a_lost_host_fails_its_runs_and_the_rest_goes_on():
    with pw.local_cluster(islands=1, hosts_per_island=3, devices_per_host=2,
                          heartbeat_timeout=2.0) as cluster:
        with pw.connect(cluster.address) as client:
            assert len(client.devices()) == 6
            everywhere = client.mesh((6,), ("d",))
            slow = pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, everywhere, P(), P(),
                                cost=0.2)
            y = slow(client.put(np.zeros(()), everywhere, P()))
            victim = cluster.processes[-1]  # the last host started
            os.kill(victim.pid, signal.SIGKILL)
            with pytest.raises(pw.PathwaysError, match="lost"):
                y.result(timeout=30)
            deadline = time.monotonic() + 30
            while len(client.devices()) != 4:
                assert time.monotonic() < deadline, "the lost host's devices are still listed"
                time.sleep(0.1)
            survivors = client.mesh((4,), ("d",))
            assert set(survivors.devices.flat) == set(client.devices())
            z = psum_step(survivors)(client.put(np.ones(()), survivors, P()))
            assert z.result(timeout=30) == 5.0
