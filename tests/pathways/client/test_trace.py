"""Traces of real runs: Chrome trace JSON with a row per device, kernels in the scheduler's
order and never overlapping on a device, transfers as their own rows; the PNG plot; the
trace, plot and status commands."""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.client.trace import TRANSFER_TID, kernels


@pytest.fixture(scope="module")
def traced(pw_cluster, tmp_path_factory):
    """Two clients' programs, with a transfer between slices, traced into a file."""
    path = tmp_path_factory.mktemp("trace") / "run.json"
    with pw.connect(pw_cluster.address) as a, pw.connect(pw_cluster.address) as b:
        ma, mb = a.mesh((2, 2), ("x", "y")), a.mesh((4,), ("z",))
        step = pw.shard_map(lambda v: pw.psum(v, "x") * 0.5, ma, P("x"), P("x"), cost=0.002)
        other = pw.shard_map(lambda v: v + 1.0, mb, P("z"), P("z"), cost=0.001)

        @pw.program
        def prog(v):
            for _ in range(3):
                v = step(v)
            return other(v)  # moves from slice a to slice b: a transfer

        m2 = b.mesh((4,), ("z",))
        inc = pw.shard_map(lambda v: v * 2.0, m2, P("z"), P("z"), cost=0.001)
        xa, xb = a.put(np.ones((8, 4)), ma, P("x")), b.put(np.ones(8), m2, P("z"))
        with a.trace(path) as tr:
            outs = [prog(xa) for _ in range(3)] + [inc(xb) for _ in range(5)]
            for o in outs:
                o.result(timeout=60)
        devices = {d.id: d for d in a.devices()}
        return path, tr.trace, devices, (a.id, b.id), (ma.ids, mb.ids, m2.ids)


def test_trace_file_is_chrome_json_with_a_row_per_device_grouped_by_host(traced):
    path, trace, devices, _, meshes = traced
    assert json.loads(path.read_text()) == trace
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    for d, info in devices.items():
        assert names[(info.host, d)] == f"device {d}"
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    assert all(procs[d.host] == f"island {d.island} / host {d.host}" for d in devices.values())
    used = set(meshes[0]) | set(meshes[1]) | set(meshes[2])
    assert {d for (_, d) in kernels(trace)} == used


def test_kernels_follow_the_scheduler_order_and_never_overlap(traced):
    _, trace, _, clients, _ = traced
    per_device = kernels(trace)
    assert sum(len(k) for k in per_device.values()) > 0
    seen = set()
    for evs in per_device.values():
        seqs = [e["args"]["seq"] for e in evs]
        assert seqs == sorted(seqs)  # run in sequence-number order
        for a, b in zip(evs, evs[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1.0  # µs; one kernel at a time
        seen |= {e["args"]["client"] for e in evs}
        assert all(e["dur"] > 0 and not e["args"]["failed"] for e in evs)
    assert seen == set(clients)


def test_transfers_appear_on_the_receiving_devices_rows(traced):
    _, trace, _, clients, meshes = traced
    moved = [e for e in trace["traceEvents"] if e.get("cat") == "transfer"]
    assert moved and all(e["tid"] - TRANSFER_TID in meshes[1] for e in moved)
    assert all(e["args"]["bytes"] > 0 and e["args"]["client"] == clients[0] for e in moved)


def test_plot_renders_a_png_with_utilization(traced, tmp_path):
    from pathways.plot import plot

    png = tmp_path / "timeline.png"
    util = plot(str(traced[0]), str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(util) == len(kernels(traced[1]))
    # busy fractions: a device's kernels never overlap, so none is above 1 — but a device busy
    # back to back sums microsecond floats to 1.0000000000000002 (seen twice), hence the ulp
    bad = {row: u for row, u in util.items() if not 0 < u <= 1 + 1e-12}
    assert not bad, (bad, {k: [(e["ts"], e["dur"]) for e in v]
                           for k, v in kernels(traced[1]).items()})


def test_trace_plot_and_status_commands(pw_process_cluster, tmp_path, threads):
    pw_cluster = pw_process_cluster  # the commands connect from processes of their own
    out, png = tmp_path / "cli.json", tmp_path / "cli.png"
    stop, errors = threading.Event(), []

    def work():
        try:
            with pw.connect(pw_cluster.address) as c:
                m = c.mesh((2,), ("d",))
                f = pw.shard_map(lambda v: v + 1.0, m, P("d"), P("d"), cost=0.002)
                x = c.put(np.zeros(4), m, P("d"))
                while not stop.is_set():
                    x = f(x)
                    x.result(timeout=30)
        except Exception as exc:  # reported below
            errors.append(exc)

    t = threads(work)
    try:
        res = subprocess.run([sys.executable, "-m", "pathways", "trace", pw_cluster.address,
                              "--seconds", "1", "-o", str(out)], capture_output=True,
                             text=True, timeout=60, check=True)
        status = subprocess.run([sys.executable, "-m", "pathways", "status",
                                 pw_cluster.address], capture_output=True, text=True,
                                timeout=60, check=True).stdout
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert res.stdout.startswith("recording every device's timeline for 1 s")  # at once
    assert "wrote" in res.stdout and kernels(json.loads(out.read_text()))
    assert "weight 1, priority 0" in status and status.count("busy") == 8
    res = subprocess.run([sys.executable, "-m", "pathways", "plot", str(out), "-o", str(png)],
                         capture_output=True, text=True, timeout=60, check=True)
    assert png.exists() and "busy" in res.stdout and res.stdout.startswith("drawing")


def test_device_time_by_client_counts_only_while_everyone_ran():
    from pathways.client.trace import client_spans, device_time_by_client

    # device 0: a runs 0-2, b runs 2-3, a runs 3-4, b runs 4-10; device 1: a runs 1-2
    timeline = {0: [(0, "k", {"client": "a"}, 0.0, 2.0, False),
                    (1, "k", {"client": "b"}, 2.0, 3.0, False),
                    (2, "k", {"client": "a"}, 3.0, 4.0, False),
                    (3, "k", {"client": "b"}, 4.0, 10.0, False)],
                1: [(0, "k", {"client": "a"}, 1.0, 2.0, False),
                    (1, "k", {"client": "z"}, 0.0, 9.0, False)]}  # not asked about
    assert client_spans(timeline, ["a", "b"]) == {"a": (0.0, 4.0), "b": (2.0, 10.0)}
    busy, seconds = device_time_by_client(timeline, ["a", "b"])
    assert seconds == 2.0 and busy == {"a": 1.0, "b": 1.0}  # the interval [2, 4]


def test_device_time_by_client_when_a_client_ran_nothing_is_an_empty_interval():
    from pathways.client.trace import device_time_by_client

    one = {0: [(0, 0, {"client": 1}, 0.0, 1.0, False)]}
    assert device_time_by_client({}, [1, 2]) == ({1: 0.0, 2: 0.0}, 0.0)
    assert device_time_by_client(one, [1, 2]) == ({1: 0.0, 2: 0.0}, 0.0)
    both = {0: [*one[0], (1, 0, {"client": 2}, 0.5, 2.0, False)]}
    assert device_time_by_client(both, [1, 2]) == ({1: 0.5, 2: 0.5}, 0.5)
