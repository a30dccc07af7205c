"""Several clients sharing one island: scheduling policies checked from the devices' own
busy-time records, and every client's results correct."""

import contextlib

import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.client.trace import client_spans, device_time_by_client

KERNEL = 0.002  # modelled seconds per kernel: device time, not Python, decides the shares
WINDOW = 4


@pytest.fixture(scope="module")
def policy_cluster(request):
    """A cluster of one host with 4 devices whose scheduler runs ``request.param``."""
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=4,
                          policy=request.param, window=WINDOW, processes=False) as c:
        yield request.param, c


@contextlib.contextmanager
def connect_all(address, **per_client):
    """One client per value of the keyword list, e.g. weight=[1, 2, 4]; all closed after."""
    (key, values), = per_client.items()
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(pw.connect(address, **{key: v})) for v in values]


def streams(clients, n):
    """Each client submits ``n`` one-gang programs on the same 4 devices, interleaved."""
    meshes = [c.mesh((4,), ("d",)) for c in clients]
    assert len({m.ids for m in meshes}) == 1  # one island of 4: everyone shares it
    steps = [pw.shard_map(lambda x: x + 1.0, m, P("d"), P("d"), cost=KERNEL) for m in meshes]
    xs = [c.put(np.zeros(4), m, P("d")) for c, m in zip(clients, meshes)]
    outs = [[] for _ in clients]
    for _ in range(n):
        for j, (step, x) in enumerate(zip(steps, xs)):
            outs[j].append(step(x))
    return outs


@pytest.mark.parametrize("policy_cluster", ["share"], indirect=True)
def test_proportional_share_gives_device_time_by_weight(policy_cluster):
    _, cluster = policy_cluster
    weights = [1, 2, 4]
    with connect_all(cluster.address, weight=weights) as clients:
        outs = streams(clients, 60)
        for out in outs:
            for o in out:
                np.testing.assert_array_equal(o.result(timeout=60), np.ones(4))
        ids = [c.id for c in clients]
        timeline = clients[0].timeline()
        busy, _ = device_time_by_client(timeline, ids)  # while everyone was submitting
        total = sum(busy.values())
        for cid, w in zip(ids, weights):
            assert busy[cid] / total == pytest.approx(w / sum(weights), rel=0.10), busy


@pytest.mark.parametrize("policy_cluster", ["priority"], indirect=True)
def test_priority_serves_the_high_priority_client_first(policy_cluster):
    _, cluster = policy_cluster
    with connect_all(cluster.address, priority=[0, 5]) as (low, high):
        (low_out,) = streams([low], 40)
        (high_out,) = streams([high], 10)
        for o in low_out + high_out:
            np.testing.assert_array_equal(o.result(timeout=60), np.ones(4))
        timeline = low.timeline()
        lo, hi = client_spans(timeline, [high.id])[high.id]
        device = next(iter(timeline))
        low_starts = [r[3] for r in timeline[device] if r[2].get("client") == low.id]
        overtaking = [s for s in low_starts if lo < s < hi]
        assert len(overtaking) <= WINDOW  # only what was admitted before high arrived
        assert max(low_starts) > hi  # low still had work queued: high really went first


@pytest.mark.parametrize("policy_cluster", ["share", "priority", "fifo"], indirect=True)
def test_clients_sharing_an_island_all_get_correct_results(policy_cluster):
    _, cluster = policy_cluster
    with connect_all(cluster.address, weight=[1, 1, 3]) as clients:
        meshes = [c.mesh((2, 2), ("a", "b")) for c in clients]
        results = []
        for k, (c, m) in enumerate(zip(clients, meshes)):
            step = pw.shard_map(lambda x: pw.psum(x, "a") * 0.5 + 1.0, m, P("a"), P("a"))

            @pw.program
            def chain(x, step=step):
                for _ in range(4):
                    x = step(x)
                return x

            x0 = np.full((4, 2), float(k))
            results.append((chain(c.put(x0, m, P("a"))), pw.reference(chain)(x0)))
        for got, want in results:
            np.testing.assert_allclose(got.result(timeout=60), want)


def test_runs_spanning_two_islands_under_a_small_window_all_finish():
    with pw.local_cluster(islands=2, hosts_per_island=1, devices_per_host=2, policy="share",
                          window=1, processes=False) as cluster:
        with connect_all(cluster.address, weight=[1, 2]) as clients:
            outs = []
            for c in clients:
                m0, m1 = c.mesh((2,), ("d",), island=0), c.mesh((2,), ("d",), island=1)
                f0 = pw.shard_map(lambda v: v + 1.0, m0, P("d"), P("d"), cost=0.001)
                f1 = pw.shard_map(lambda v: v * 2.0, m1, P("d"), P("d"), cost=0.001)

                @pw.program
                def across(v, f0=f0, f1=f1):
                    return f1(f0(v))  # island 0, then a transfer over DCN, then island 1

                x = c.put(np.ones(4), m0, P("d"))
                outs += [across(x) for _ in range(15)]
            for o in outs:
                np.testing.assert_array_equal(o.result(timeout=60), np.full(4, 4.0))


VICTIM = """
import sys
import numpy as np
import pathways as pw
from pathways import P

with pw.connect(sys.argv[1], priority=0) as client:
    mesh = client.mesh((4,), ("d",))
    step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"), cost=0.05)
    x, n = client.put(np.zeros(8), mesh, P("d")), 0
    print("training", flush=True)
    while True:  # nothing here knows about priorities or preemption
        try:
            x = step(x)
            x.block_until_ready(timeout=60)
            n += 1
        except pw.SliceSuspended as err:
            print("suspended:", err, flush=True)
            break
    sys.stdin.readline()  # until the other client is done
    client.resume(mesh)
    x = step(x)
    assert np.array_equal(x.result(timeout=60), np.full(8, n + 1.0)), (x.result(), n)
    print("resumed and correct after", n + 1, "steps", flush=True)
"""


def test_a_higher_priority_client_makes_room_while_the_other_process_is_training(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "victim.py"
    script.write_text(VICTIM)
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2) as cluster:
        victim = subprocess.Popen([sys.executable, str(script), cluster.address],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert victim.stdout.readline().strip() == "training"
            with pw.connect(cluster.address, priority=9) as high:
                mesh = high.mesh((4,), ("d",), preempt=True)  # every device of the island
                status = high.cluster_status()["resources"]
                assert len(status["suspended"]) == 1 and len(status["slices"]) == 1
                f = pw.shard_map(lambda v: pw.psum(v, "d"), mesh, P(), P())
                assert f(high.put(np.ones(()), mesh, P())).result(timeout=30) == 4.0
            assert victim.stdout.readline().startswith("suspended: slice")
            victim.stdin.write("go\n")
            victim.stdin.flush()
            assert victim.stdout.readline().startswith("resumed and correct"), \
                victim.communicate(timeout=30)
            assert victim.wait(timeout=30) == 0
        finally:
            victim.kill()
            victim.wait(timeout=30)


DYING_VICTIM = """
import os, sys, threading
import numpy as np
import pathways as pw
from pathways import P, protocol

client = pw.connect(sys.argv[1], priority=0)
send = client.session.request


def request(address, msg, *args, **kwargs):  # SIGKILLed just after it asks to suspend
    sent = send(address, msg, *args, **kwargs)
    if isinstance(msg, protocol.Suspend):
        threading.Timer(float(sys.argv[2]), os.kill, (os.getpid(), 9)).start()
    return sent


client.session.request = request
mesh = client.mesh((4,), ("d",))
step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"), cost=0.02)
x = client.put(np.zeros(8), mesh, P("d"))
print("training", flush=True)
try:
    while True:
        x = step(x)
        x.block_until_ready(timeout=60)
except pw.SliceSuspended:
    threading.Event().wait(60)  # the suspension goes on, on its thread, until the kill
"""


@pytest.mark.parametrize("after", [0.0, 0.05])
def test_a_client_killed_while_it_is_preempted_has_its_arrays_freed(tmp_path, after):
    """Free last, for clients too (issue 45): a victim SIGKILLed while it suspends for a
    preemption (its arrays saved, its Suspend sent, not yet answered or just answered) has
    every buffer freed within its client timeout plus a bounded margin."""
    import subprocess
    import sys
    import time

    script = tmp_path / "victim.py"
    script.write_text(DYING_VICTIM)
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                          client_timeout=2.0) as cluster:
        victim = subprocess.Popen([sys.executable, str(script), cluster.address, str(after)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert victim.stdout.readline().strip() == "training"
            with pw.connect(cluster.address, priority=9) as high:
                high.mesh((4,), ("d",), preempt=True)  # the victim suspends, and dies
                assert victim.wait(timeout=60) == -9
                deadline = time.monotonic() + 2.0 + 20.0
                while True:
                    stores = [s["store"] for s in high.host_status(timeout=30).values()]
                    held = sum(n for s in stores for n in s["entries"].values())
                    if held == 0 and all(b == 0 for s in stores for b in s["bytes"].values()):
                        break
                    assert time.monotonic() < deadline, f"the victim's buffers stay: {stores}"
                    time.sleep(0.1)
        finally:
            victim.kill()
            victim.wait(timeout=30)
