"""Tests of the resource manager: hosts and islands, slice placement, failures and remap.

What is tested:

- hosts join and leave at run time; device ids are sequential and never reused;
- placement by worked examples: the TPU layout when a slice covers whole hosts, spreading
  over hosts, least-loaded first, the island choice, device kinds, and every error;
- losing a host breaks the slices on it, and ``remap`` repairs them in place;
- two hypothesis properties: loads stay balanced when all slices have the same size, and under
  any sequence of allocations, releases, host arrivals, host losses and remaps, every slice is
  one to one onto devices of one island, loads count live slices, and broken slices are
  exactly the ones on lost devices.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.control.resource_manager import DeviceInfo, ResourceManager, Slice
from pathways.errors import ResourceError


def cluster(*islands: list[int]) -> ResourceManager:
    """Island i gets one host per entry of ``islands[i]`` with that many devices."""
    rm = ResourceManager()
    host = 0
    for island, sizes in enumerate(islands):
        for size in sizes:
            rm.add_host(host, island, size)
            host += 1
    return rm


def loads(rm: ResourceManager, island: int | None = None) -> list[int]:
    return [rm.load(d.id) for d in rm.devices(island)]


# -- hosts and devices ------------------------------------------------------------------


def test_add_host_gives_sequential_ids_never_reused():
    rm = ResourceManager()
    assert rm.add_host(10, 0, 2) == [
        DeviceInfo(0, 0, 10, 0, "tpu-emu"),
        DeviceInfo(1, 0, 10, 1, "tpu-emu"),
    ]
    assert [d.id for d in rm.add_host(11, 1, 3, kind="cpu")] == [2, 3, 4]
    assert rm.remove_host(10) == [0, 1]
    assert [d.id for d in rm.add_host(10, 0, 2)] == [5, 6]
    assert [d.id for d in rm.devices()] == [2, 3, 4, 5, 6]
    assert [d.id for d in rm.devices(alive=False)] == [0, 1]
    assert [d.id for d in rm.devices(alive=None)] == list(range(7))
    assert [d.id for d in rm.devices(island=1)] == [2, 3, 4]


def test_islands_and_hosts_list_alive_devices():
    rm = cluster([2, 2], [1])
    assert {i: [d.id for d in devs] for i, devs in rm.islands().items()} == {
        0: [0, 1, 2, 3],
        1: [4],
    }
    assert {h: [d.id for d in devs] for h, devs in rm.hosts().items()} == {
        0: [0, 1],
        1: [2, 3],
        2: [4],
    }
    rm.remove_host(2)
    assert rm.islands()[1] == []  # the island is still known, with no alive device
    assert 2 not in rm.hosts()


def test_host_errors():
    rm = cluster([2])
    with pytest.raises(ResourceError, match="host 0 is already registered"):
        rm.add_host(0, 0, 4)
    with pytest.raises(ResourceError, match="at least one device"):
        rm.add_host(5, 0, 0)
    with pytest.raises(ResourceError, match="unknown host 9"):
        rm.remove_host(9)
    assert rm.remove_host(0) == [0, 1]
    assert rm.remove_host(0) == []  # reported twice: harmless
    with pytest.raises(ResourceError, match="unknown device 7"):
        rm.load(7)


# -- placement --------------------------------------------------------------------------


def test_slice_covering_whole_hosts_has_tpu_layout():
    rm = cluster([4, 4])
    s = rm.allocate("c", (2, 4))
    assert s == Slice(0, "c", (2, 4), 0, (0, 1, 2, 3, 4, 5, 6, 7), 0)
    # Rows follow host ids, not the order hosts joined in.
    rm = ResourceManager()
    rm.add_host(7, 0, 4)  # devices 0..3
    rm.add_host(3, 0, 4)  # devices 4..7
    assert rm.allocate("c", (2, 4)).devices == (4, 5, 6, 7, 0, 1, 2, 3)


def test_small_slices_pack_hosts_then_fill_least_loaded():
    rm = cluster([4, 4])
    assert rm.allocate("a", (4,)).devices == (0, 1, 2, 3)  # a whole host
    assert rm.allocate("b", (2,)).devices == (4, 5)  # the unloaded host
    assert rm.allocate("c", (2,)).devices == (6, 7)  # the rest of it: host 1 split once only
    assert rm.allocate("d", (2,)).devices == (0, 1)  # all at load 1: packed again
    assert loads(rm) == [2, 2, 1, 1, 1, 1, 1, 1]


def test_whole_hosts_are_used_before_a_host_is_split():
    rm = cluster([4, 4, 4])
    # 8 devices on 3 hosts: two whole hosts, the last axis inside each; the third is spare
    assert rm.allocate("a", (2, 4)).devices == (0, 1, 2, 3, 4, 5, 6, 7)
    rm = cluster([4, 2, 4])
    assert rm.allocate("a", (2,)).devices == (4, 5)  # the host it fits best: others stay whole
    assert rm.allocate("b", (6,)).devices == (0, 1, 2, 3, 6, 7)  # a whole host, then one more


def test_a_slice_may_ask_for_how_many_hosts_it_spans():
    rm = cluster([4, 4, 4])
    s = rm.allocate("a", (4,), hosts=2)  # across two hosts, two devices on each
    assert s.devices == (0, 1, 4, 5) and s.hosts == 2
    assert rm.allocate("b", (2, 2), hosts=2).devices == (2, 3, 6, 7)  # the unloaded shares
    for bad in (3, 0, True, 2.0, "2"):  # an equal share, a count of hosts
        with pytest.raises(ResourceError, match="hosts: an equal share on each needs a"):
            rm.allocate("c", (4,), hosts=bad)
    assert rm.allocate("c", (4,), hosts=np.int64(1)).hosts == 1  # numpy's ints are counts
    with pytest.raises(ResourceError, match="only 3 hosts can give 1"):
        rm.allocate("c", (4,), hosts=4)
    rm.remove_host(1)
    assert rm.remap(s.slice_id).devices == (0, 1, 8, 9)  # the lost share onto an unused host
    rm.suspend(s.slice_id)
    back = rm.resume(s.slice_id)
    assert back.hosts == 2 and len({d // 4 for d in back.devices}) == 2  # kept on resume


def test_island_choice_most_unloaded_then_lowest_id():
    rm = cluster([4], [4, 4])
    assert rm.allocate("a", (4,)).island == 1  # 8 unloaded devices against 4
    assert rm.allocate("a", (4,)).island == 0  # 4 against 4: lowest id
    assert rm.allocate("a", (2, 4)).island == 1  # only island 1 fits 8
    assert rm.allocate("a", (4,), island=0).island == 0  # explicit island, even if loaded


def test_kind_constraint():
    rm = ResourceManager()
    rm.add_host(0, 0, 4)
    rm.add_host(1, 1, 2, kind="gpu-emu")
    assert rm.allocate("c", (2,), kind="gpu-emu").devices == (4, 5)
    with pytest.raises(ResourceError, match=r"kind 'fpga'.*kinds: \['gpu-emu', 'tpu-emu'\]"):
        rm.allocate("c", (1,), kind="fpga")
    with pytest.raises(ResourceError, match="island 0 has no alive device of that kind"):
        rm.allocate("c", (1,), island=0, kind="gpu-emu")


@pytest.mark.parametrize("shape", [(0, 2), (2, -1), (), (1.5,), "ab"])
def test_bad_shape_is_rejected(shape):
    with pytest.raises(ResourceError, match="shape"):
        cluster([4]).allocate("c", shape)


def test_allocation_errors_name_request_and_what_exists():
    rm = cluster([4, 4], [2])
    with pytest.raises(ResourceError, match=r"\(4, 4\) \(16 devices\).*island 0 has only 8"):
        rm.allocate("c", (4, 4), island=0)
    with pytest.raises(ResourceError, match=r"no island has that many.*\{0: 8, 1: 2\}"):
        rm.allocate("c", (4, 4))
    with pytest.raises(ResourceError, match=r"unknown island 5; islands: \[0, 1\]"):
        rm.allocate("c", (1,), island=5)
    rm.remove_host(0)
    with pytest.raises(ResourceError, match="island 0 has only 4 alive devices"):
        rm.allocate("c", (8,), island=0)


def test_release_and_release_client():
    rm = cluster([4])
    a = rm.allocate("a", (2,))
    rm.allocate("b", (2,))
    rm.allocate("b", (4,))
    assert loads(rm) == [2, 2, 2, 2]
    rm.release(a.slice_id)
    assert loads(rm) == [1, 1, 2, 2]
    assert rm.release_client("b") == 2
    assert loads(rm) == [0, 0, 0, 0]
    assert rm.release_client("b") == 0
    with pytest.raises(ResourceError, match="unknown slice 0"):
        rm.release(a.slice_id)
    with pytest.raises(ResourceError, match="unknown slice 0"):
        rm.slice(a.slice_id)


# -- failures and remap -----------------------------------------------------------------


def test_lost_host_breaks_slice_and_remap_keeps_healthy_devices_in_place():
    rm = cluster([2, 2, 2])
    s = rm.allocate("c", (2, 2))
    other = rm.allocate("d", (2,), island=0)
    assert s.devices == (0, 1, 2, 3) and other.devices == (4, 5)  # whole hosts
    assert rm.remove_host(1) == [2, 3]
    assert rm.broken_slices() == [s.slice_id]
    rm.add_host(3, 0, 2)  # devices 6, 7 join at run time
    new = rm.remap(s.slice_id)
    # Host 0's row stays; the lost row goes whole onto the unloaded new host, not host 2.
    assert new == Slice(s.slice_id, "c", (2, 2), 0, (0, 1, 6, 7), 1)
    assert rm.slice(s.slice_id) == new and rm.broken_slices() == []
    assert rm.load(2) == 0 and rm.load(6) == 1
    rm = cluster([4, 4])
    s = rm.allocate("c", (2, 2))
    rm.allocate("d", (2,))  # host 1's devices 4, 5
    rm.remove_host(0)
    rm.add_host(2, 0, 4)  # devices 8..11
    # the lost host's devices go whole onto one host: the new one, not host 1's spare pair
    assert rm.remap(s.slice_id).devices == (8, 9, 10, 11)


def test_remap_of_healthy_slice_is_a_no_op():
    rm = cluster([4])
    s = rm.allocate("c", (2,))
    assert rm.remap(s.slice_id) is s


def test_remap_fails_when_too_few_healthy_devices_remain():
    rm = cluster([4, 4])
    s = rm.allocate("c", (8,))
    rm.remove_host(0)
    with pytest.raises(ResourceError, match="4 devices lost, island 0 has only 0 healthy"):
        rm.remap(s.slice_id)
    assert rm.slice(s.slice_id) == s and rm.broken_slices() == [s.slice_id]


def test_remap_keeps_the_kind_asked_for():
    rm = ResourceManager()
    rm.add_host(0, 0, 2, kind="big")
    rm.add_host(1, 0, 2, kind="small")
    rm.add_host(2, 0, 2, kind="big")
    s = rm.allocate("c", (2,), kind="big")
    assert s.devices == (0, 1)
    rm.remove_host(0)
    assert rm.remap(s.slice_id).devices == (4, 5)  # not the unloaded "small" devices


def test_snapshot():
    rm = cluster([2], [1])
    s = rm.allocate("c", (2,))
    rm.remove_host(1)
    snap = rm.snapshot()
    assert snap["islands"] == {0: [0, 1], 1: []}
    assert snap["hosts"] == {0: {"island": 0, "devices": [0, 1]}}
    assert snap["devices"][0] == {
        "island": 0,
        "host": 0,
        "index": 0,
        "kind": "tpu-emu",
        "alive": True,
        "load": 1,
    }
    assert snap["devices"][2]["alive"] is False
    assert snap["slices"] == {
        s.slice_id: {
            "client": "c",
            "shape": (2,),
            "island": 0,
            "devices": [0, 1],
            "version": 0,
            "broken": False,
        }
    }


# -- properties -------------------------------------------------------------------------

host_sizes = st.lists(st.integers(1, 5), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(sizes=host_sizes, data=st.data())
def test_same_size_slices_keep_loads_balanced(sizes, data):
    rm = cluster(sizes)
    total = sum(sizes)
    n = data.draw(st.integers(1, total), label="n")
    k = data.draw(st.integers(1, 12), label="k")
    for _ in range(k):
        rm.allocate("c", (n,), island=0)
        assert max(loads(rm)) - min(loads(rm)) <= 1
    if n * k <= total:
        assert max(loads(rm)) <= 1


@settings(max_examples=150, deadline=None)
@given(sizes=host_sizes, data=st.data())
def test_a_slice_on_free_hosts_splits_at_most_one_host(sizes, data):
    rm = cluster(sizes)
    n = data.draw(st.integers(1, sum(sizes)), label="n")
    devices = rm.allocate("c", (n,)).devices
    host = {d.id: d.host for d in rm.devices()}
    on = Counter(host[d] for d in devices)
    assert len([h for h, k in on.items() if k < sizes[h]]) <= 1, (sizes, devices)
    # laid out by host: the last axis runs inside one
    assert list(devices) == sorted(devices, key=lambda d: (host[d], d))


# Weighted so that a typical run allocates, loses hosts and remaps several times.
OPS = ["allocate"] * 3 + ["release", "release_client", "add_host", "remove_host"] + ["remap"] * 2


def check_invariants(rm: ResourceManager) -> None:
    alive = {d.id for d in rm.devices()}
    info = {d.id: d for d in rm.devices(alive=None)}
    live = [rm.slice(sid) for sid in rm.snapshot()["slices"]]
    for s in live:
        assert len(s.devices) == math.prod(s.shape) == len(set(s.devices))  # one to one
        assert {info[d].island for d in s.devices} == {s.island}
    assert rm.broken_slices() == sorted(s.slice_id for s in live if not set(s.devices) <= alive)
    for d in info:
        assert rm.load(d) == sum(d in s.devices for s in live)


def do_op(rm: ResourceManager, data, op: str, next_host: int) -> None:
    """Apply one random operation and check its own postconditions."""
    alive = {d.id for d in rm.devices()}
    live = sorted(rm.snapshot()["slices"])
    if op == "allocate":
        shape = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
        island = data.draw(st.sampled_from([None, 0, 1]))
        try:
            s = rm.allocate(data.draw(st.sampled_from("ab")), shape, island=island)
        except ResourceError:
            fit = [len(devs) >= math.prod(shape) for i, devs in rm.islands().items()]
            assert not (fit[island] if island is not None else any(fit))
            return
        assert set(s.devices) <= alive and s.version == 0
    elif op == "release" and live:
        rm.release(data.draw(st.sampled_from(live)))
    elif op == "release_client":
        rm.release_client(data.draw(st.sampled_from("ab")))
    elif op == "add_host":
        rm.add_host(next_host, data.draw(st.integers(0, 1)), data.draw(st.integers(1, 4)))
    elif op == "remove_host" and rm.hosts():
        rm.remove_host(data.draw(st.sampled_from(sorted(rm.hosts()))))
    elif op == "remap" and rm.broken_slices():
        old = rm.slice(data.draw(st.sampled_from(rm.broken_slices())))
        try:
            new = rm.remap(old.slice_id)
        except ResourceError:
            return
        assert set(new.devices) <= alive and new.version == old.version + 1
        assert all(n == o for n, o in zip(new.devices, old.devices) if o in alive)


@settings(max_examples=100, deadline=None)
@given(sizes0=host_sizes, sizes1=host_sizes, data=st.data())
def test_any_run_keeps_slices_one_to_one_and_loads_exact(sizes0, sizes1, data):
    rm = cluster(sizes0, sizes1)
    next_host = len(sizes0) + len(sizes1)
    for op in data.draw(st.lists(st.sampled_from(OPS), min_size=5, max_size=30), label="ops"):
        do_op(rm, data, op, next_host)
        next_host += 1
        check_invariants(rm)


def test_suspend_frees_a_slice_s_devices_and_resume_maps_it_again():
    rm = ResourceManager()
    rm.add_host(0, island=0, num_devices=2)
    rm.add_host(1, island=0, num_devices=2)
    s = rm.allocate("a", (2,))
    rm.suspend(s.slice_id)
    assert not rm.is_live(s.slice_id) and rm.client_of(s.slice_id) == "a"
    assert all(rm.load(d) == 0 for d in range(4))
    other = rm.allocate("b", (4,))  # every device free for others
    back = rm.resume(s.slice_id)
    assert back.slice_id == s.slice_id and back.version == s.version + 1
    assert back.shape == (2,) and rm.is_live(s.slice_id)
    assert sum(rm.load(d) for d in range(4)) == len(other.devices) + 2
    with pytest.raises(ResourceError, match="not suspended"):
        rm.resume(s.slice_id)
    rm.suspend(s.slice_id)
    rm.release_client("a")
    assert rm.client_of(s.slice_id) is None  # a client that leaves takes its suspended slices


def test_restore_undoes_a_suspension_on_the_same_devices_unless_one_was_lost():
    rm = ResourceManager()
    rm.add_host(0, island=0, num_devices=2)
    rm.add_host(1, island=0, num_devices=2)
    s = rm.allocate("a", (2,))
    rm.suspend(s.slice_id)
    rm.allocate("b", (4,))  # others took the devices meanwhile: ordinary sharing
    assert rm.restore(s.slice_id) == s  # same devices, same version: its buffers are valid
    assert all(rm.load(d) == 1 + (d in s.devices) for d in range(4))
    with pytest.raises(ResourceError, match="not suspended"):
        rm.restore(s.slice_id)
    rm.suspend(s.slice_id)
    assert s.devices == (0, 1)
    rm.remove_host(0)  # devices 0 and 1 are lost
    with pytest.raises(ResourceError, match="were lost"):
        rm.restore(s.slice_id)
    assert rm.is_suspended(s.slice_id)  # left as it was: resume still possible
    assert rm.resume(s.slice_id).version == s.version + 1


def test_resume_avoids_the_devices_it_is_told_to_or_fails_and_stays_suspended():
    rm = ResourceManager()
    rm.add_host(0, island=0, num_devices=2)
    rm.add_host(1, island=0, num_devices=2)
    s = rm.allocate("a", (2,))
    rm.suspend(s.slice_id)
    back = rm.resume(s.slice_id, avoid=set(s.devices))
    assert not set(back.devices) & set(s.devices)
    rm.suspend(s.slice_id)
    with pytest.raises(ResourceError, match=r"only 1 alive devices besides \[0, 1, 2\]"):
        rm.resume(s.slice_id, avoid={0, 1, 2})
    assert rm.is_suspended(s.slice_id) and all(rm.load(d) == 0 for d in range(4))
