"""The coordinator's control plane without sockets, threads or clocks: requests, host
membership, install and run ends and time go in; replies, host messages and the installs and
runs to start come out (``pathways.control.plane``)."""

import pytest

import plaque
from pathways.control.plane import ControlPlane, Install, RefuseHost, Reply, Start, ToHost
from pathways.errors import ClientGone, HostLost
from pathways.protocol import RunArg


def host(island=0, devices=2, name="h"):
    return {"role": "host", "island": island, "devices": devices, "data": f"tcp://{name}:1",
            "ici": f"tcp://{name}:2", "pid": 7, "hostname": name}


def of(commands, kind):
    return [c for c in commands if isinstance(c, kind)]


def payloads(commands, worker=None):
    return [c.payload for c in of(commands, ToHost) if worker is None or c.worker == worker]


@pytest.fixture
def plane():
    """A plane with two hosts of 2 devices on island 0 and one client (id 0, connection b"c")."""
    p = ControlPlane(client_timeout=5.0, check_every=1.0)
    p.hosts_live({10: host(name="a"), 11: host(name="b")})
    p.take()
    p.request(b"c", ("hello", 1, {"weight": 1.0}), now=0.0)
    assert p.take() == [Reply(b"c", ("welcome", 1, 0))]
    return p


def test_hosts_get_their_devices_and_the_topology_and_a_stranger_is_refused():
    p = ControlPlane()
    p.hosts_live({10: host(name="a"), 11: host(name="b"), 12: {"role": "stranger"}})
    out = p.take()
    assert payloads(out, 10)[0] == ("devices", [0, 1])
    assert payloads(out, 11)[0] == ("devices", [2, 3])
    assert of(out, RefuseHost)[0].worker == 12
    topology = {0: 10, 1: 10, 2: 11, 3: 11}
    links = {10: "tcp://a:2", 11: "tcp://b:2"}
    assert payloads(out, 10)[-1] == payloads(out, 11)[-1] == ("topology", topology, links)
    assert [d["host"] for d in p.devices()] == [10, 10, 11, 11]


def test_meshes_runs_and_their_ends(plane):
    plane.request(b"c", ("mesh", 2, 0, (4,), None), now=0.1)
    (reply,) = plane.take()
    mesh = reply.payload[2]
    assert reply.payload[:2] == ("mesh", 2) and sorted(mesh.devices) == [0, 1, 2, 3]
    pid, gangs = (0, 0), [tuple(mesh.devices)]
    plane.request(b"c", ("install", pid, ["nodes"], ["edges"], b"blob", gangs, [0]), now=0.2)
    assert plane.take() == [Install(pid, ["nodes"], ["edges"], b"blob")]
    arg = RunArg(0, 5, "parallel", {}, {}, {})
    plane.request(b"c", ("run", pid, 5, arg), now=0.3)
    assert plane.take() == []  # the install has not ended: the run waits for it
    plane.installed(pid, 42, None)
    (start,) = plane.take()
    assert isinstance(start, Start) and (start.key, start.gid) == ((pid, 5), 42)
    assert sorted(start.arg.seqs[0]) == sorted(mesh.devices)  # a number on each device
    plane.run_ended((pid, 5), None)
    assert plane.take() == [Reply(b"c", ("run_done", 5))]


def test_a_run_lost_with_its_host_names_the_host_and_frees_the_other_devices(plane):
    plane.request(b"c", ("mesh", 2, 0, (4,), None), now=0.1)
    mesh = plane.take()[0].payload[2]
    pid = (0, 0)
    plane.request(b"c", ("install", pid, [], [], b"", [tuple(mesh.devices)], [0]), now=0.2)
    plane.installed(pid, 1, None)
    plane.request(b"c", ("run", pid, 0, RunArg(0, 0, "parallel", {}, {}, {})), now=0.3)
    plane.take()
    plane.run_ended((pid, 0), plaque.WorkerLost(11, "it stopped answering"))
    out = plane.take()
    (failed,) = of(out, Reply)
    assert failed.payload[:2] == ("run_failed", 0) and isinstance(failed.payload[2], HostLost)
    assert "host 11" in str(failed.payload[2]) and "pid 7" in str(failed.payload[2])
    assert {c.worker for c in of(out, ToHost) if c.payload[0] == "abort_gangs"} == {10, 11}
    skips = {c.worker: c.payload[1] for c in of(out, ToHost) if c.payload[0] == "skip"}
    assert sorted(d for s in skips.values() for d in s) == sorted(mesh.devices)


def test_requests_for_another_client_are_refused(plane):
    plane.request(b"stranger", ("run", (0, 0), 3, None), now=0.1)
    plane.request(b"stranger", ("mesh", 4, 0, (2,), None), now=0.1)
    plane.request(b"stranger", ("no such request", 1), now=0.1)
    out = plane.take()
    assert [r.payload[:2] for r in out] == [("run_failed", 3), ("error", 4)]
    assert all(isinstance(r.payload[2], ClientGone) for r in out)


def test_a_silent_client_is_forgotten_and_its_buffers_freed(plane):
    def ticks(start, stop):  # the adapter ticks every second
        for now in range(start, stop + 1):
            plane.tick(float(now), heard_until=float(now))

    ticks(1, 3)
    plane.request(b"c", ("ping", 0), now=3.0)
    assert plane.take() == [Reply(b"c", ("pong", None, None))]
    ticks(4, 8)  # 5 s of silence: not yet more than the timeout
    assert plane.take() == []
    ticks(9, 9)
    out = plane.take()
    assert {c.worker for c in out if c.payload[0] == "client_gone"} == {10, 11}
    plane.request(b"c", ("mesh", 5, 0, (2,), None), now=9.5)  # its connection is nobody now
    assert plane.take()[0].payload[:2] == ("error", 5)


def test_a_lost_host_is_announced_to_every_client(plane):
    plane.hosts_live({10: host(name="a")})
    out = plane.take()
    (notice,) = of(out, Reply)
    assert notice.payload[0] == "host_lost" and notice.payload[2]["host"] == 11
    assert notice.payload[2]["devices"] == [2, 3] and notice.payload[2]["data"] == "tcp://b:1"
    assert payloads(out, 10) == [("topology", {0: 10, 1: 10}, {10: "tcp://a:2"})]
