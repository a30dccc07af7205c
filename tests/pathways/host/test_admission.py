"""HBM admission and use counts in the object store (``ObjectStore.admit``, ``HbmGrant``,
``release_use``), and the host's operator table and services (``pathways.host.operators``)."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from pathways.errors import DeviceOutOfMemory, PathwaysError
from pathways.host import Host, HostServices, host_operators, operator_table
from pathways.host.executor import standalone_device
from pathways.host.object_store import ObjectStore
from pathways.lowering.specs import KINDS, HostOp
from pathways.program.cost import DeviceSpec

WAIT = 5.0
HBM = 1024
OWNER = ("client-1", "program-1")


@pytest.fixture
def store():
    made = {d: standalone_device(d, DeviceSpec(hbm_bytes=HBM)) for d in range(2)}
    yield ObjectStore(made)
    for device in made.values():
        assert device.close(timeout=WAIT)


def test_admit_grants_at_once_what_fits_and_puts_spend_the_grant(store):
    got = []
    store.admit(0, 600, got.append)
    (grant,) = got
    assert grant.device_id == 0 and grant.nbytes == 600
    store.put(("a", 0), np.zeros(50, np.float64), OWNER, grant=grant)  # 400 bytes
    assert grant.nbytes == 200 and store.used_bytes(0) == 600  # charged, not taken again
    with pytest.raises(ValueError, match="only 200"):
        store.put(("b", 0), np.zeros(50, np.float64), OWNER, grant=grant)
    with pytest.raises(ValueError, match="granted on device 0"):
        store.put(("b", 1), np.zeros(1, np.float64), OWNER, grant=grant)
    grant.give_back()
    assert store.used_bytes(0) == 400
    store.delete(("a", 0))
    assert store.used_bytes(0) == 0


def test_admit_fails_at_once_what_never_fits(store):
    got = []
    store.admit(0, HBM + 1, got.append)
    assert isinstance(got[0], DeviceOutOfMemory) and store.used_bytes(0) == 0


def test_admit_waits_for_a_free_without_blocking_and_can_be_cancelled(store):
    store.put(("held", 0), np.zeros(100, np.float64), OWNER)  # 800 of 1024 bytes
    granted: queue.Queue = queue.Queue()
    store.admit(0, 800, granted.put)  # returns at once: it waits for a free
    cancelled = store.admit(0, 800, granted.put)
    cancelled.cancel()
    assert granted.empty()
    store.delete(("held", 0))  # a free: the first wait is retried on the device's executor
    grant = granted.get(timeout=WAIT)
    assert grant.nbytes == 800
    grant.give_back()  # a free again: the cancelled wait stays dropped
    store.put(("probe", 0), np.zeros(1, np.float64), OWNER)  # a turn after the retries
    store.delete(("probe", 0))
    assert granted.empty() and store.used_bytes(0) == 0


def test_a_kernels_wait_goes_before_other_waits_and_they_queue_behind_it(store):
    """A kernel whose outputs wait holds its device: the room a free makes goes to it first,
    and a put that would fit in the room it waits for waits behind it, until it is served
    or gives up."""
    store.put(("held", 0), np.zeros(100, np.float64), OWNER)  # 800 of 1024 bytes
    order: queue.Queue = queue.Queue()
    store.admit(0, 600, lambda g: order.put(("put", g)))  # waits, first
    kernel = store.admit(0, 600, lambda g: order.put(("kernel", g)), urgent=True)
    small = store.admit(0, 100, lambda g: order.put(("small", g)))  # fits, but behind it
    assert order.empty() and kernel is not small
    store.delete(("held", 0))  # 800 bytes free: the kernel's 600 first, then only 100 fit
    got = [order.get(timeout=WAIT) for _ in range(2)]
    assert [who for who, _ in got] == ["kernel", "small"]
    for _, grant in got:
        grant.give_back()
    assert order.get(timeout=WAIT)[0] == "put"  # its turn once the room is back


def test_a_wait_behind_a_kernel_that_gives_up_is_retried(store):
    store.put(("held", 0), np.zeros(100, np.float64), OWNER)  # 800 of 1024 bytes
    got: queue.Queue = queue.Queue()
    kernel = store.admit(0, 600, got.put, urgent=True)
    store.admit(0, 100, got.put)  # would fit: waits behind the kernel
    assert got.empty()
    kernel.cancel()  # the kernel's wait ended (its bound): the put goes on without a free
    grant = got.get(timeout=WAIT)
    assert grant.nbytes == 100
    grant.give_back()
    store.delete(("held", 0))


def test_the_last_of_a_values_users_deletes_it(store):
    store.put(("shared", 1), np.zeros(4), OWNER)
    store.put(("own", 1), np.zeros(2), OWNER)
    store.release_uses([(("shared", 1), 3), (("own", 1), 1)])  # a value only one user reads
    assert store.state(("own", 1)) is None
    store.release_uses([(("shared", 1), 3)])
    assert store.state(("shared", 1)) is not None
    store.release_uses([(("shared", 1), 3)])
    assert store.state(("shared", 1)) is None and store.used_bytes(1) == 0


def test_the_operator_table_covers_every_kind_and_binds_the_host():
    assert set(host_operators()) == set(KINDS)
    host = Host(0, 1)
    try:
        table = operator_table(host)
        assert set(table) == set(KINDS)
        assert all(table[k].keywords == {"host": host} for k in KINDS)
        for member in ("store", "clock", "enqueue", "kernel_env", "post_release",
                       "abort_gang", "put", "record_transfer"):
            assert hasattr(host, member), member  # Host is the HostServices of its operators
        assert {m for m in HostServices.__dict__ if not m.startswith("_")} <= {
            "store", "clock", "enqueue", "kernel_env", "post_release", "abort_gang", "put",
            "record_transfer"}
    finally:
        host.close()


def test_a_node_on_a_worker_without_host_operators_says_so():
    class Ctx:
        services: dict = {}

    node = HostOp("kernel", None)()
    with pytest.raises(PathwaysError, match="host operators run on hosts"):
        node.on_start(Ctx(), 0)
