"""Supervision of a cluster's processes: nothing outlives what it serves.

A host whose coordinator died drops its queued kernels and exits within its coordinator
timeout (plus the kernel running then), even while its loop is busy with long kernel bodies.
Bounds here are generous guards against a hang, far from what the old behaviour took.
"""

import functools
import signal
import time

import numpy as np
from conftest import coordinator_only, wait_until

import pathways as pw
from pathways import P

# The host is started by hand with --coordinator-timeout HOST_TIMEOUT (its default, which local
# clusters use, is 10 s; with 5 s kernels this test took 12 s). Each kernel body is half the
# timeout, as before: long enough that the loop is busy between the coordinator's beats, short
# enough that a host counting each late tick as its own stall never reaches the timeout.
KERNEL = 1.0  # real seconds each queued kernel's body takes
QUEUED = 30  # kernels queued on the one device: half a minute of work
HOST_TIMEOUT = 2.0


def slow_body(log: str, x):
    """Notes its start in ``log`` (real data only: shapes are found on zeros), then sleeps."""
    if x.size and x.flat[0] != 0:
        with open(log, "a") as f:
            f.write("start\n")
        time.sleep(KERNEL)
    return x + 1.0


def starts(log) -> int:
    return log.read_text().count("start")


def test_a_host_that_lost_its_coordinator_drops_its_queued_kernels_and_exits(tmp_path, procs):
    log = tmp_path / "starts"
    log.touch()
    cluster, host = coordinator_only(1, HOST_TIMEOUT, procs)
    try:
        client = pw.connect(cluster.address, coordinator_timeout=2.0)
        try:
            mesh = client.mesh((1,), ("d",))
            step = pw.shard_map(functools.partial(slow_body, str(log)), mesh, P("d"), P("d"))
            x = client.put(np.ones(1), mesh, P("d"))
            ys = [step(x) for _ in range(QUEUED)]
            wait_until(lambda: starts(log) >= 1, 60)  # the first kernel runs, the rest wait
            before = starts(log)
            cluster.processes[0].send_signal(signal.SIGKILL)
            # the timeout, the kernel then running, and as much again for a loaded machine;
            # running the queue first took QUEUED * KERNEL + HOST_TIMEOUT (32 s)
            assert host.wait(HOST_TIMEOUT + 6 * KERNEL) == 0
            after = starts(log) - before
            # about two start before the host can tell (HOST_TIMEOUT / KERNEL), never the rest
            assert after <= QUEUED // 2, f"{after} of {QUEUED - before} queued kernels ran"
            del ys
        finally:
            client.close()
    finally:
        cluster.close()
