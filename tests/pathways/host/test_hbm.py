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


# -- arrays made on the hosts (generate, load): a bounded wait for room --------------------

KIB = 1024


def _hbm_used(client, mesh):
    (status,) = client.host_status(timeout=30).values()
    return status["devices"][mesh.ids[0]]["hbm_used"]


def _wait_for_hbm_used(client, mesh, want, timeout=30.0):
    """The host frees a deleted array's memory asynchronously: wait (bounded) for it."""
    deadline = time.monotonic() + timeout
    while _hbm_used(client, mesh) != want:
        assert time.monotonic() < deadline, f"HBM use never became {want}"
        time.sleep(0.02)


def _fill(client, mesh, kib):
    """An array of ``kib`` KiB on the device, stored."""
    a = client.put(np.ones(kib * KIB // 8), mesh, P())
    a.result(timeout=30)
    return a


def test_a_generate_that_fits_once_an_array_is_deleted_waits_for_it(small_cluster):
    with pw.connect(small_cluster.address) as c:
        mesh = c.mesh((1,), ("d",))
        a = _fill(c, mesh, 800)
        y = c.generate(lambda idx: np.full(400 * KIB // 8, 5.0), (400 * KIB // 8,), np.float64,
                       mesh, P())  # does not fit beside a: waits for room
        assert _hbm_used(c, mesh) == 800 * KIB  # the host still serves requests meanwhile
        a.delete()
        np.testing.assert_array_equal(y.result(timeout=30), 5.0)
        assert _hbm_used(c, mesh) == 400 * KIB
        y.delete()
        _wait_for_hbm_used(c, mesh, 0)


def test_a_generate_that_never_gets_room_fails_after_its_timeout(small_cluster):
    """A client that waits for the array before deleting what holds the room would wait for
    ever: the array fails instead, saying what it needs and what frees room."""
    with pw.connect(small_cluster.address) as c:
        mesh = c.mesh((1,), ("d",))
        a = _fill(c, mesh, 800)
        y = c.generate(lambda idx: np.ones(400 * KIB // 8), (400 * KIB // 8,), np.float64,
                       mesh, P(), timeout=0.3)
        with pytest.raises(pw.DeviceOutOfMemory) as info:
            y.result(timeout=30)
        message = str(info.value)
        assert f"{400 * KIB} bytes" in message  # needed
        assert f"only {224 * KIB} of its {1024 * KIB} bytes are free" in message
        assert f"{800 * KIB} held" in message
        assert "deleting arrays" in message and "array.delete()" in message
        assert _hbm_used(c, mesh) == 800 * KIB  # nothing of the failed array is held
        a.delete()
        _wait_for_hbm_used(c, mesh, 0)
        z = c.generate(lambda idx: np.ones(400 * KIB // 8), (400 * KIB // 8,), np.float64,
                       mesh, P(), timeout=0.3)  # the same call now fits
        np.testing.assert_array_equal(z.result(timeout=30), 1.0)
        z.delete()
        _wait_for_hbm_used(c, mesh, 0)


def test_a_generate_timeout_must_be_a_positive_number(small_cluster):
    with pw.connect(small_cluster.address) as c:
        mesh = c.mesh((1,), ("d",))
        for bad in (0, -1.0, "5", True):
            with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
                c.generate(lambda idx: np.ones(4), (4,), np.float64, mesh, P(), timeout=bad)


def test_a_load_that_can_never_fit_fails_at_once_and_one_without_room_after_its_timeout(
        small_cluster, pw_cluster, tmp_path):
    with pw.connect(pw_cluster.address) as big:  # 16 GiB devices
        mesh = big.mesh((1,), ("d",))
        big.save(tmp_path / "huge", {"w": big.put(np.ones(2 * MIB // 8), mesh, P())}
                 ).result(timeout=30)
        big.save(tmp_path / "half", {"w": big.put(np.full(400 * KIB // 8, 2.0), mesh, P())}
                 ).result(timeout=30)
    with pw.connect(small_cluster.address) as c:  # 1 MiB devices
        mesh = c.mesh((1,), ("d",))
        with pytest.raises(pw.DeviceOutOfMemory, match="larger than the whole HBM"):
            c.load(tmp_path / "huge", mesh)
        a = _fill(c, mesh, 800)
        late = c.load(tmp_path / "half", mesh, timeout=0.3)["w"]
        with pytest.raises(pw.DeviceOutOfMemory, match="deleting arrays"):
            late.result(timeout=30)
        waiting = c.load(tmp_path / "half", mesh)["w"]  # the default timeout: ample
        a.delete()
        np.testing.assert_array_equal(waiting.result(timeout=30), 2.0)
        waiting.delete()
        _wait_for_hbm_used(c, mesh, 0)


# -- over-commit: every wait for memory ends, and never holds another client's gangs -------

@pytest.fixture(scope="module")
def tight_cluster():
    """2 devices of 1 MiB; a kernel holds its device at most 2 s waiting for HBM."""
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=2,
                          hbm_gib=1 / 1024, processes=False, kernel_limit=2.0) as c:
        yield c


def test_over_committed_devices_fail_the_waits_and_serve_other_clients(tight_cluster):
    """The probe of issue 45: an array fills most of each device; a second put of the same
    size waits for room on the hosts, and a call on the first array needs room for its
    output that only deleting the first (which the call holds) would make. Each wait ends
    with ``DeviceOutOfMemory`` naming device and bytes, another client's psum on the same
    devices runs meanwhile, and deleting the arrays frees every byte."""
    import jax

    with pw.connect(tight_cluster.address, timeout=3) as c, \
            pw.connect(tight_cluster.address) as other:
        mesh = c.mesh((2,), ("d",))
        a = c.put(np.ones(2 * 700 * KIB // 8), mesh, P("d"))  # 700 KiB on each device
        _wait_for_used(c, mesh, 700 * KIB)
        b = c.put(np.ones(2 * 700 * KIB // 8), mesh, P("d"))  # waits on the hosts for room
        y = pw.shard_map(lambda v: v * 2.0, mesh, P("d"), P("d"))(a)  # output: no room
        with pytest.raises(pw.RemoteError, match="DeviceOutOfMemory") as info:
            y.result(timeout=60)
        assert f"waited 2 s for {700 * KIB} bytes" in str(info.value)
        assert f"({700 * KIB} held" in str(info.value)
        omesh = other.mesh((2,), ("d",))
        z = other.put(np.arange(4.0), omesh, P("d"))
        total = pw.shard_map(lambda v: jax.lax.psum(v, "d"), omesh, P("d"), P("d"))(z)
        np.testing.assert_array_equal(total.result(timeout=60), [2.0, 4.0, 2.0, 4.0])
        with pytest.raises(pw.RemoteError,  # b's put waited its client's 3 s on the hosts
                           match=f"DeviceOutOfMemory: tpu.*waited 3 s for {700 * KIB} bytes"):
            pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))(b).result(timeout=60)
        a.delete()
        b.delete()
        z.delete()
        total.delete()
        _wait_for_used(c, mesh, 0)


def test_deleting_a_put_that_waits_for_room_ends_its_wait(tight_cluster):
    with pw.connect(tight_cluster.address, timeout=60) as c:
        mesh = c.mesh((2,), ("d",))
        a = c.put(np.ones(2 * 500 * KIB // 8), mesh, P("d"))
        _wait_for_used(c, mesh, 500 * KIB)
        b = c.put(np.ones(2 * 600 * KIB // 8), mesh, P("d"))  # waits for room (60 s)
        _wait_for(lambda: _waiting_for_room(c) == 2)
        b.delete()  # its waits end now, and drop its value: it never takes the room
        _wait_for(lambda: _waiting_for_room(c) == 0)
        later = c.put(np.full(2 * 200 * KIB // 8, 3.0), mesh, P("d"))  # fits beside a
        plus = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        np.testing.assert_array_equal(plus(later).result(timeout=30), 4.0)
        a.delete()
        later.delete()
        _wait_for_used(c, mesh, 0)


def _waiting_for_room(client) -> int:
    return sum(s["waiting_for_room"] for s in client.host_status(timeout=30).values())


def _wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never came true"
        time.sleep(0.02)


def _wait_for_used(client, mesh, want, timeout=30.0):
    """Every device of ``mesh`` holds ``want`` bytes (hosts free and store asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        used = {d: s["hbm_used"] for status in client.host_status(timeout=30).values()
                for d, s in status["devices"].items() if d in mesh.ids}
        if set(used.values()) == {want}:
            return
        assert time.monotonic() < deadline, f"HBM use {used}, never {want}"
        time.sleep(0.02)
