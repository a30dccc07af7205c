"""The in-process twin (``pw.local_cluster(processes=False)``): the same coordinator and hosts
as threads of the test process, on in-process transports; most pathways tests run on it
(``conftest.pw_cluster``), so here is what makes it a faithful twin and a tidy one."""

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import pathways as pw
from pathways import P


def children() -> list[int]:
    """Child processes of this process (every thread's)."""
    out = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        out.extend(int(pid) for pid in text)
    return out


def host_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("pathways-host")}


def step(mesh):
    """All-reduce across hosts (ICI), a transfer to another spec, and a host-side reduction."""
    f = pw.shard_map(lambda b: pw.psum(b, "d") + b, mesh, P("d"), P("d"))
    g = pw.shard_map(lambda b: b * 2.0, mesh, P(), P())

    @pw.program
    def prog(x):
        y = f(x)
        return g(y), y

    return prog


def run(address, x0):
    with pw.connect(address) as client:
        mesh = client.mesh((4,), ("d",))
        a, b = step(mesh)(client.put(x0, mesh, P("d")))
        return a.result(timeout=60), b.result(timeout=60)


def test_the_twin_runs_in_threads_and_leaves_nothing_behind():
    before, others = set(children()), host_threads()  # the session's twin has some too
    with pw.local_cluster(islands=2, hosts_per_island=1, devices_per_host=2,
                          processes=False) as cluster:
        assert cluster.address.startswith("inproc://")
        assert cluster.keys is None and cluster.processes == []
        assert set(children()) == before  # no process started
        assert len(host_threads() - others) == 2
        with pw.connect(cluster.address) as client:
            devices = client.devices()
        assert sorted({d.island for d in devices}) == [0, 1] and len(devices) == 4
        assert len({d.host for d in devices}) == 2
    assert host_threads() == others


def test_the_twin_computes_what_processes_compute(pw_process_cluster):
    x0 = np.arange(16.0).reshape(8, 2)
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                          processes=False) as twin:
        on_twin = run(twin.address, x0)
    on_processes = run(pw_process_cluster.address, x0)
    for got, want in zip(on_twin, on_processes):
        np.testing.assert_array_equal(got, want)
    reduced = x0.reshape(4, 2, 2).sum(axis=0)  # what psum adds up over the 4 shards
    np.testing.assert_array_equal(on_twin[1], np.tile(reduced, (4, 1)) + x0)


def test_the_twin_takes_no_keys(tmp_path):
    with pytest.raises(ValueError, match="processes=False.*no keys"):
        with pw.local_cluster(keys=tmp_path, processes=False):
            pass  # never reached; had it started, the with would stop it


def test_a_failing_kernel_fails_its_run_and_the_twin_goes_on(pw_cluster):
    with pw.connect(pw_cluster.address) as client:
        mesh = client.mesh((2,), ("d",))

        def boom(b):
            if b.any():  # not on the zero-filled shards the client finds shapes with
                raise ZeroDivisionError("on purpose")
            return b

        x = client.put(np.ones(4), mesh, P("d"))
        with pytest.raises(ZeroDivisionError, match="on purpose") as info:
            pw.shard_map(boom, mesh, P("d"), P("d"))(x).result(timeout=60)
        assert isinstance(info.value, pw.RemoteError) and info.value.device in mesh.ids
        ok = pw.shard_map(lambda b: b + 1.0, mesh, P("d"), P("d"))(x)
        np.testing.assert_array_equal(ok.result(timeout=60), np.full(4, 2.0))


def test_a_host_busy_in_a_long_kernel_is_not_lost():
    """A body holds its host's loop for longer than the heartbeat timeout: the host's
    heartbeat thread keeps it alive through the in-process transport."""
    import time

    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=2,
                          heartbeat_timeout=1.0, processes=False) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((2,), ("d",))

            def slow(b):
                if b.any():  # on the host, not while the client finds shapes
                    time.sleep(2.5)
                return b + 1.0

            x = client.put(np.ones(4), mesh, P("d"))
            y = pw.shard_map(slow, mesh, P("d"), P("d"))(x)
            np.testing.assert_array_equal(y.result(timeout=60), np.full(4, 2.0))
            assert len(client.devices()) == 2  # the host is still a member
