"""Soak: several clients keep running programs while hosts are killed and new ones join.
Every future ends, in bounded time, with the right value or a clear Pathways error; the
stores of the hosts left hold nothing once the clients are gone.

Short by default (CI); ``PATHWAYS_SOAK_SECONDS=300 pytest tests/e2e/test_soak.py`` for the long
form."""

import os
import random
import signal
import threading
import time

import numpy as np
import pytest
from conftest import wait_until

import pathways as pw
from pathways import P

SECONDS = float(os.environ.get("PATHWAYS_SOAK_SECONDS", "15"))
WAIT = 30.0  # no future may take longer than this to end, whatever happens


def client_loop(address, seed, stop, tally, problems):
    try:
        run_client(address, seed, stop, tally, problems)
    except BaseException as exc:  # a client that dies is a finding, not a silent pass
        problems.append(f"client {seed} died: {exc!r}")


def run_client(address, seed, stop, tally, problems):
    rng = random.Random(seed)
    with pw.connect(address) as c:
        while not stop.is_set():
            try:
                # packed on one host, or across two: a psum whose peer's host dies
                mesh = c.mesh((2,), ("d",), hosts=rng.choice([None, 2]))
                step = pw.shard_map(lambda v: pw.psum(v, "d") * 0.5 + 1.0, mesh, P("d"),
                                    P("d"), cost=rng.choice([0.0, 0.005, 0.02]))

                @pw.program
                def chain(v, step=step):
                    for _ in range(3):
                        v = step(v)
                    return v

                x0 = np.full(4, float(rng.randint(0, 9)))
                want = pw.reference(chain)(x0)
                outs = [chain(c.put(x0, mesh, P("d"))) for _ in range(rng.randint(1, 4))]
            except pw.PathwaysError as exc:  # e.g. no live devices for a slice just now
                tally["refused"] += 1
                tally["errors"].add(type(exc).__name__)
                time.sleep(0.05)
                continue
            for y in outs:
                try:
                    got = y.result(timeout=WAIT)
                except pw.PathwaysError as exc:
                    tally["failed"] += 1
                    tally["errors"].add(type(exc).__name__)
                except Exception as exc:  # a hang (TimeoutError) or anything unclear
                    problems.append(repr(exc))
                else:
                    if np.allclose(got, want):
                        tally["ok"] += 1
                    else:
                        problems.append(f"wrong value {got} != {want}")


@pytest.mark.timeout(SECONDS + 150)
def test_soak_with_host_kills_and_restarts():
    with pw.local_cluster(islands=1, hosts_per_island=3, devices_per_host=2,
                          heartbeat_timeout=1.5, client_timeout=3.0) as cluster:
        stop = threading.Event()
        tallies = [{"ok": 0, "failed": 0, "refused": 0, "errors": set()} for _ in range(3)]
        problems: list = []
        threads = [threading.Thread(target=client_loop,
                                    args=(cluster.address, i, stop, tallies[i], problems))
                   for i in range(3)]
        for t in threads:
            t.start()
        rng = random.Random(0)
        deadline = time.monotonic() + SECONDS
        try:
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(1.5, 3.0))
                hosts = [p for p in cluster.processes[1:] if p.poll() is None]
                if len(hosts) > 1:
                    rng.choice(hosts).send_signal(signal.SIGKILL)
                time.sleep(rng.uniform(0.5, 1.5))
                cluster.add_host(0, 2)
        finally:
            stop.set()
            for t in threads:
                t.join(WAIT * 2)
        assert not any(t.is_alive() for t in threads), "a client hung"
        assert not problems, problems[:5]
        total = {k: sum(t[k] for t in tallies) for k in ("ok", "failed", "refused")}
        assert total["ok"] > 0, total
        errors = set().union(*(t["errors"] for t in tallies))
        assert errors <= {"HostLost", "RemoteError", "PathwaysError", "ResourceError",
                          "CollectiveTimeout", "ProgramError"}, errors
        with pw.connect(cluster.address) as probe:
            # membership followed the kills and restarts: exactly the live hosts are listed
            live = {p.pid for p in cluster.processes[1:] if p.poll() is None}
            wait_until(lambda: {h["pid"] for h in probe.cluster_status()["hosts"].values()}
                       == live, 15, interval=0.1)
            # the hosts left hold nothing once every client is gone
            wait_until(lambda: sum(sum(s["store"]["bytes"].values())
                                   for s in probe.host_status().values()) == 0,
                       15, interval=0.1)
