"""Soak of the data-moving calls: 3 clients with 2 threads each on 2 hosts x 2 devices mix
computing, deleting, saving and loading checkpoints, and suspending and resuming their slice.
Every value read is checked; every call ends within WAIT with its value or an error the
user caused (a call on a slice another thread suspended: ``SliceSuspended``).

This found hangs (issue 27, item 7): a host's data service dropped a request it could not
serve -- a read or a checkpoint write of an array another thread had just deleted -- without
answering, so the caller waited for ever; and a suspension failed when another thread deleted
one of the slice's arrays while it was being written.

Short by default (CI); ``PATHWAYS_SOAK_SECONDS=150 pytest tests/e2e/test_soak_mixed.py`` for
the long form."""

import os
import random
import threading
import time

import numpy as np
import pytest

import pathways as pw
from pathways import P

SECONDS = float(os.environ.get("PATHWAYS_SOAK_SECONDS", "12"))
WAIT = 60.0  # no call may take longer than this to end, whatever the others do
OPS = ("sum", "sum", "delete", "save_load", "suspend")


def worker(c, box, step, seed, stop, directory, tally, problems):
    """One thread's loop of random operations on its client's slice (``box["mesh"]``)."""
    rng = random.Random(seed)
    live: list = []  # (array, the value it must hold)
    n = 0
    while not stop.is_set():
        op, n = rng.choice(OPS), n + 1
        try:
            ok = run_op(c, box, step, op, rng, live, os.path.join(directory, f"{seed}-{n}"))
        except pw.SliceSuspended:  # another thread of this client suspended the slice
            time.sleep(0.02)
            continue
        except pw.PathwaysError as exc:
            if "already suspended" in str(exc) or "is not suspended" in str(exc):
                continue  # two threads suspending or resuming the one slice at once
            problems.append(f"{op}: {type(exc).__name__}: {exc}")
            continue
        except Exception as exc:  # a hang (TimeoutError) or anything unclear
            problems.append(f"{op}: {type(exc).__name__}: {exc}")
            continue
        tally[op] = tally.get(op, 0) + 1
        if not ok:
            problems.append(f"{op}: a wrong value")


def run_op(c, box, step, op, rng, live, path) -> bool:
    mesh = box["mesh"]
    if op == "sum":
        x0 = np.arange(8.0) + rng.randint(0, 9)
        x = c.put(x0, mesh, P("d"))
        live.append((x, x0))
        return np.allclose(step(x).result(timeout=WAIT), pw.reference(step)(x0))
    if op == "delete":
        if live:
            live.pop(rng.randrange(len(live)))[0].delete()
        return True
    if op == "save_load":
        x0 = np.arange(8.0) * rng.randint(1, 9)
        x = c.put(x0, mesh, P("d"))
        c.save(path, {"x": x}).result(timeout=WAIT)
        x.delete()
        return np.array_equal(c.load(path, mesh)["x"].result(timeout=WAIT), x0)
    c.suspend(mesh, timeout=WAIT)
    box["mesh"] = c.resume(mesh, timeout=WAIT)
    return all(np.array_equal(a.result(timeout=WAIT), v) for a, v in live)


def client_loop(address, seed, stop, directory, tally, problems):
    try:
        with pw.connect(address) as c:
            # a (4,) mesh is both hosts; a (2,) one is packed on one host, or across both
            mesh = c.mesh((4,) if seed % 2 == 0 else (2,), ("d",), hosts=2 if seed % 3 else None)
            step = pw.shard_map(lambda v: pw.psum(v, "d") * 0.5 + 1.0, mesh, P("d"), P("d"),
                                cost=0.002)
            box = {"mesh": mesh}
            threads = [threading.Thread(target=worker, args=(
                c, box, step, seed * 10 + k, stop, directory, tally, problems))
                for k in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(SECONDS + 4 * WAIT)
                if t.is_alive():
                    problems.append(f"a thread of client {seed} hung")
    except BaseException as exc:  # a client that dies is a finding, not a silent pass
        problems.append(f"client {seed} died: {exc!r}")


@pytest.mark.timeout(SECONDS + 6 * WAIT)
def test_soak_of_compute_delete_checkpoints_and_suspension(tmp_path):
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2) as cluster:
        stop = threading.Event()
        tallies = [{} for _ in range(3)]
        problems: list = []
        threads = [threading.Thread(target=client_loop, args=(
            cluster.address, i, stop, str(tmp_path), tallies[i], problems)) for i in range(3)]
        for t in threads:
            t.start()
        try:
            time.sleep(SECONDS)
        finally:
            stop.set()
            for t in threads:
                t.join(5 * WAIT)
        assert not any(t.is_alive() for t in threads), "a client hung"
        assert not problems, problems[:5]
        done = {op: sum(t.get(op, 0) for t in tallies) for op in set(OPS)}
        assert all(done.values()), done  # every kind of operation ran
