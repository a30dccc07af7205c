"""The object store's life cycle across clients: every buffer is freed after a normal end, a
client that closes or is killed mid-stream, and a program that fails; other clients carry on."""

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import read_until, wait_until

import pathways as pw
from pathways import P

CLIENT_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def cluster():
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                          client_timeout=CLIENT_TIMEOUT) as c:
        yield c


def stored(client):
    """(bytes held on all devices, live entries) over every host."""
    nbytes = entries = 0
    for st in client.host_status().values():
        nbytes += sum(st["store"]["bytes"].values())
        e = st["store"]["entries"]
        entries += e["ready"] + e["pending"] + e["failed"] + e["deleting"]
    return nbytes, entries


def assert_store_empties(cluster, timeout=10.0):
    with pw.connect(cluster.address) as probe:
        try:
            wait_until(lambda: stored(probe) == (0, 0), timeout, interval=0.05)
        except AssertionError:
            raise AssertionError(f"stores not empty: {probe.host_status()}") from None


def chain_program(mesh, n=6, cost=None, fail_at=None):
    def body(x):
        return x * 1.5 + 1.0

    def broken(x):
        if x.size and x.flat[0] != 0:  # real data; shapes are found on zeros
            raise RuntimeError("kernel exploded")
        return x

    step = pw.shard_map(body, mesh, P("d"), P("d"), cost=cost)
    bad = pw.shard_map(broken, mesh, P("d"), P("d"))

    @pw.program
    def chain(x):
        for i in range(n):
            x = bad(x) if i == fail_at else step(x)
        return x

    return chain


def test_normal_end_frees_everything(cluster):
    with pw.connect(cluster.address) as c:
        mesh = c.mesh((4,), ("d",))
        x = c.put(np.ones(64), mesh, P("d"))
        y = chain_program(mesh)(x)
        y.result(timeout=30)
        assert stored(c)[0] == 2 * 64 * 8  # x and y, nothing in between
    assert_store_empties(cluster)


def test_a_failing_program_frees_its_intermediates(cluster):
    with pw.connect(cluster.address) as c:
        mesh = c.mesh((4,), ("d",))
        x = c.put(np.ones(64), mesh, P("d"))
        y = chain_program(mesh, n=6, fail_at=3)(x)
        with pytest.raises(pw.RemoteError, match="kernel exploded"):
            y.result(timeout=30)
        wait_until(lambda: stored(c)[0] == 64 * 8, 10, interval=0.05)  # only x is left
        z = chain_program(mesh, n=2)(x)  # the devices still work
        np.testing.assert_allclose(z.result(timeout=30), (np.ones(64) * 1.5 + 1) * 1.5 + 1)
    assert_store_empties(cluster)


def test_closing_with_runs_in_flight_frees_their_outputs_too(cluster):
    c = pw.connect(cluster.address)
    try:
        mesh = c.mesh((4,), ("d",))
        x = c.put(np.ones(1024), mesh, P("d"))
        chain = chain_program(mesh, n=4, cost=0.01)
        outs = [chain(x) for _ in range(10)]  # ~0.4 s of device time queued
    finally:
        c.close()
    with pytest.raises(pw.ClientClosed):
        outs[-1].result(timeout=5)
    assert_store_empties(cluster)


KILLED_CLIENT = textwrap.dedent("""
    import sys, numpy as np, pathways as pw
    from pathways import P
    c = pw.connect(sys.argv[1])
    mesh = c.mesh((4,), ("d",))
    step = pw.shard_map(lambda x: x + 1.0, mesh, P("d"), P("d"), cost=0.01)
    x = c.put(np.ones(4096), mesh, P("d"))
    ys = [step(x) for _ in range(300)]   # 3 s of device time, most of it still queued
    print("submitted", flush=True)
    ys[-1].result(timeout=60)
""")


def test_a_killed_client_is_freed_and_others_see_no_error(cluster):
    with pw.connect(cluster.address) as other:
        mesh = other.mesh((4,), ("d",))
        x = other.put(np.zeros(16), mesh, P("d"))
        step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, cluster.address],
                                stdout=subprocess.PIPE, text=True)
        try:
            read_until(proc, "submitted")
            time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            proc.stdout.close()
        # other's work goes on while (and after) the dead client's stream is dropped
        for _ in range(5):
            x = step(x)
        np.testing.assert_array_equal(x.result(timeout=30), np.full(16, 5.0))
        # once the coordinator gives up on the dead client, only other's buffers remain
        wait_until(lambda: stored(other)[0] == 16 * 8, CLIENT_TIMEOUT + 10, interval=0.05)
        x = step(x)  # the island is not blocked by the dead client's queued gangs
        np.testing.assert_array_equal(x.result(timeout=30), np.full(16, 6.0))
    assert_store_empties(cluster)


def test_a_client_that_went_silent_gets_a_clear_error(cluster):
    c = pw.connect(cluster.address)
    try:
        mesh = c.mesh((4,), ("d",))
        x = c.put(np.ones(8), mesh, P("d"))
        step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        np.testing.assert_array_equal(step(x).result(timeout=30), np.full(8, 2.0))
        c.session.closed = True  # stops its pings, as a frozen process would; sockets stay open
        time.sleep(CLIENT_TIMEOUT + 1.5)
        c.session.closed = False
        with pytest.raises(pw.ClientGone, match="disconnected"):
            step(x).result(timeout=30)
    finally:
        c.close()
    assert_store_empties(cluster)
