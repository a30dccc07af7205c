"""HBM on a real host: a full device makes new buffers wait for room (back-pressure) instead of
failing; a buffer larger than the whole HBM fails at once with a clear error."""

import time

import numpy as np
import pytest

import pathways as pw
from pathways import P

MIB = 1 << 20


@pytest.fixture(scope="module")
def small_cluster():
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=1,
                          hbm_gib=1 / 1024, processes=False) as c:  # 1 MiB per device
        yield c


def test_a_shard_larger_than_the_whole_hbm_fails_at_once(small_cluster):
    with pw.connect(small_cluster.address) as c:
        mesh = c.mesh((1,), ("d",))
        with pytest.raises(pw.DeviceOutOfMemory, match="larger than the whole HBM"):
            c.put(np.zeros(MIB // 8 + 1), mesh, P())
        with pytest.raises(pw.DeviceOutOfMemory, match="larger than the whole HBM"):
            c.generate(lambda idx: np.zeros(MIB), (MIB,), np.float32, mesh, P())
        x = c.put(np.ones(1024), mesh, P())
        grow = pw.shard_map(lambda v: np.zeros(MIB // 4 + 1, np.float32) + v[0], mesh, P(), P())
        with pytest.raises(pw.RemoteError, match="HBM"):  # a kernel output too large
            grow(x).result(timeout=30)


def test_a_full_device_makes_new_buffers_wait_until_memory_frees(small_cluster):
    with pw.connect(small_cluster.address) as c:
        mesh = c.mesh((1,), ("d",))
        a = c.put(np.ones(600 * 1024 // 8), mesh, P())  # 600 KiB
        b = c.put(np.ones(300 * 1024 // 8), mesh, P())  # 300 KiB: 900 of 1024 KiB used
        a.result(timeout=30)
        b.result(timeout=30)
        double = pw.shard_map(lambda v: v * 2.0, mesh, P(), P())
        y = double(b)  # its 300 KiB output does not fit until a is gone
        time.sleep(1.0)
        assert not y.done()  # waiting for room, not failed
        a.delete()
        np.testing.assert_array_equal(y.result(timeout=30), np.full(300 * 1024 // 8, 2.0))


def test_a_client_shard_that_does_not_fit_waits_without_stalling_the_host(small_cluster):
    """The host runs its data service and its devices on one thread: a put into a full
    device must wait for room without blocking it, or the delete that makes room (and
    every other request) would never be served."""
    with pw.connect(small_cluster.address) as c:
        mesh = c.mesh((1,), ("d",))
        a = c.put(np.ones(600 * 1024 // 8), mesh, P())
        b = c.put(np.ones(300 * 1024 // 8), mesh, P())  # 900 of 1024 KiB used
        a.result(timeout=30)
        b.result(timeout=30)
        later = c.put(np.full(300 * 1024 // 8, 3.0), mesh, P())  # does not fit yet
        (status,) = c.host_status(timeout=30).values()  # the host still serves requests
        assert status["devices"][mesh.ids[0]]["hbm_used"] == 900 * 1024
        a.delete()
        plus = pw.shard_map(lambda v: v + 1.0, mesh, P(), P())
        np.testing.assert_array_equal(plus(later).result(timeout=30), 4.0)  # stored at last
