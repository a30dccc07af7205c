"""Supervision of a cluster's processes: nothing outlives what it serves.

A host whose coordinator died drops its queued kernels and exits within its coordinator
timeout (plus the kernel running then), even while its loop is busy with long kernel bodies.
Bounds here are generous guards against a hang, far from what the old behaviour took.
"""

import functools
import signal
import time

import numpy as np
from conftest import wait_until

import pathways as pw
from pathways import P

KERNEL = 5.0  # real seconds each queued kernel's body takes
QUEUED = 12  # kernels queued on the one device: a minute of work
HOST_TIMEOUT = 10.0  # pathways host --coordinator-timeout's default, which local clusters use


def slow_body(log: str, x):
    """Notes its start in ``log`` (real data only: shapes are found on zeros), then sleeps."""
    if x.size and x.flat[0] != 0:
        with open(log, "a") as f:
            f.write("start\n")
        time.sleep(KERNEL)
    return x + 1.0


def starts(log) -> int:
    return log.read_text().count("start")


def test_a_host_that_lost_its_coordinator_drops_its_queued_kernels_and_exits(tmp_path):
    log = tmp_path / "starts"
    log.touch()
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=1) as cluster:
        client = pw.connect(cluster.address, coordinator_timeout=2.0)
        try:
            mesh = client.mesh((1,), ("d",))
            step = pw.shard_map(functools.partial(slow_body, str(log)), mesh, P("d"), P("d"))
            x = client.put(np.ones(1), mesh, P("d"))
            ys = [step(x) for _ in range(QUEUED)]
            wait_until(lambda: starts(log) >= 1, 60)  # the first kernel runs, the rest wait
            before = starts(log)
            cluster.processes[0].send_signal(signal.SIGKILL)
            host = cluster.processes[1]
            # the timeout, the kernel then running, and as much again for a loaded machine;
            # running the queue first took QUEUED * KERNEL + HOST_TIMEOUT (70 s)
            assert host.wait(HOST_TIMEOUT + 6 * KERNEL) == 0
            after = starts(log) - before
            # about two start before the host can tell (HOST_TIMEOUT / KERNEL), never the rest
            assert after <= QUEUED // 2, f"{after} of {QUEUED - before} queued kernels ran"
            del ys
        finally:
            client.close()
