"""The real Pathways roles on the simulator (``pw.local_cluster(simulate=True)``): results as on
a real cluster, in this thread, replayed from a seed, with messages and CPU in virtual time.
(Every docstring example also runs on a simulated cluster: ``test_doc_examples``.)"""

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.errors import CoordinatorLost
from pathways.lowering.lower import SMALL_RESULT


def children() -> list[int]:
    out = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            out.extend(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return out


def workload(client, steps=4):
    """A psum across hosts, a respec transfer and a chain of programs; the values fetched."""
    mesh = client.mesh((4,), ("d",))
    f = pw.shard_map(lambda b: pw.psum(b, "d") * 0.5 + b, mesh, P("d"), P("d"))
    g = pw.shard_map(lambda b: b * 2.0, mesh, P(), P())

    @pw.program
    def prog(x):
        y = f(x)
        return g(y), y

    x0 = np.arange(8.0)
    x = client.put(x0, mesh, P("d"))
    outs = []
    for _ in range(steps):
        a, x = prog(x)
        outs.append(a)
    want = x0
    for _ in range(steps):
        want = pw.reference(f)(want)
    return [a.result(timeout=60) for a in outs], x.result(timeout=60), want


def test_a_simulated_cluster_runs_the_real_roles_in_this_thread():
    threads, kids = set(threading.enumerate()), children()
    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True) as cluster:
        assert cluster.address.startswith("sim://")
        with pw.connect(cluster.address) as client:
            assert len(client.devices()) == 4
            assert len({d.host for d in client.devices()}) == 2
            _, last, want = workload(client)
            np.testing.assert_allclose(last, want)
            assert set(threading.enumerate()) == threads  # no thread, no process
            assert children() == kids
        assert cluster.clock() > 0
        assert "virtual s" in cluster.summary()


def trace(seed, latency=1e-4, cost=2e-5):
    """Every message of a run of ``workload`` and the final virtual time."""
    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True, seed=seed,
                          cpu="fixed", cost=cost, latency=latency, record=True) as cluster:
        with pw.connect(cluster.address) as client:
            values, _, _ = workload(client)
        return list(cluster.net.deliveries), cluster.clock(), values


def test_the_same_seed_and_script_replay_the_same_events_at_the_same_times():
    first, again = trace(seed=7), trace(seed=7)
    assert first[0] == again[0]  # every message: time, sender, receiver, size, checksum
    assert first[1] == again[1]
    for a, b in zip(first[2], again[2], strict=True):
        np.testing.assert_array_equal(a, b)
    slower = trace(seed=7, latency=1e-3)
    assert slower[1] > first[1]  # the figures of the network are what time is made of


def test_each_hop_takes_the_modelled_latency():
    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True, cpu=None,
                          latency=0.01) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((4,), ("d",))
            f = pw.shard_map(lambda b: b + 1.0, mesh, P("d"), P("d"))
            for n in (4, SMALL_RESULT // 4 + 4):  # a small result, then one to fetch
                x = client.put(np.ones(n, np.float32), mesh, P("d"))
                f(x).result()  # installs the program
                before = cluster.clock()
                np.testing.assert_array_equal(f(x).result(), np.full(n, 2.0))
                # run to the coordinator, start to the hosts, done back (with a small result),
                # then the fetch there and back: at least four or six crossings of 10 ms
                assert cluster.clock() - before >= (4 if n == 4 else 6) * 0.01


def test_the_users_cpu_is_the_clients_cpu():
    """A client that spends 1 ms per call cannot make more than 1,000 calls per virtual
    second (fixed charges: each call of the script costs ``cost``)."""
    calls = 40
    with pw.local_cluster(hosts_per_island=1, devices_per_host=2, simulate=True,
                          cpu="fixed", cost=1e-3) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((2,), ("d",))
            f = pw.shard_map(lambda b: b + 1.0, mesh, P("d"), P("d"))
            x = client.put(np.zeros(2), mesh, P("d"))
            x = f(x)
            x.block_until_ready()
            start = cluster.clock()
            for _ in range(calls):
                x = f(x)
            np.testing.assert_array_equal(x.result(), np.full(2, calls + 1.0))
            assert cluster.clock() - start >= calls * 1e-3
            assert cluster.user.used >= calls * 1e-3


def test_no_handler_starts_before_it_is_ready_nor_while_its_role_is_busy():
    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True,
                          cpu="measured", record=True) as cluster:
        with pw.connect(cluster.address) as client:
            workload(client, steps=2)
        assert {"coordinator", "host-0", "host-1", "client-0"} <= set(cluster.roles)
        for role in cluster.roles.values():
            end = 0.0
            for span in role.spans:
                assert span.start >= span.ready
                assert span.start >= end  # one handler at a time on a role's CPU
                assert span.end >= span.start
                end = span.end
        times = [d.time for d in cluster.net.deliveries]
        assert times == sorted(times)


def test_a_stopped_simulated_cluster_is_named_as_such():
    with pw.local_cluster(hosts_per_island=1, devices_per_host=1, simulate=True) as cluster:
        address = cluster.address
    with pytest.raises(CoordinatorLost, match="no simulated cluster at sim://"):
        pw.connect(address)


def test_options_a_simulated_cluster_cannot_take_are_refused():
    with pytest.raises(ValueError, match="simulated cluster takes no keys"):
        with pw.local_cluster(simulate=True, insecure=True):
            pass
    with pytest.raises(TypeError, match="given without simulate=True"):
        with pw.local_cluster(cpu="fixed"):
            pass
    with pytest.raises(ValueError, match="cpu must be one of"):
        with pw.local_cluster(simulate=True, cpu="wall"):
            pass


def test_a_killed_host_fails_the_calls_that_need_it_and_the_rest_goes_on():
    """The e2e test of a SIGKILLed host, in virtual time: the futures that need it fail with
    HostLost naming it within the heartbeat timeout; a mesh without it keeps working."""
    with pw.local_cluster(hosts_per_island=3, devices_per_host=2, simulate=True, seed=3,
                          heartbeat_timeout=2.0) as cluster:
        with pw.connect(cluster.address) as a, pw.connect(cluster.address) as b:
            hosts = {d.id: d.host for d in a.devices()}
            everywhere = a.mesh((6,), ("d",))
            victim = hosts[everywhere.ids[-1]]
            slow = pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, everywhere, P(), P(),
                                cost=0.2)
            doomed = [slow(a.put(np.zeros(()), everywhere, P())) for _ in range(3)]
            b.mesh((6,), ("all",))
            safe = tuple(d for d, h in hosts.items() if h != victim)
            mesh_b = pw.Mesh((4,), ("d",), safe, client=b)
            step = pw.shard_map(lambda v: pw.psum(v, "d") * 0.25 + 1.0, mesh_b, P(), P())
            x = b.put(np.zeros(()), mesh_b, P())
            cluster.kill_host(victim, at=cluster.clock() + 0.05)
            for _ in range(20):
                x = step(x)
            assert x.result(timeout=30) == 20.0
            killed_at = cluster.clock()
            for y in doomed:
                with pytest.raises(pw.HostLost, match=f"host {victim}"):
                    y.result(timeout=60)
            assert cluster.clock() - killed_at < 10.0  # virtual seconds: a bound, not a speed
            assert all(d.host != victim for d in a.devices())


def test_a_frozen_host_delays_its_work_by_the_freeze_and_loses_nothing():
    with pw.local_cluster(hosts_per_island=2, devices_per_host=1, simulate=True, cpu=None,
                          heartbeat_timeout=5.0) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((2,), ("d",))
            f = pw.shard_map(lambda v: pw.psum(v, "d"), mesh, P("d"), P())
            x = client.put(np.ones(2), mesh, P("d"))
            f(x).result()
            before = cluster.clock()
            cluster.freeze("host-1", 1.5)
            np.testing.assert_array_equal(f(x).result(), [2.0])
            assert cluster.clock() - before >= 1.5


def test_a_thread_of_the_script_calling_into_the_simulation_is_told_it_cannot():
    from pathways.sim import SimulationError

    with pw.local_cluster(hosts_per_island=1, devices_per_host=2, simulate=True) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((2,), ("d",))
            x = client.put(np.ones(2), mesh, P("d"))
            f = pw.shard_map(lambda v: v * 3.0, mesh, P("d"), P("d"))
            errors = []

            def worker():
                try:
                    f(x)
                except Exception as exc:
                    errors.append(exc)

            t = threading.Thread(target=worker, name="script-thread")
            t.start()
            t.join(30)
            assert len(errors) == 1 and isinstance(errors[0], SimulationError)
            assert "script-thread" in str(errors[0])
            np.testing.assert_array_equal(f(x).result(), [3.0, 3.0])  # this thread still can
            assert len(client.runs) == 0  # the refused call left no run pending


SCRIPT = '''
import sys
import numpy as np
import pathways as pw
from pathways import P

with pw.local_cluster(hosts_per_island=2, devices_per_host=2, heartbeat_timeout=1.0,
                      insecure=True) as cluster:
    with pw.connect(cluster.address) as client:
        mesh = client.mesh((4,), ("d",))
        step = pw.shard_map(lambda v: pw.psum(v, "d") * 0.25 + 1.0, mesh, P(), P(), cost=0.1)
        x = client.put(np.zeros(()), mesh, P())
        try:
            for _ in range(100):
                x = step(x)
                x.block_until_ready()
        except pw.HostLost as exc:
            print("lost at", round(cluster.clock(), 3), "after", float(x.result()) if
                  x.done() and x.exception() is None else "-", exc)
            sys.exit(3)
print("not lost")
'''


def run_simulate(tmp_path, *flags):
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, "-m", "pathways", "simulate", *flags, str(script)],
                          capture_output=True, text=True, timeout=300)


def test_pathways_simulate_runs_a_script_with_faults_and_replays_them(tmp_path):
    first = run_simulate(tmp_path, "--seed", "5", "--cpu", "fixed",
                         "--faults", "kill:host-1@1.0")
    assert first.returncode == 3, first.stderr  # the script's own exit status
    assert "lost at" in first.stdout and "host" in first.stdout
    assert "pathways simulate: simulated" in first.stderr  # virtual vs real time at exit
    again = run_simulate(tmp_path, "--seed", "5", "--cpu", "fixed",
                         "--faults", "kill:host-1@1.0")
    assert again.stdout == first.stdout  # the same failure at the same virtual time
    healthy = run_simulate(tmp_path, "--cpu", "none")
    assert healthy.returncode == 0 and "not lost" in healthy.stdout


def test_a_fault_plan_that_cannot_be_read_is_named(tmp_path):
    from pathways.simulated.faults import parse_faults

    with pytest.raises(ValueError, match="fault 'kill:host-x@1'"):
        parse_faults("kill:host-x@1")
    with pytest.raises(ValueError, match="probability"):
        parse_faults("drop:2")
    bad = run_simulate(tmp_path, "--faults", "explode:now")
    assert bad.returncode == 1 and "--faults: fault 'explode:now'" in bad.stderr


def test_shards_that_overtake_the_hosts_device_assignment_are_kept():
    """A client learns where devices are from the coordinator, while each host learns its
    devices from the coordinator over Plaque: a put can reach a host first. It used to be
    dropped there (the fault simulation found it: seed 124)."""
    from pathways.sim import Fault

    def slow_to_hosts(src, dst, nbytes, rng):  # everything to the hosts' Plaque workers
        return Fault(delay=0.5) if dst.endswith("/plaque") else Fault()

    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True,
                          faults=slow_to_hosts, heartbeat_timeout=5.0) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((4,), ("d",))
            x = client.put(np.arange(4.0), mesh, P("d"))
            total = pw.shard_map(lambda v: pw.psum(v, "d"), mesh, P("d"), P())
            np.testing.assert_array_equal(total(x).result(timeout=30), [6.0])


def test_the_clients_clock_and_its_traces_are_in_virtual_time(tmp_path):
    with pw.local_cluster(hosts_per_island=2, devices_per_host=1, simulate=True, cpu=None,
                          latency=0.01) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((2,), ("d",))
            f = pw.shard_map(lambda v: pw.psum(v, "d"), mesh, P("d"), P(), cost=0.25)
            x = client.put(np.ones(2), mesh, P("d"))
            t0 = client.clock()
            with client.trace(tmp_path / "trace.json") as tr:
                f(x).block_until_ready()
            assert client.clock() - t0 >= 0.25 + 3 * 0.01  # the kernel and the hops
            assert client.clock() == cluster.clock()  # nothing of the user's CPU charged
            kernels = [e for e in tr.trace["traceEvents"] if e.get("cat") == "kernel"]
            assert len(kernels) == 2
            assert all(abs(e["dur"] - 0.25e6) < 1e3 for e in kernels)  # microseconds


def _backlog(client, calls):
    """``calls`` independent computations on the client's 2 devices, all waited for; their
    values and the virtual times of the first submission and of the last result."""
    mesh = client.mesh((2,), ("d",))
    step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"), cost=1e-3)
    x = client.put(np.zeros(2), mesh, P("d"))
    t0 = client.clock()
    outs = [step(x) for _ in range(calls)]
    values = [o.result(timeout=60) for o in outs]
    return values, t0, client.clock()


def test_clients_run_as_concurrent_work_share_the_devices_each_on_its_own_cpu():
    with pw.local_cluster(hosts_per_island=1, devices_per_host=2, simulate=True) as cluster:
        clients = [pw.connect(cluster.address) for _ in range(3)]
        try:
            used = [cluster.roles[c.session.loop.name].cpu_used for c in clients]
            tasks = [cluster.run_as(c, _backlog, c, 20) for c in clients]
            done = [t.result(timeout=60) for t in tasks]
            for values, _, _ in done:
                for v in values:
                    np.testing.assert_array_equal(v, [1.0, 1.0])
            # concurrent: every client started before any finished (20 calls of 1 ms each)
            assert max(t0 for _, t0, _ in done) < min(t1 for _, _, t1 in done)
            for c, before in zip(clients, used):  # each client's work was on its own role
                assert cluster.roles[c.session.loop.name].cpu_used > before
            clients_of = {r[2].get("client") for recs in clients[0].timeline().values()
                          for r in recs}
            assert {c.id for c in clients} <= clients_of
        finally:
            for c in clients:
                c.close()


def test_run_as_raises_what_the_work_raised_sleeps_in_virtual_time_and_refuses_strangers():
    with pw.local_cluster(hosts_per_island=1, devices_per_host=2, simulate=True) as cluster, \
            pw.local_cluster(hosts_per_island=1, devices_per_host=1, simulate=True) as other:
        with pw.connect(cluster.address) as client, pw.connect(other.address) as stranger:
            def fails():
                raise KeyError("inside the work")

            with pytest.raises(KeyError, match="inside the work"):
                cluster.run_as(client, fails).result(timeout=10)

            def sleeps():
                t0 = client.clock()
                cluster.run_for(2.5)
                return client.clock() - t0

            assert 2.5 <= cluster.run_as(client, sleeps).result(timeout=10) < 2.6
            with pytest.raises(ValueError, match="not a client of this simulated cluster"):
                cluster.run_as(stranger, fails)


def test_native_thread_pools_run_on_the_roles_thread_while_simulating():
    """BLAS pools at one thread while any simulation runs (their CPU would escape the role's
    thread meter), their own sizes back after the last one closes."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def sizes():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info()]

    np.ones((64, 64)) @ np.ones((64, 64))  # BLAS loaded
    before = sizes()
    from pathways.simulated import SimCluster

    outer = SimCluster(hosts_per_island=1, devices_per_host=1)
    inner = SimCluster(hosts_per_island=1, devices_per_host=1)
    try:
        assert set(sizes()) <= {1}
        outer.close()  # closed first: the inner one still holds the pools at one
        assert set(sizes()) <= {1}
    finally:
        outer.close()
        inner.close()
    assert sizes() == before


def test_a_gang_fails_with_the_root_exception_even_when_a_peers_failure_arrives_first():
    """Device 1's body raises; device 0, waiting in a psum, fails because of it. Host 1's
    messages to the coordinator are late, so host 0's failure reaches it first: the call
    still fails with device 1's own exception, not its peer's abandoned psum."""
    from pathways.sim.network import NO_FAULT, Fault

    def late_from_host_1(src, dst, nbytes, rng):
        return Fault(delay=0.5) if src == "host-1/plaque" and dst.startswith("sim-") \
            else NO_FAULT

    def body(v):
        if v.sum() > 0:
            raise ValueError("the root cause")
        return pw.psum(v, "d")

    with pw.local_cluster(hosts_per_island=2, devices_per_host=1, simulate=True,
                          faults=late_from_host_1, heartbeat_timeout=5.0) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((2,), ("d",))
            x = client.put(np.array([0.0, 1.0]), mesh, P("d"))
            f = pw.shard_map(body, mesh, P("d"), P())
            with pytest.raises(ValueError, match="the root cause") as caught:
                f(x).result(timeout=30)
            assert isinstance(caught.value, pw.RemoteError)
            assert caught.value.device == mesh.ids[1] and "Abandoned" not in str(caught.value)


def test_work_still_waiting_when_the_cluster_closes_fails_then_clearly():
    from pathways.sim import SimulationError

    cluster = pw.local_cluster(hosts_per_island=1, devices_per_host=1, simulate=True)
    sim = cluster.__enter__()
    try:
        client = pw.connect(sim.address)
        never = sim.future()  # nobody sets it
        task = sim.run_as(client, lambda: never.result())
        sim.run_for(1.0)
        assert not task.done()
    finally:
        cluster.__exit__(None, None, None)
    with pytest.raises(SimulationError, match="closed while this work waited"):
        task.result(timeout=1)
    assert not sim._spawned  # nothing left for the garbage collector to kill later


def test_a_body_that_never_returns_fails_its_call_and_the_simulation_goes_on():
    """Kernel time limits hold in a simulation (in the CPU seconds a body spins, with no
    thread): a body that never returns fails with KernelTimeout naming its limit, and the
    cluster keeps serving."""
    def spin(x):
        while x.sum() > 0:  # only on real data: the client's shape pass sees zeros
            pass
        return x

    threads = set(threading.enumerate())
    with pw.local_cluster(hosts_per_island=1, devices_per_host=2, simulate=True,
                          kernel_limit=0.5) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((2,), ("i",))
        stuck = pw.shard_map(spin, mesh, P("i"), P("i"))
        with pytest.raises(pw.PathwaysError, match="KernelTimeout.*limit of 0.5 s"):
            stuck(client.put(np.ones(2), mesh, P("i"))).result()
        fine = pw.shard_map(lambda x: x + 1, mesh, P("i"), P("i"))
        np.testing.assert_array_equal(fine(client.put(np.ones(2), mesh, P("i"))).result(),
                                      [2.0, 2.0])
        assert set(threading.enumerate()) == threads
