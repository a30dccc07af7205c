"""Kernel time limits in a simulation count the CPU seconds a body uses, not real time
(issue 45, item 11): a machine's load stretches real time, and must not change a simulation's
outcome. Real time is stretched here by sleeping, which uses no CPU."""

import time

import numpy as np
import pytest

import pathways as pw
from pathways import P


def spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def simulated(limit: float):
    return pw.local_cluster(hosts_per_island=2, devices_per_host=1, simulate=True,
                            cpu="fixed", cost=1e-5, kernel_limit=limit)


def test_a_body_under_its_cpu_limit_passes_however_long_it_takes_in_real_time():
    def slow(x):
        if x.sum() > 0:  # only on real data: the client's shape pass sees zeros
            time.sleep(0.6)  # past the limit in real time, as a loaded machine would be
            spin(0.05)  # ... with the watchdog ticking while the body uses CPU
        return x + 1

    with simulated(0.5) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((2,), ("i",))
        f = pw.shard_map(slow, mesh, P("i"), P("i"))
        np.testing.assert_array_equal(f(client.put(np.ones(2), mesh, P("i"))).result(),
                                      [2.0, 2.0])


def test_a_body_over_its_cpu_limit_fails():
    def busy(x):
        if x.sum() > 0:
            spin(0.8)
        return x

    with simulated(0.5) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((2,), ("i",))
        f = pw.shard_map(busy, mesh, P("i"), P("i"))
        with pytest.raises(pw.PathwaysError, match="KernelTimeout.*limit of 0.5 s"):
            f(client.put(np.ones(2), mesh, P("i"))).result()


def test_a_parked_body_is_not_charged_the_cpu_its_peers_use_meanwhile():
    """Shard 0 waits in the psum while shard 1 spins 0.75 s, then spins 0.4 s itself: 1.15 s
    of the thread's CPU pass during its body, but only 0.4 s are its own."""
    def body(x):
        if x.sum() > 0 and x[0] == 2.0:
            spin(0.75)
        total = pw.psum(x, "i")
        if x.sum() > 0 and x[0] == 1.0:
            spin(0.4)
        return total

    with simulated(1.0) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((2,), ("i",))
        f = pw.shard_map(body, mesh, P("i"), P())
        np.testing.assert_array_equal(
            f(client.put(np.array([1.0, 2.0]), mesh, P("i"))).result(), [3.0])
