"""The live dashboard end to end, in a real browser: how soon its page shows a cluster that
``pathways up --dashboard`` starts, and how often the page is updated while a workload runs,
up to 2,048 devices.

For each size (``--sizes``: islands of one, H hosts x D devices per host; default 2x4 and
32x64 = 2,048 devices, all host processes on this machine) it:

1. opens a blank page in headless Chromium (Debian's, under Selenium), so the browser's own
   start is not counted;
2. launches ``python -m pathways up --dashboard --hosts-per-island H --devices-per-host D``
   and times, from the launch: the dashboard's URL being printed (it starts as soon as the
   coordinator is up, while the hosts start), the page visible (loaded, its first snapshot
   fetched and drawn) and the page showing every device (all hosts joined);
3. connects a client and runs a workload on every device (a chain of ``x + 1`` steps over a
   ``P("d")``-sharded vector, results checked) for ``--seconds``, while counting the updates
   the page received (the page's ``pushed``) over that time: updates per second as the
   browser sees them, at the dashboard's default 4 Hz. It also reads, from the page, the
   dashboard's time to gather each snapshot (``gather_seconds``: the coordinator's status,
   each host's status and timeline) and the page's own time per update (parse and redraw),
   median over the window;
4. stops ``pathways up`` (SIGINT) and checks it exits cleanly.

Targets (issue 34): page visible within 1 s of ``pathways up --dashboard``, updates at
>= 2 Hz, and >= 1 Hz at 2,048 devices. The machine's 2 cores run every host process, the
coordinator, the dashboard, the workload's client and Chromium at once.

Run: ``python -m bench.dashboard_live [--quick] [--sizes 2x4,32x64] [--seconds 10]``.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

import pathways as pw
from pathways import P

from .browser import chromium
from .results import bench_parser, publish

VISIBLE_S, UPDATES_HZ, BIG_HZ = 1.0, 2.0, 1.0  # the targets


def read_line(proc, prefix: str, timeout: float) -> str:
    """The first line of ``proc``'s output that has ``prefix``; its output so far if none
    came within ``timeout`` (read on a thread: a silent process cannot hang the bench)."""
    got, lines = [], []

    def reader():
        for line in proc.stdout:
            lines.append(line)
            if prefix in line:
                got.append(line)
                return
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if not got:
        raise RuntimeError(f"no {prefix!r} within {timeout:.0f} s; output: {''.join(lines)}")
    return got[0]


def workload(address: str, stop: threading.Event, done: list) -> None:
    """Chains of ``x + 1`` over every device until ``stop``; each chain's result checked."""
    with pw.connect(address) as client:
        n = len(client.devices())
        mesh = client.mesh((n,), ("d",))
        step = pw.shard_map(lambda v: v + 1.0, mesh, in_specs=P("d"), out_specs=P("d"),
                            cost=0.002)
        x = client.put(np.zeros(n), mesh, P("d"))
        steps = 0
        while not stop.is_set():
            for _ in range(5):
                x = step(x)
            steps += 5
            got = x.result(timeout=120)
            if not np.array_equal(got, np.full(n, float(steps))):
                raise AssertionError(f"after {steps} steps the workload read {got[:4]} ...")
        done.append(steps)


def measure(driver, hosts: int, per_host: int, seconds: float) -> dict:
    devices = hosts * per_host
    driver.get("about:blank")
    launched = time.monotonic()
    up = subprocess.Popen([sys.executable, "-m", "pathways", "up", "--dashboard",
                           "--hosts-per-island", str(hosts), "--devices-per-host",
                           str(per_host)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    stop, done, worker = threading.Event(), [], None
    try:
        url = read_line(up, "dashboard: open", 120).split("open ", 1)[1].strip()
        printed = time.monotonic()
        driver.get(url)
        while not driver.execute_script("return snap !== null && !snap.error"):
            if time.monotonic() - printed > 60:
                raise RuntimeError("the page showed no snapshot within 60 s")
            time.sleep(0.005)
        visible = time.monotonic()
        while driver.execute_script(  # the page's devices (its table lists 256 at most)
                "return snap.devices.filter(d => d.live).length") < devices:
            if time.monotonic() - printed > 600:
                raise RuntimeError("the page did not show every device within 600 s")
            time.sleep(0.01)
        every = time.monotonic()
        address = read_line(up, "pathways cluster up at", 600).split(" at ", 1)[1].split()[0]
        # the printed address carries the cluster's keys (?keys=DIR)
        worker = threading.Thread(target=workload, args=(address, stop, done))
        worker.start()
        time.sleep(min(5.0, seconds / 2))  # the workload's program installed and running
        p0, t0 = driver.execute_script("return pushed"), time.monotonic()
        time.sleep(seconds)
        p1, t1 = driver.execute_script("return pushed"), time.monotonic()
        gather = driver.execute_script("return snap.gather_seconds")
        drawn = driver.execute_script("return drawn.slice()")
        kernels = driver.execute_script(
            "return Object.values(snap.kernels).reduce((n, ks) => n + ks.length, 0)")
        busy = driver.execute_script(
            "return snap.devices.reduce((s, d) => s + d.busy, 0) / snap.devices.length")
        stop.set()
        worker.join(300)
        hz = (p1 - p0) / (t1 - t0)
        target = BIG_HZ if devices >= 2048 else UPDATES_HZ
        return {"Devices": devices, "Hosts": hosts,
                "Launch to URL s": f"{printed - launched:.2f}",
                "Launch to page visible s": f"{visible - launched:.2f}",
                "Visible <= 1 s": "met" if visible - launched <= VISIBLE_S else "MISSED",
                "Launch to every device shown s": f"{every - launched:.2f}",
                "Updates/s in the browser": f"{hz:.2f}",
                f"Target >= {target:g} Hz": "met" if hz >= target else "MISSED",
                "Gather ms (last)": f"{gather * 1e3:.0f}",
                "Page ms per update (median)": f"{statistics.median(drawn):.0f}",
                "Kernels in window": kernels, "Mean busy": f"{busy * 100:.0f}%",
                "Workload steps": done[0] if done else "failed"}
    finally:
        stop.set()
        if worker is not None:
            worker.join(300)
        up.send_signal(signal.SIGINT)
        try:
            code = up.wait(120)
        except subprocess.TimeoutExpired:
            up.kill()
            code = up.wait()
        if code != 0:
            print(f"pathways up exited with {code}", file=sys.stderr)


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "2x4 only, 5 s")
    ap.sized("--sizes", str, "2x4", "2x4,32x64", "HxD sizes: hosts x devices per host")
    ap.sized("--seconds", float, 5.0, 10.0, "seconds of workload over which updates count")
    args = ap.parse_args(argv)
    rows = []
    with chromium() as driver:
        for size in args.sizes.split(","):
            hosts, per_host = (int(v) for v in size.split("x"))
            rows.append(measure(driver, hosts, per_host, args.seconds))
            print(rows[-1], flush=True)
    notes = ("`pathways up --dashboard` launched per size, with a headless Chromium (Debian's,"
             " Selenium) already open on a blank page, which opens the URL as soon as it is"
             " printed. Times from the launch: URL printed (coordinator up, dashboard"
             " serving), page visible (first snapshot drawn), every device shown (all hosts"
             " joined). Updates/s: the page's own count of pushed updates over the"
             " workload's window, at the dashboard's default 4 Hz. Gather: the dashboard's"
             " time for one snapshot (coordinator status, each host's status and timeline);"
             " page ms: parse and redraw per update, timed in the page. Every process"
             " (hosts, coordinator, dashboard, the workload's client, Chromium) shares the"
             " machine's cores.")
    publish("Dashboard live: page visible and update rate", rows, notes,
            append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
