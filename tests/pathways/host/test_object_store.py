"""The per-host object store: life cycle, tombstones, owners, callbacks, failures, accounting.

Every scenario ends by checking that the store's and the devices' HBM accounting is back to
zero. Devices and helper threads are closed by fixtures; every wait has a timeout.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import wait_until

from pathways.errors import DeviceOutOfMemory
from pathways.host.executor import standalone_device
from pathways.host.object_store import BufferState, ObjectStore
from pathways.program.cost import DeviceSpec
from pathways.protocol import TempId, TransferId

WAIT = 5.0
HBM = 1024
OWNER = ("client-1", "program-1")


@pytest.fixture
def devices():
    made = {d: standalone_device(d, DeviceSpec(hbm_bytes=HBM)) for d in range(2)}
    yield made
    for device in made.values():
        assert device.close(timeout=WAIT)


@pytest.fixture
def store(devices):
    store = ObjectStore(devices)
    yield store
    # Accounting must be back to zero after every scenario.
    assert store.stats() == {
        "entries": {"pending": 0, "ready": 0, "failed": 0, "deleting": 0, "awaited": 0},
        "bytes": {0: 0, 1: 0},
    }
    assert all(device.hbm.used == 0 for device in devices.values())


def array(nbytes, fill=1):
    return np.full(nbytes, fill, dtype=np.uint8)


def test_life_cycle(store, devices):
    key = (("client-1", 0), 0)
    assert store.state(key) is None
    store.reserve(key, 100, OWNER)
    assert store.state(key) is BufferState.PENDING
    assert store.used_bytes(0) == 100 and devices[0].hbm.used == 100
    with pytest.raises(TimeoutError):
        store.get(key, timeout=0.01)
    store.put(key, array(100, 7), OWNER)
    assert store.state(key) is BufferState.READY
    assert store.get(key, timeout=WAIT)[0] == 7
    assert store.stats()["entries"]["ready"] == 1
    assert store.delete(key)
    assert not store.delete(key)
    assert store.state(key) is None and len(store) == 0
    with pytest.raises(KeyError, match="deleted"):  # gone: a reader is told at once
        store.get(key, timeout=0.01)


def test_put_without_reserve_allocates(store):
    store.put(("x", 1), array(10), OWNER)
    assert store.used_bytes(1) == 10 and store.used_bytes(0) == 0
    assert store.delete(("x", 1))


def test_double_reserve_or_put_is_a_clear_error(store):
    key = ("x", 0)
    store.reserve(key, 10, OWNER)
    with pytest.raises(ValueError, match=r"'x', 0"):
        store.reserve(key, 10, OWNER)
    with pytest.raises(ValueError, match="reserved with 10 bytes"):
        store.put(key, array(11), OWNER)
    with pytest.raises(ValueError, match="owned by"):
        store.put(key, array(10), ("someone-else", None))
    store.put(key, array(10), OWNER)
    with pytest.raises(ValueError, match=r"'x', 0.*already ready"):
        store.put(key, array(10), OWNER)
    with pytest.raises(ValueError, match="already ready"):
        store.fail(key, RuntimeError("late"))
    assert store.delete(key)


def test_bad_keys_and_owners(store):
    with pytest.raises(KeyError, match="no device 9"):
        store.reserve(("x", 9), 10, OWNER)
    with pytest.raises(ValueError, match="owner"):
        store.reserve(("x", 0), 10, "client-1")
    with pytest.raises(KeyError, match="no device 9"):
        store.get(("x", 9), timeout=WAIT)
    with pytest.raises(ValueError, match="key"):
        store.get("x", timeout=WAIT)
    assert store.delete(("unknown", 0)) is False


def test_delete_of_pending_leaves_a_tombstone_until_resolved(store, devices):
    key = ("x", 0)
    store.reserve(key, 100, OWNER)
    assert store.delete(key)
    assert store.state(key) is None
    assert store.stats()["entries"]["deleting"] == 1
    assert store.used_bytes(0) == 100  # the producer is still writing into it
    with pytest.raises(KeyError, match="deleted"):
        store.get(key, timeout=WAIT)
    store.put(key, array(100), OWNER)  # the producer finishes: memory goes back
    assert store.used_bytes(0) == 0 and devices[0].hbm.used == 0
    assert store.stats()["entries"]["deleting"] == 0


def test_failed_tombstone_is_freed_too(store):
    store.reserve(("x", 0), 100, OWNER)
    store.delete(("x", 0))
    store.fail(("x", 0), RuntimeError("producer died"))
    assert store.used_bytes(0) == 0


def test_failure_propagates_to_get_and_callbacks(store):
    key = ("x", 0)
    store.reserve(key, 8, OWNER)
    seen = []
    store.add_done_callback(key, lambda k: seen.append((k, store.state(k))))
    store.fail(key, ZeroDivisionError("in kernel"))
    assert seen == [(key, BufferState.FAILED)]
    with pytest.raises(ZeroDivisionError, match="in kernel"):
        store.get(key, timeout=WAIT)
    assert store.used_bytes(0) == 8  # a failed entry holds its memory until deleted
    assert store.delete(key)


def test_callbacks_run_once_outside_the_lock(store):
    key = ("x", 0)
    store.reserve(key, 8, OWNER)
    seen = []

    def reentrant(k):  # would deadlock if called under the store's lock
        seen.append(("first", store.get(k, timeout=WAIT)[0]))

    def broken(_k):
        raise RuntimeError("a callback bug must not stop the others")

    store.add_done_callback(key, reentrant)
    store.add_done_callback(key, broken)
    store.add_done_callback(key, lambda k: seen.append(("third", k)))
    store.put(key, array(8, 3), OWNER)
    store.add_done_callback(key, lambda k: seen.append(("late", k)))  # already ready: now
    assert seen == [("first", 3), ("third", key), ("late", key)]
    store.delete(key)
    with pytest.raises(KeyError, match="no device"):
        store.add_done_callback(("x", 5), print)


def test_get_waits_for_a_producer_thread(store, threads):
    key = ("x", 1)
    store.reserve(key, 4, OWNER)
    threads(store.put, key, array(4, 9), OWNER)
    assert list(store.get(key, timeout=WAIT)) == [9] * 4
    store.delete(key)


def test_readers_may_wait_for_a_key_nobody_created_yet(store, threads):
    key = (("c1", 0), 0)
    seen = []
    store.add_done_callback(key, seen.append)
    got = []
    threads(lambda: got.append(store.get(key, timeout=WAIT)[0]))
    assert store.state(key) is None and not store.delete(key)
    assert store.stats()["entries"]["awaited"] == 1
    store.put(key, array(4, 5), OWNER)  # the producer takes the placeholder over
    threads.started[0].join(WAIT)
    assert got == [5] and seen == [key]
    store.delete(key)


def test_a_timed_out_wait_leaves_nothing_behind(store):
    with pytest.raises(TimeoutError, match="awaited"):
        store.get(("never", 1), timeout=0.01)
    assert store.stats()["entries"]["awaited"] == 0


def test_fail_of_an_unreserved_key_poisons_readers(store):
    key = (("c1", 3), 1)
    seen = []
    store.add_done_callback(key, seen.append)
    store.fail(key, RuntimeError("producer failed before allocating"), owner=("c1", None))
    assert seen == [key] and store.state(key) is BufferState.FAILED
    with pytest.raises(RuntimeError, match="before allocating"):
        store.get(key, timeout=WAIT)
    store.fail(("orphan", 0), RuntimeError("no owner"))
    assert store.delete_owner("c1") == 1
    assert store.delete(("orphan", 0))


def test_devices_added_after_the_store_was_made(devices):
    host_devices = {}
    store = ObjectStore(host_devices)  # as a host does, before it learns its devices
    host_devices[0] = devices[0]
    store.put(("x", 0), array(8), OWNER)
    assert store.used_bytes(0) == 8 and store.stats()["bytes"] == {0: 8}
    store.delete(("x", 0))
    assert devices[0].hbm.used == 0


def test_delete_owner_collects_everything_a_client_owned(store):
    for n in range(3):
        store.put((("c1", n), n % 2), array(10), ("c1", "p1"))
    store.reserve((("c1", 9), 0), 10, ("c1", None))
    store.put((("c2", 0), 0), array(10), ("c2", "p1"))
    assert store.delete_owner("c1") == 4
    assert store.delete_owner("c1") == 0
    assert len(store) == 1 and store.used_bytes(0) == 20  # c2's, and c1's pending tombstone
    store.fail((("c1", 9), 0), RuntimeError("client lost"))
    assert store.delete_owner("c2") == 1


def test_a_put_or_reserve_without_room_fails_its_entry_at_once(store):
    # nothing in the store waits for HBM (what must wait does so in admit, on no thread)
    with pytest.raises(DeviceOutOfMemory, match="more than its whole HBM"):
        store.reserve(("huge", 0), HBM + 1, OWNER)
    store.put(("fill", 0), array(HBM - 100), OWNER)
    with pytest.raises(DeviceOutOfMemory, match="no room for 200 bytes of HBM now: only 100"):
        store.reserve(("late", 0), 200, OWNER)
    with pytest.raises(DeviceOutOfMemory, match="no room"):
        store.put(("later", 0), array(200), OWNER)
    for key in [("huge", 0), ("late", 0), ("later", 0)]:
        assert store.state(key) is BufferState.FAILED  # readers get the error, not a hang
        with pytest.raises(DeviceOutOfMemory):
            store.get(key, timeout=WAIT)
        store.delete(key)
    assert store.used_bytes(0) == HBM - 100
    store.delete(("fill", 0))
    store.reserve(("late", 0), 200, OWNER)  # room again
    assert store.used_bytes(0) == 200
    store.put(("late", 0), array(200), OWNER)
    store.delete(("late", 0))


def test_concurrent_producers_consumers_and_deleters(store, threads):
    """A smoke test: four threads churn through their own keys on two shared devices."""
    errors = []

    def churn(worker):
        try:
            _churn(store, worker, random.Random(worker))
        except Exception as exc:
            errors.append(exc)

    for worker in range(4):
        threads(churn, worker)
    for thread in threads.started:
        thread.join(WAIT)
    assert errors == []


def _churn(store, worker, rng):
    """Reserve, maybe delete early, resolve, read back; keep a few live keys, then collect."""
    owner, live = (worker, None), []
    for n in range(200):
        key, nbytes = ((worker, n), rng.randrange(2)), rng.randrange(1, 64)
        store.reserve(key, nbytes, owner)
        deleted = rng.random() < 0.3 and store.delete(key)
        if rng.random() < 0.2:
            store.fail(key, RuntimeError("kernel failed"))
        else:
            store.put(key, array(nbytes, n % 256), owner)
        if deleted:
            continue
        try:
            assert store.get(key, timeout=WAIT)[0] == n % 256
        except RuntimeError:
            assert store.state(key) is BufferState.FAILED
        live.append(key)
        if len(live) > 3:  # 4 workers x 3 keys x 63 bytes fit in one device's HBM
            assert store.delete(live.pop(0))
    assert store.delete_owner(worker) == len(live)


def test_delete_before_the_producer_frees_the_buffer_when_it_comes():
    from pathways.host.executor import standalone_device
    from pathways.host.object_store import ObjectStore
    from pathways.program.cost import DeviceSpec

    dev = standalone_device(0, DeviceSpec(hbm_bytes=1 << 20))
    try:
        store = ObjectStore({0: dev})
        assert store.delete(("late", 0)) is False  # nothing yet: remembered
        store.put(("late", 0), np.ones(128), ("c", None))
        assert store.used_bytes(0) == 0 and store.state(("late", 0)) is None
        store.reserve(("later", 0), 64, ("c", None))
        assert store.delete(("later", 0)) is True  # pending: tombstone, freed on resolve
        store.put(("later", 0), np.ones(8), ("c", None))
        assert store.used_bytes(0) == 0 and len(store) == 0
    finally:
        dev.close()


def test_retiring_a_client_frees_it_fails_its_awaited_reads_and_drops_later_puts(store, threads):
    from pathways.errors import ClientGone

    store.put(((7, 0), 0), array(128), (7, None))
    store.put(((8, 0), 0), array(128), (8, None))
    errors = []

    def read():
        try:
            store.get((TempId(7, 1, 3), 0), timeout=30)
        except Exception as exc:
            errors.append(exc)

    threads(read)
    wait_until(lambda: store.stats()["entries"]["awaited"] == 1)
    assert store.retire_client(7, ClientGone("client 7 closed")) == 1
    wait_until(lambda: len(errors) == 1)
    assert isinstance(errors[0], ClientGone)
    store.put((TempId(7, 2, 0), 0), array(64), (7, 2))  # a late output of its last run
    with pytest.raises(KeyError, match="gone"):
        store.get((TransferId(7, 2, 0, 0), 0), timeout=30)
    assert store.used_bytes(0) == 128  # only client 8's buffer
    assert store.get(((8, 0), 0), 0).sum() == 128
    store.delete(((8, 0), 0))


def test_buffer_keys_say_whose_and_which_run_they_are():
    from pathways.protocol import RunArg, key_client, key_run, transfer_key

    arg = RunArg(client=3, run_id=9, mode="parallel", inputs={0: (3, 17)}, outputs={}, seqs={})
    named, temp = (arg.array_id(0), 1), (arg.array_id(5), 1)
    moved = transfer_key(arg, consumer=2, port=1, device=4)
    assert temp[0] == TempId(3, 9, 5) and moved[0] == TransferId(3, 9, 2, 1)
    assert [key_client(k) for k in (named, temp, moved)] == [3, 3, 3]
    assert [key_run(k) for k in (named, temp, moved)] == [None, (3, 9), (3, 9)]
    assert key_client((None, 0)) is None and key_run((None, 0)) is None  # no known form


def test_keys_nobody_will_make_fail_their_readers_now_and_later(store):
    """A run failed: its outputs not made yet are doomed. A reader waiting for one (a save, a
    kernel of a later run) fails now, one that comes later fails at once instead of waiting
    forever, and an output already made is left alone (found by the fault simulation)."""
    waiting, later, made = (("c1", 7), 0), (("c1", 7), 1), (("c1", 8), 0)
    store.put(made, array(4, 2), OWNER)
    seen = []
    store.add_done_callback(waiting, seen.append)
    err = RuntimeError("the run failed: host 3 was lost")
    assert store.doom([waiting, later, made], err) == 1
    assert seen == [waiting]
    for key in (later, waiting):  # a reader that comes after is told at once
        with pytest.raises(RuntimeError, match="host 3 was lost"):
            store.get(key, timeout=WAIT)
    with pytest.raises(RuntimeError, match="host 3 was lost"):
        store.add_done_callback(later, seen.append)
    assert store.get(made, timeout=WAIT)[0] == 2
    store.delete(made)


def test_a_kernels_outputs_are_stored_together_or_not_at_all(store, devices):
    """``put_all`` (the outputs of a gang's kernels, each on its device with its grant),
    ``get_all`` and ``delete_all``: one lock each, the meaning of ``put``, ``get`` and
    ``delete`` of every key, and a batch that cannot be stored whole stores nothing and
    charges nothing."""
    grants = []
    store.admit(0, 300, grants.append)
    store.admit(1, 50, grants.append)
    grant, other = grants
    k1, k2, k3 = (("client-1", 1), 0), (("client-1", 2), 0), (("client-1", 3), 0)
    k4 = (("client-1", 1), 1)
    seen = []
    store.add_done_callback(k1, seen.append)  # a reader came before the producer
    store.put(k3, array(10), OWNER)
    with pytest.raises(ValueError, match="already exists"):  # in the other device's batch
        store.put_all([([(k4, array(50))], 2.0, other),
                       ([(k1, array(100)), (k3, array(100))], 1.0, grant)], OWNER)
    with pytest.raises(ValueError, match="left"):  # more than the grant holds
        store.put_all([([(k1, array(200)), (k2, array(200))], 1.0, grant)], OWNER)
    with pytest.raises(ValueError, match="twice"):
        store.put_all([([(k1, array(100)), (k1, array(100))], 1.0, grant)], OWNER)
    assert store.state(k1) is None and store.state(k4) is None and seen == []
    assert grant.nbytes == 300 and other.nbytes == 50
    store.put_all([([(k1, array(100, 5)), (k2, array(200, 6))], 1.0, grant),
                   ([(k4, array(50, 7))], 2.0, other)], OWNER)
    assert seen == [k1] and grant.nbytes == other.nbytes == 0
    assert store.arrival(k2) == 1.0 and store.arrival(k4) == 2.0
    assert devices[1].hbm.used == 50
    store.delete(k4)
    assert [v[0] for v in store.get_all([k1, k2, k3])] == [5, 6, 1]
    assert devices[0].hbm.used == 310
    store.delete_all([k1, k2, k3, (("client-1", 9), 0)])  # the unknown one is remembered
    assert devices[0].hbm.used == 0 and len(store) == 0
    with pytest.raises(KeyError, match="deleted"):
        store.get_all([k1])
    store.put((("client-1", 9), 0), array(10), OWNER)  # deleted before it came: freed
