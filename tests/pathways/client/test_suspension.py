"""Suspend and resume a client's slice (client.suspend / client.resume), by the client and by
the coordinator for a client of higher priority, with others running on the freed devices."""

import os
import time

import numpy as np
import pytest

import pathways as pw
from pathways import P

pytest.importorskip("zarr")


@pytest.fixture(scope="module", params=["twin", "simulated"])
def small(request):
    """2 hosts x 2 devices in threads, or simulated: one 4-device slice covers the whole
    island. (On the simulated cluster, a suspension the coordinator asks for runs on the
    client's role as a greenlet instead of a thread.)"""
    how = {"processes": False} if request.param == "twin" else {"simulate": True}
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                          **how) as cluster:
        yield cluster


def hbm_used(client):
    return {d: s["hbm_used"] for st in client.host_status().values()
            for d, s in st["devices"].items()}


def until_freed(client, timeout=30.0):
    """Every device's memory free, polled: another client's frees reach the hosts on its own
    sockets, after the coordinator confirmed its suspension (free last)."""
    deadline = time.monotonic() + timeout
    while set(hbm_used(client).values()) != {0}:
        assert time.monotonic() < deadline, hbm_used(client)
        time.sleep(0.05)


def test_suspend_frees_the_devices_for_another_client_and_resume_brings_every_array_back(
        small, tmp_path):
    with pw.connect(small.address, suspend_dir=str(tmp_path)) as a, \
            pw.connect(small.address) as b:
        mesh = a.mesh((4,), ("d",))
        step = pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, mesh, P("d"), P("d"), cost=0.2)
        x = a.put(np.arange(8.0), mesh, P("d"))
        y = step(x)  # still running when suspend is called: it finishes first
        g = a.generate(lambda idx: np.full(2, float(idx[0].start)), (8,), np.float64, mesh,
                       P("d"))
        dropped = a.put(np.ones(8), mesh, P("d"))
        dropped.delete()
        want_y = pw.reference(step)(np.arange(8.0))
        a.suspend(mesh)
        assert y.done() and os.listdir(tmp_path)  # y was made, then written with x and g
        assert set(hbm_used(a).values()) == {0}  # every device's memory is free
        with pytest.raises(pw.SliceSuspended, match="client.resume"):
            step(y)
        with pytest.raises(pw.SliceSuspended):
            a.put(np.zeros(8), mesh, P("d"))
        with pytest.raises(pw.SliceSuspended):
            g.result(timeout=10)
        with pytest.raises(pw.SliceSuspended):
            a.save(tmp_path / "mine", {"x": x})
        with pytest.raises(pw.PathwaysError, match="already suspended"):
            a.suspend(mesh)
        # another client gets the same devices and runs on them meanwhile
        other = b.mesh((4,), ("d",))
        assert sorted(other.ids) == sorted(mesh.ids)
        double = pw.shard_map(lambda v: v * 2.0, other, P("d"), P("d"))
        np.testing.assert_array_equal(double(b.put(np.ones(8), other, P("d"))).result(
            timeout=30), np.full(8, 2.0))
        new = a.resume(mesh)
        assert new.version == mesh.version + 1 and new.shape == mesh.shape
        np.testing.assert_array_equal(y.result(timeout=30), want_y)
        np.testing.assert_array_equal(g.result(timeout=30), np.repeat([0.0, 2.0, 4.0, 6.0], 2))
        # step and x were built on the old mesh: they work on the resumed one
        np.testing.assert_array_equal(step(x).result(timeout=30), want_y)
        assert step(y).mesh == new and os.listdir(tmp_path) == []  # read back, then removed
        with pytest.raises(pw.PathwaysError, match="not suspended"):
            a.resume(mesh)


def test_the_coordinator_suspends_a_lower_priority_slice_for_a_higher_priority_client(small):
    with pw.connect(small.address, priority=0) as low:
        mesh = low.mesh((4,), ("d",))
        step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        x = step(low.put(np.arange(8.0), mesh, P("d")))
        x.block_until_ready(timeout=30)
        with pw.connect(small.address, priority=5) as high:
            # nothing from the low client but its runtime: it suspends when asked
            room = high.mesh((4,), ("d",), preempt=True)
            assert sorted(room.ids) == sorted(mesh.ids)
            until_freed(high)
            f = pw.shard_map(lambda v: pw.psum(v, "d"), room, P(), P())
            assert f(high.put(np.ones(()), room, P())).result(timeout=30) == 4.0
            with pytest.raises(pw.SliceSuspended, match="by the coordinator: client"):
                step(x)
        low.resume(mesh)
        np.testing.assert_array_equal(step(x).result(timeout=30), np.arange(8.0) + 2.0)


def test_a_preempting_client_of_equal_priority_shares_instead(small):
    with pw.connect(small.address, priority=1) as a, pw.connect(small.address, priority=1) as b:
        mesh = a.mesh((4,), ("d",))
        x = a.put(np.arange(4.0), mesh, P("d"))
        b.mesh((4,), ("d",), preempt=True)  # no one of lower priority: an ordinary slice
        np.testing.assert_array_equal(pw.shard_map(lambda v: v, mesh, P("d"), P("d"))(x)
                                      .result(timeout=30), np.arange(4.0))


def test_a_call_refused_on_a_suspended_slice_leaves_nothing_a_later_suspension_waits_for(
        small, tmp_path):
    """A call on a suspended slice raises SliceSuspended; it used to leave output arrays whose
    run never started, pending for ever, so the next suspension of the slice waited for them
    (a preempted training loop stalled its preemptor 1 run in 8). The refused call's traceback
    is kept here, which keeps whatever it made alive."""
    with pw.connect(small.address, suspend_dir=str(tmp_path)) as c:
        mesh = c.mesh((4,), ("d",))
        step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        x = c.put(np.zeros(8), mesh, P("d"))
        c.suspend(mesh, timeout=30)
        with pytest.raises(pw.SliceSuspended) as refused:
            step(x)
        mesh = c.resume(mesh, timeout=30)
        c.suspend(mesh, timeout=5)  # nothing of the refused call to wait for
        mesh = c.resume(mesh, timeout=30)
        assert step(x).result(timeout=30).tolist() == [1.0] * 8
        assert refused.value is not None
