"""py-spy profiles of running cluster processes, summarised for a benchmark's report.

``record`` attaches py-spy (samples holding the GIL only, so idle waiting does not count) to
every given process, keeps the workload busy meanwhile, and returns the frames most often on
the sampled stacks, per process. ``cpu_seconds`` reads a process's CPU time from /proc;
``charged_cpu`` is its counterpart for the roles of a simulated cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

SKIP = ("_bootstrap", "Thread.run", "run (", "_run_module", "_run_code", "<module>",
        "main (", "_host (", "Runner.run", "_serve", "run_forever", "_run_once")


def record(processes: list[tuple[str, int]], workload, seconds: float, label: str) -> list[str]:
    """Profile ``(role, pid)`` processes while ``workload()`` is called back to back."""
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    report = []
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as out:
        paths = [os.path.join(out, f"{pid}.txt") for _, pid in processes]
        spies = [subprocess.Popen([py_spy, "record", "--pid", str(pid), "--gil", "--duration",
                                   str(int(seconds)), "--rate", "200", "--format", "raw",
                                   "-o", path],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for (_, pid), path in zip(processes, paths)]
        try:
            time.sleep(1.0)  # let py-spy attach
            deadline = time.monotonic() + seconds - 1.5
            while time.monotonic() < deadline:
                workload()
        finally:
            for spy in spies:
                try:
                    spy.wait(seconds + 30)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait(5)
        for (role, pid), path in zip(processes, paths):
            report.append(f"-- {label}: {role} (pid {pid}) --")
            report.extend(top_frames(path))
    return report


def cluster_processes(cluster) -> list[tuple[str, int]]:
    """(role, pid) of a local Pathways cluster: the coordinator first, then the hosts."""
    return [("coordinator" if i == 0 else f"host {i - 1}", p.pid)
            for i, p in enumerate(cluster.processes)]


def top_frames(path: str, n: int = 12) -> list[str]:
    """The frames most often on the GIL-holding stack (inclusive), from py-spy's raw output."""
    total, incl, own = 0, Counter(), Counter()
    try:
        with open(path) as f:
            for line in f:
                stack, _, count = line.rstrip().rpartition(" ")
                frames, k = stack.split(";"), int(count)
                total += k
                own[frames[-1]] += k
                for frame in set(frames):
                    incl[frame] += k
    except (OSError, ValueError):
        return ["   (no samples)"]
    if not total:
        return ["   (no samples)"]
    lines = [f"   {total} samples holding the GIL; top inclusive:"]
    shown = [(f, k) for f, k in incl.most_common() if not any(s in f for s in SKIP)][:n]
    lines += [f"   {k / total:6.1%}  {frame}" for frame, k in shown]
    lines.append("   top self:")
    lines += [f"   {k / total:6.1%}  {frame}" for frame, k in own.most_common(6)]
    return lines


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process so far: its threads' nanosecond run times (Linux
    /proc/<pid>/task/*/schedstat), else user + system ticks from /proc/<pid>/stat; 0 where
    neither is available."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                continue  # a thread that just ended (long-lived threads do the work here)
        return total / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def charged_cpu(cluster) -> dict[str, float]:
    """The simulated ``cluster``'s counterpart of ``cpu_seconds``: CPU seconds charged so far
    to each of its roles, by name, and to the user's thread as "user"."""
    return {"user": cluster.user.used, **{n: r.cpu_used for n, r in cluster.roles.items()}}


def client_coordinator_hosts(used: dict[str, float]) -> tuple[float, float, float]:
    """``charged_cpu`` figures (or differences of them) grouped: (client: the user's thread
    and the client roles, the coordinator, the hosts summed)."""
    client = used["user"] + sum(v for n, v in used.items() if n.startswith("client-"))
    hosts = sum(v for n, v in used.items() if n.startswith("host-"))
    return client, used["coordinator"], hosts
