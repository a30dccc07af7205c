"""The coordinator's control plane without sockets, threads or clocks: requests, host
membership, install and run ends and time go in; replies, host messages and the installs and
runs to start come out (``pathways.control.plane``)."""

import dataclasses

import pytest

import plaque
from pathways import protocol as m
from pathways.control.plane import ControlPlane, InstallGraph, RefuseHost, Reply, StartRun, ToHost
from pathways.errors import ClientGone, HostLost
from pathways.protocol import RunArg


def host(island=0, devices=2, name="h"):
    return {"role": "host", "island": island, "devices": devices, "data": f"tcp://{name}:1",
            "ici": f"tcp://{name}:2", "pid": 7, "hostname": name}


def of(commands, kind):
    return [c for c in commands if isinstance(c, kind)]


def sent(commands, worker=None):
    return [c.msg for c in of(commands, ToHost) if worker is None or c.worker == worker]


@pytest.fixture
def plane():
    """A plane with two hosts of 2 devices on island 0 and one client (id 0, connection b"c")."""
    p = ControlPlane(client_timeout=5.0, check_every=1.0)
    p.hosts_live({10: host(name="a"), 11: host(name="b")})
    p.take()
    p.request(b"c", m.Hello(1, {"weight": 1.0}), now=0.0)
    assert p.take() == [Reply(b"c", m.Answer(1, 0))]
    return p


def test_hosts_get_their_devices_and_the_topology_and_a_stranger_is_refused():
    p = ControlPlane()
    p.hosts_live({10: host(name="a"), 11: host(name="b"), 12: {"role": "stranger"}})
    out = p.take()
    assert sent(out, 10)[0] == m.AssignDevices([0, 1])
    assert sent(out, 11)[0] == m.AssignDevices([2, 3])
    assert of(out, RefuseHost)[0].worker == 12
    topology = {0: 10, 1: 10, 2: 11, 3: 11}
    links = {10: "tcp://a:2", 11: "tcp://b:2"}
    assert sent(out, 10)[-1] == sent(out, 11)[-1] == m.Topology(topology, links)
    assert [d["host"] for d in p.devices()] == [10, 10, 11, 11]


def test_meshes_runs_and_their_ends(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    (reply,) = plane.take()
    mesh = reply.msg.value
    assert reply.msg.req == 2 and sorted(mesh.devices) == [0, 1, 2, 3]
    pid, gangs = (0, 0), [tuple(mesh.devices)]
    plane.request(b"c", m.InstallProgram(pid, ["nodes"], ["edges"], b"blob", gangs, [0]),
                  now=0.2)
    assert plane.take() == [InstallGraph(pid, ["nodes"], ["edges"], b"blob")]
    arg = RunArg(0, 5, "parallel", {}, {}, {})
    plane.request(b"c", m.RunProgram(pid, 5, arg), now=0.3)
    assert plane.take() == []  # the install has not ended: the run waits for it
    plane.installed(pid, 42, None)
    (start,) = plane.take()
    assert isinstance(start, StartRun) and (start.key, start.gid) == ((pid, 5), 42)
    assert sorted(start.arg.seqs[0]) == sorted(mesh.devices)  # a number on each device
    plane.run_ended((pid, 5), None)
    assert plane.take() == [Reply(b"c", m.RunDone(5))]


def test_a_clients_runs_are_numbered_in_the_order_it_made_them_across_an_install(plane):
    """A run of a program still being installed holds back the client's later runs, even of
    installed programs: the later one may take its output as input, and numbered first it
    would wait on its devices for a value that only a kernel queued behind it can make (found
    by the fault simulation: seed 2 of test_sim_faults, with late messages)."""
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    gangs = [tuple(plane.take()[0].msg.value.devices)]
    step, chain = (0, 0), (0, 1)
    for pid in (step, chain):
        plane.request(b"c", m.InstallProgram(pid, [], [], b"", gangs, [0]), now=0.2)
    plane.take()
    plane.installed(step, 41, None)
    run = {i: RunArg(0, i, "parallel", {}, {}, {}) for i in range(4)}
    plane.request(b"c", m.RunProgram(step, 0, run[0]), now=0.3)  # installed: starts
    plane.request(b"c", m.RunProgram(chain, 1, run[1]), now=0.3)  # waits for its install
    plane.request(b"c", m.RunProgram(step, 2, run[2]), now=0.3)  # must wait behind it
    assert [s.key for s in of(plane.take(), StartRun)] == [(step, 0)]
    plane.installed(chain, 42, None)
    starts = of(plane.take(), StartRun)
    assert [s.key for s in starts] == [(chain, 1), (step, 2)]
    device = gangs[0][0]
    assert starts[0].arg.seqs[0][device] < starts[1].arg.seqs[0][device]
    plane.request(b"c", m.RunProgram(step, 3, run[3]), now=0.4)  # nothing held: at once
    assert [s.key for s in of(plane.take(), StartRun)] == [(step, 3)]


def test_runs_held_behind_a_failed_install_go_on_and_the_failed_ones_fail(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    gangs = [tuple(plane.take()[0].msg.value.devices)]
    good, bad = (0, 0), (0, 1)
    for pid in (good, bad):
        plane.request(b"c", m.InstallProgram(pid, [], [], b"", gangs, [0]), now=0.2)
    plane.take()
    plane.installed(good, 41, None)
    plane.request(b"c", m.RunProgram(bad, 0, RunArg(0, 0, "parallel", {}, {}, {})), now=0.3)
    plane.request(b"c", m.RunProgram(good, 1, RunArg(0, 1, "parallel", {}, {}, {})), now=0.3)
    assert of(plane.take(), StartRun) == []
    plane.installed(bad, None, plaque.GraphError("no room"))
    out = plane.take()
    assert [s.key for s in of(out, StartRun)] == [(good, 1)]
    failed = [r.msg for r in of(out, Reply) if isinstance(r.msg, m.RunFailed)]
    assert [f.run_id for f in failed] == [0]


def test_a_run_lost_with_its_host_names_the_host_and_frees_the_other_devices(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    mesh = plane.take()[0].msg.value
    pid = (0, 0)
    plane.request(b"c", m.InstallProgram(pid, [], [], b"", [tuple(mesh.devices)], [0]), now=0.2)
    plane.installed(pid, 1, None)
    plane.request(b"c", m.RunProgram(pid, 0, RunArg(0, 0, "parallel", {}, {}, {})), now=0.3)
    plane.take()
    plane.run_ended((pid, 0), plaque.WorkerLost(11, "it stopped answering"))
    out = plane.take()
    (failed,) = of(out, Reply)
    assert failed.msg.run_id == 0 and isinstance(failed.msg.error, HostLost)
    assert "host 11" in str(failed.msg.error) and "pid 7" in str(failed.msg.error)
    assert {c.worker for c in of(out, ToHost) if isinstance(c.msg, m.AbortGangs)} == {10, 11}
    skips = {c.worker: c.msg.seqs for c in of(out, ToHost) if isinstance(c.msg, m.SkipSeqs)}
    assert sorted(d for s in skips.values() for d in s) == sorted(mesh.devices)
    reasons = {c.msg.reason for c in of(out, ToHost) if isinstance(c.msg, m.SkipSeqs)}
    assert len(reasons) == 1 and "host 11" in reasons.pop()  # what skipped kernels fail with


def test_requests_for_another_client_are_refused(plane):
    plane.request(b"stranger", m.RunProgram((0, 0), 3, None), now=0.1)
    plane.request(b"stranger", m.AllocateMesh(4, 0, (2,), None), now=0.1)
    plane.request(b"stranger", m.Answer(1, None), now=0.1)  # no request at all: dropped
    out = plane.take()
    assert [type(r.msg) for r in out] == [m.RunFailed, m.Refused]
    assert out[0].msg.run_id == 3 and out[1].msg.req == 4
    assert all(isinstance(r.msg.error, ClientGone) for r in out)


def test_a_silent_client_is_forgotten_and_its_buffers_freed(plane):
    def ticks(start, stop):  # the adapter ticks every second
        for now in range(start, stop + 1):
            plane.tick(float(now), heard_until=float(now))

    ticks(1, 3)
    plane.request(b"c", m.Ping(0), now=3.0)
    assert plane.take() == [Reply(b"c", m.Answer(None, None))]
    ticks(4, 8)  # 5 s of silence: not yet more than the timeout
    assert plane.take() == []
    ticks(9, 9)
    out = plane.take()
    assert {c.worker for c in out if isinstance(c.msg, m.ClientLeft)} == {10, 11}
    plane.request(b"c", m.AllocateMesh(5, 0, (2,), None), now=9.5)  # its connection: nobody
    (refused,) = plane.take()
    assert refused.msg.req == 5 and isinstance(refused.msg.error, ClientGone)


def test_a_lost_host_is_announced_to_every_client(plane):
    plane.hosts_live({10: host(name="a")})
    out = plane.take()
    (notice,) = of(out, Reply)
    assert isinstance(notice.msg, m.HostLostNotice) and notice.msg.host == 11
    assert notice.msg.devices == [2, 3] and notice.msg.data == "tcp://b:1"
    assert sent(out, 10) == [m.Topology({0: 10, 1: 10}, {10: "tcp://a:2"})]


def test_a_suspended_slice_frees_its_devices_and_resumes_with_a_new_version(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    first = plane.take()[0].msg.value
    plane.request(b"c", m.Suspend(3, 0, first.slice_id), now=0.2)
    assert plane.take() == [Reply(b"c", m.Answer(3, None))]
    resources = plane.status()["resources"]
    assert resources["slices"] == {} and first.slice_id in resources["suspended"]
    assert all(d["load"] == 0 for d in resources["devices"].values())
    plane.request(b"c", m.Resume(4, 0, first.slice_id), now=0.3)
    again = plane.take()[0].msg.value
    assert (again.slice_id, again.version, again.shape) == (first.slice_id, 1, (4,))
    plane.request(b"c", m.Resume(5, 0, first.slice_id), now=0.4)  # not suspended now
    (refused,) = plane.take()
    assert isinstance(refused.msg, m.Refused) and "not suspended" in str(refused.msg.error)


def _client(plane, ident, priority, now):
    plane.request(ident, m.Hello(1, {"priority": priority}), now=now)
    return plane.take()[0].msg.value


def test_a_preempting_allocation_waits_for_lower_priority_slices_to_be_suspended(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)  # client 0, priority 0
    low = plane.take()[0].msg.value
    equal = _client(plane, b"e", 5, 0.1)  # as high as the preempting client: kept
    plane.request(b"e", m.AllocateMesh(2, equal, (2,), None), now=0.1)
    plane.take()
    high = _client(plane, b"h", 5, 0.2)
    plane.request(b"h", m.AllocateMesh(3, high, (4,), None, True), now=0.3)
    out = plane.take()
    # only the lower-priority client is asked; the allocation waits for it
    assert out == [Reply(b"c", m.SuspendNotice(low.slice_id, f"client {high} of priority 5"
                                                            " needs its devices"))]
    plane.request(b"c", m.Suspend(4, 0, low.slice_id), now=0.5)
    out = plane.take()
    assert out[0] == Reply(b"c", m.Answer(4, None))
    assert out[1].ident == b"h" and out[1].msg.req == 3
    assert sorted(out[1].msg.value.devices) == [0, 1, 2, 3]


def test_a_preemption_nobody_answers_is_refused_in_bounded_time_and_a_lost_victim_frees():
    plane = ControlPlane(client_timeout=5.0, check_every=1.0, preempt_timeout=2.0)
    plane.hosts_live({10: host(name="a"), 11: host(name="b")})
    plane.take()
    low = _client(plane, b"c", 0, 0.0)
    plane.request(b"c", m.AllocateMesh(2, low, (4,), None), now=0.1)
    plane.take()
    high = _client(plane, b"h", 5, 0.2)
    plane.request(b"h", m.AllocateMesh(3, high, (2,), None, True), now=0.3)
    plane.take()
    plane.tick(2.5, 2.5)  # the victim never suspends (clients are silent for less than 5 s)
    (refused,) = [c for c in plane.take() if isinstance(c, Reply) and c.ident == b"h"]
    assert isinstance(refused.msg, m.Refused) and "did not suspend" in str(refused.msg.error)
    # again; this time the victim closes: its slices go and the allocation is answered
    plane.request(b"h", m.AllocateMesh(4, high, (2,), None, True), now=2.6)
    plane.take()
    plane.request(b"c", m.Bye(low), now=2.7)
    answered = [c for c in plane.take() if isinstance(c, Reply) and c.ident == b"h"]
    assert answered and answered[0].msg.req == 4 and len(answered[0].msg.value.devices) == 2


def _replies(plane, ident):
    return [c.msg for c in plane.take() if isinstance(c, Reply) and c.ident == ident]


def test_a_cancelled_suspend_puts_the_slice_back_on_its_devices(plane):
    """A client whose Suspend went unanswered sends CancelSuspend; the coordinator handles it
    after the Suspend (one client's messages keep their order) and undoes it."""
    plane.request(b"c", m.AllocateMesh(2, 0, (2,), None), now=0.1)
    first = plane.take()[0].msg.value
    other = _client(plane, b"o", 0, 0.1)  # takes devices meanwhile: ordinary sharing
    plane.request(b"c", m.Suspend(3, 0, first.slice_id), now=0.2)
    plane.request(b"o", m.AllocateMesh(4, other, (4,), None), now=0.3)
    plane.request(b"c", m.CancelSuspend(5, 0, first.slice_id), now=0.4)
    out = _replies(plane, b"c")
    assert out == [m.Answer(3, None), m.Answer(5, first)]  # same devices, same version
    resources = plane.status()["resources"]
    assert first.slice_id in resources["slices"] and resources["suspended"] == {}
    assert sum(d["load"] for d in resources["devices"].values()) == 2 + 4
    plane.request(b"c", m.CancelSuspend(6, 0, first.slice_id), now=0.5)  # nothing to undo
    assert _replies(plane, b"c") == [m.Answer(6, first)]


def test_a_suspension_that_made_room_for_a_preemption_stands(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    low = plane.take()[0].msg.value
    high = _client(plane, b"h", 9, 0.2)
    plane.request(b"h", m.AllocateMesh(3, high, (4,), None, True), now=0.3)
    plane.take()  # the SuspendNotice
    plane.request(b"c", m.Suspend(4, 0, low.slice_id), now=0.5)
    assert _replies(plane, b"h")[0].req == 3  # granted
    plane.request(b"c", m.CancelSuspend(5, 0, low.slice_id), now=0.6)
    assert _replies(plane, b"c") == [m.Answer(5, None)]  # it stands: the client completes it
    assert plane.status()["resources"]["suspended"].keys() == {low.slice_id}


def test_a_suspension_a_pending_preemption_waits_for_stands_too(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (2,), None), now=0.1)
    plane.request(b"c", m.AllocateMesh(3, 0, (2,), None), now=0.1)
    a, b = (r.msg.value for r in plane.take())
    high = _client(plane, b"h", 9, 0.2)
    plane.request(b"h", m.AllocateMesh(4, high, (4,), None, True), now=0.3)
    plane.take()
    plane.request(b"c", m.Suspend(5, 0, a.slice_id), now=0.4)
    plane.request(b"c", m.CancelSuspend(6, 0, a.slice_id), now=0.5)
    assert _replies(plane, b"c") == [m.Answer(5, None), m.Answer(6, None)]
    plane.request(b"c", m.Suspend(7, 0, b.slice_id), now=0.6)
    out = plane.take()
    assert [c.msg.req for c in out if c.ident == b"h"] == [4]  # granted: no victim came back


def _preempted(plane):
    """Client 0's slice of all 4 devices, preempted by a priority-9 client's slice of 2."""
    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    low = plane.take()[0].msg.value
    high = _client(plane, b"h", 9, 0.2)
    plane.request(b"h", m.AllocateMesh(3, high, (2,), None, True), now=0.3)
    plane.take()
    plane.request(b"c", m.Suspend(4, 0, low.slice_id), now=0.4)
    room = _replies(plane, b"h")[0].value
    plane.take()
    return low, high, room


def test_a_preempted_slice_does_not_resume_onto_the_devices_its_preemptor_holds(plane):
    low, high, room = _preempted(plane)
    plane.request(b"c", m.Resume(5, 0, low.slice_id), now=0.5)  # no wait: refused at once
    (refused,) = _replies(plane, b"c")
    assert isinstance(refused, m.Refused) and f"preempted by client {high}" in str(
        refused.error) and str(sorted(room.devices)) in str(refused.error)
    plane.request(b"c", m.Resume(6, 0, low.slice_id, 2.0), now=0.6)  # waits up to 2 s
    assert _replies(plane, b"c") == []
    plane.tick(1.5, 1.5)
    assert _replies(plane, b"c") == []
    plane.tick(2.7, 2.7)
    (refused,) = _replies(plane, b"c")
    assert refused.req == 6 and "preempted by client" in str(refused.error)
    assert "waited 2 s" in str(refused.error)
    resources = plane.status()["resources"]
    assert list(resources["slices"]) == [room.slice_id]  # the devices are not shared
    # ordinary sharing still works: a new slice of the same client, without preempt
    plane.request(b"c", m.AllocateMesh(7, 0, (4,), None), now=2.8)
    assert len(_replies(plane, b"c")[0].value.devices) == 4


def test_a_waiting_resume_is_answered_once_the_preempting_slice_is_gone(plane):
    low, high, room = _preempted(plane)
    plane.request(b"c", m.Resume(5, 0, low.slice_id, 30.0), now=0.5)
    assert _replies(plane, b"c") == []
    plane.request(b"h", m.Suspend(6, high, room.slice_id), now=0.6)  # or it leaves
    assert _replies(plane, b"c")[0] == m.Answer(5, dataclasses.replace(
        low, version=low.version + 1))
    plane.request(b"h", m.Resume(7, high, room.slice_id), now=0.7)  # no preemptor: shares
    assert _replies(plane, b"h")[0].req == 7


def test_a_preempted_slice_resumes_at_once_onto_other_free_devices(plane):
    plane.request(b"c", m.AllocateMesh(2, 0, (2,), None), now=0.1)
    plane.request(b"c", m.AllocateMesh(3, 0, (2,), None), now=0.1)
    a, b = (r.msg.value for r in plane.take())
    high = _client(plane, b"h", 9, 0.2)
    plane.request(b"h", m.AllocateMesh(4, high, (2,), None, True), now=0.3)
    (notice,) = _replies(plane, b"c")
    victim = a if notice.slice_id == a.slice_id else b
    plane.request(b"c", m.Suspend(5, 0, victim.slice_id), now=0.4)
    room = _replies(plane, b"h")[0].value
    assert room.devices == victim.devices
    plane.request(b"c", m.Resume(6, 0, victim.slice_id), now=0.5)
    (back,) = _replies(plane, b"c")
    assert not set(back.value.devices) & set(room.devices)


def test_status_lists_runs_in_flight_and_the_latest_failed_runs_with_their_tracebacks(plane):
    """What a dashboard shows: each client's runs in flight (waiting for an install, then
    started as a Plaque run) and the failed runs, a kernel's own error with where it failed
    and its remote traceback."""
    from pathways.errors import RemoteError

    plane.request(b"c", m.AllocateMesh(2, 0, (4,), None), now=0.1)
    gangs = [tuple(plane.take()[0].msg.value.devices)]
    pid = (0, 0)
    plane.request(b"c", m.InstallProgram(pid, [], [], b"", gangs, [0]), now=0.2)
    for run_id in (0, 1):
        plane.request(b"c", m.RunProgram(pid, run_id, RunArg(0, run_id, "parallel", {}, {}, {})),
                      now=0.3 + run_id)
    mine = plane.status()["clients"][0]
    assert (mine["held"], mine["runs"]) == (2, [])  # waiting for the install
    plane.installed(pid, 7, None)
    runs = plane.status()["clients"][0]["runs"]
    assert [(r["run"], r["started"], r["since"], r["t"]) for r in runs] == \
        [(0, True, 1.3, None), (1, True, 1.3, None)]  # numbered: each gang has its seqs
    plane.run_began((pid, 0), 40)
    plane.run_began((pid, 1), 41)
    st = plane.status()
    assert st["clients"][0]["running"] == 2
    assert [(r["graph"], r["t"]) for r in st["clients"][0]["runs"]] == [(7, 40), (7, 41)]
    plane.run_ended((pid, 0), None, now=2.0)
    origin = {"type": ("builtins", "ValueError"), "message": "bad shape", "function": "step",
              "device": 3, "host": "h pid 7", "traceback": "Traceback ...\nValueError: bad"}
    plane.run_ended((pid, 1), plaque.OperatorError("step", 0, 10, 41, "ValueError('bad')", "",
                                                   origin), now=2.5)
    st = plane.status()
    assert st["clients"][0]["runs"] == [] and st["clients"][0]["running"] == 0
    (err,) = st["errors"]
    assert (err["client"], err["program"], err["run"], err["at"]) == (0, 0, 1, 2.5)
    assert (err["type"], err["function"], err["device"]) == ("ValueError", "step", 3)
    assert err["message"] == "step failed on device 3 (h pid 7): ValueError: bad shape"
    assert err["traceback"] == "Traceback ...\nValueError: bad"
    assert isinstance(of(plane.take(), Reply)[-1].msg.error, RemoteError)
