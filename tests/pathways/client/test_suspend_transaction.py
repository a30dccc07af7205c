"""Suspend is a transaction that frees last, and preemption keeps its devices from its victims.

A coordinator frozen with SIGSTOP never confirms a suspension: the client must keep its arrays
on the devices, roll the suspension back, and leave a slice that works (item 1 of issue 27). A
slice suspended for a preempting client must not come back onto that client's devices while
it holds them (item 10).
"""

import concurrent.futures as cf
import os
import signal
import time
from contextlib import contextmanager

import numpy as np
import pytest

import pathways as pw
from pathways import P

pytest.importorskip("zarr")


@pytest.fixture(scope="module")
def procs():
    """A coordinator and 2 hosts of 1 device, as processes (the coordinator gets frozen)."""
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=1) as cluster:
        yield cluster


@contextmanager
def frozen(cluster):
    """The coordinator process stopped (SIGSTOP) for the block, continued whatever happens."""
    pid = cluster.processes[0].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def until(fn, timeout=30.0):
    """``fn()`` once it stops raising ``SliceSuspended`` (polled; fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except pw.SliceSuspended:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def on_slice(client, mesh):
    """A step, and two arrays only the hosts hold (computed there, never fetched)."""
    step = pw.shard_map(lambda v: v * 2.0, mesh, P("d"), P("d"))
    y = step(client.put(np.arange(4.0), mesh, P("d")))
    g = client.generate(lambda idx: np.full(2, float(idx[0].start)), (4,), np.float64, mesh,
                        P("d"))
    y.block_until_ready(timeout=30)
    g.block_until_ready(timeout=30)
    return step, y, g


def check_intact_and_usable(client, mesh, step, y, g, tmp_path):
    """The arrays kept their values, the slice runs, and suspend and resume work."""
    np.testing.assert_array_equal(y.result(timeout=30), [0.0, 2.0, 4.0, 6.0])
    np.testing.assert_array_equal(g.result(timeout=30), [0.0, 0.0, 2.0, 2.0])
    np.testing.assert_array_equal(step(y).result(timeout=30), [0.0, 4.0, 8.0, 12.0])
    resources = client.cluster_status()["resources"]
    assert mesh.slice_id in resources["slices"] and resources["suspended"] == {}
    assert os.listdir(tmp_path) == []  # the suspension's files went: the arrays are live
    client.suspend(mesh, timeout=30)
    mesh = client.resume(mesh, timeout=30)
    np.testing.assert_array_equal(step(g).result(timeout=30), [0.0, 0.0, 4.0, 4.0])


def test_a_suspend_the_coordinator_never_answers_keeps_the_arrays_and_the_slice(
        procs, tmp_path):
    with pw.connect(procs.address, coordinator_timeout=60, suspend_dir=str(tmp_path)) as c:
        mesh = c.mesh((2,), ("d",))
        step, y, g = on_slice(c, mesh)
        with frozen(procs):
            with pytest.raises(pw.PathwaysError, match="in doubt") as err:
                c.suspend(mesh, timeout=2)
            assert not isinstance(err.value, TimeoutError)
            assert os.listdir(tmp_path)  # the copy on disk stays while in doubt
            with pytest.raises(pw.SliceSuspended, match="in doubt"):
                step(y)
            with pytest.raises(pw.PathwaysError, match="still being suspended"):
                c.resume(mesh, timeout=0.2)  # it waits for the coordinator's answer
        # awake, it handles the Suspend, then the cancellation: the slice is back as it was
        until(lambda: step(y).block_until_ready(timeout=30))
        check_intact_and_usable(c, mesh, step, y, g, tmp_path)


def test_a_suspend_the_coordinator_confirms_too_late_is_undone(procs, tmp_path):
    with pw.connect(procs.address, coordinator_timeout=60, suspend_dir=str(tmp_path)) as c, \
            cf.ThreadPoolExecutor(1) as pool:
        mesh = c.mesh((2,), ("d",))
        step, y, g = on_slice(c, mesh)
        with frozen(procs):
            suspending = pool.submit(c.suspend, mesh, timeout=3)
            # once its Suspend has timed out the client asks to cancel it: then wake up
            wait_in_doubt(c, mesh)
        with pytest.raises(pw.PathwaysError, match="undone") as err:
            suspending.result(timeout=30)
        assert "live on its devices with its arrays" in str(err.value)
        check_intact_and_usable(c, mesh, step, y, g, tmp_path)


def wait_in_doubt(client, mesh, timeout=30.0):
    """Until a call on ``mesh`` says its suspension is in doubt (a put: it needs no
    coordinator, so it cannot hang if the slice is not marked yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.put(np.zeros(2), mesh, P("d"))
        except pw.SliceSuspended as exc:
            if "in doubt" in str(exc):
                return
        time.sleep(0.05)
    raise AssertionError(f"slice {mesh.slice_id} did not come into doubt in {timeout:g} s")


@pytest.fixture(scope="module")
def twin():
    """2 hosts x 2 devices in threads: a 4-device slice covers the whole island."""
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                          processes=False) as cluster:
        yield cluster


def test_a_suspend_that_fails_before_the_coordinator_is_asked_changes_nothing(twin, tmp_path):
    with pw.connect(twin.address, suspend_dir=str(tmp_path / "absent")) as c:
        mesh = c.mesh((4,), ("d",))
        step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        y = step(c.put(np.arange(4.0), mesh, P("d")))
        with pytest.raises(pw.PathwaysError, match="nothing changed: the slice is live"):
            c.suspend(mesh)  # its directory cannot be made
        np.testing.assert_array_equal(step(y).result(timeout=30), np.arange(4.0) + 2.0)
        assert mesh.slice_id in c.cluster_status()["resources"]["slices"]


def test_a_preempted_client_cannot_resume_onto_the_devices_the_preemptor_holds(twin):
    with pw.connect(twin.address, priority=0) as low, \
            cf.ThreadPoolExecutor(1) as pool:
        mesh = low.mesh((4,), ("d",))
        step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        x = step(low.put(np.arange(8.0), mesh, P("d")))
        with pw.connect(twin.address, priority=9) as high:
            room = high.mesh((4,), ("d",), preempt=True)
            with pytest.raises(pw.ResourceError, match=f"preempted by client {high.id}"):
                low.resume(mesh, timeout=0.5)
            resources = high.cluster_status()["resources"]
            assert list(resources["slices"]) == [room.slice_id]  # the devices stay its own
            assert list(resources["suspended"]) == [mesh.slice_id]
            f = pw.shard_map(lambda v: pw.psum(v, "d"), room, P(), P())
            assert f(high.put(np.ones(()), room, P())).result(timeout=30) == 4.0
            resuming = pool.submit(low.resume, mesh, timeout=60)  # waits for the devices
        # the preempting client left: the waiting resume gets the devices
        new = resuming.result(timeout=60)
        assert sorted(new.ids) == sorted(mesh.ids)
        np.testing.assert_array_equal(step(x).result(timeout=30), np.arange(8.0) + 2.0)
