"""Shared fixtures: clusters that are always torn down, on each transport."""

import os
import threading
import time
from pathlib import Path

import pytest

import plaque

ROOT = Path(__file__).resolve().parent.parent  # the repository

# Plain JAX, the reference of the JAX body tests, runs jax.shard_map on 8 CPU devices of this
# process; the flag must be set before jax is first imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()


@pytest.fixture(params=["inproc", "tcp"])
def cluster(request):
    """A 2-worker cluster on the in-process transport and on real processes over tcp."""
    with plaque.local_cluster(workers=2, transport=request.param) as c:
        yield c


@pytest.fixture
def tcp_cluster3():
    with plaque.local_cluster(workers=3, transport="tcp", heartbeat_timeout=2.0) as c:
        yield c


@pytest.fixture
def threads():
    """Start helper threads (``threads(target, *args)``) that are always joined."""
    started: list[threading.Thread] = []

    def start(target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        started.append(thread)
        thread.start()
        return thread

    start.started = started
    yield start
    for thread in started:
        thread.join(10)
        assert not thread.is_alive()


# the session's twin cluster, its process twin and a client of it: pathways.testing's fixtures
from pathways.testing.fixtures import client, pw_cluster, pw_process_cluster  # noqa: E402,F401


@pytest.fixture(scope="module")
def one_host():
    """A client of one host of 8 devices (a twin, per test module): every mesh of it is one
    box, so a JAX body whose collectives stay on it runs as one computation for all 8."""
    import pathways as pw

    with pw.local_cluster(hosts_per_island=1, devices_per_host=8, processes=False) as c, \
            pw.connect(c.address) as one:
        yield one


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    import importlib.util
    import sys

    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def procs():
    """Processes a test starts (append them): always stopped when it ends, even on failure."""
    from pathways.cluster import stop_processes

    started = []
    yield started
    stop_processes(started, grace=10.0)


def coordinator_only(devices: int, coordinator_timeout: float, procs: list):
    """A ``LocalCluster`` of its coordinator alone, and one ``pathways host`` of ``devices``
    started by hand to join it (listening next to it, stopped with ``procs``) with
    ``--coordinator-timeout``, which local clusters leave at its default (10 s); ready."""
    import subprocess
    import sys

    from pathways.cluster import LocalCluster

    cluster = LocalCluster(islands=1, hosts_per_island=1, devices_per_host=devices,
                           hosts=False)
    try:
        host = subprocess.Popen([sys.executable, "-m", "pathways", "host", "--coordinator",
                                 cluster.address, "--devices", str(devices),
                                 "--coordinator-timeout", str(coordinator_timeout)])
        procs.append(host)
        cluster.wait_ready(devices)
    except BaseException:
        cluster.close()
        raise
    return cluster, host


def read_until(proc, needle: str, timeout: float = 60.0) -> list[str]:
    """Lines of ``proc``'s text stdout up to the one containing ``needle``; fails, never
    hangs, if that line does not come within ``timeout`` (a reader thread does the waiting)."""
    import queue

    lines = getattr(proc, "_test_lines", None)
    if lines is None:
        lines = proc._test_lines = queue.Queue()

        def pump():
            try:
                for line in proc.stdout:
                    lines.put(line)
            except (OSError, ValueError):  # the test closed the pipe: its output is over
                pass
            lines.put(None)  # end of output

        threading.Thread(target=pump, daemon=True).start()
    seen, deadline = [], time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            raise AssertionError(f"{needle!r} not seen; output so far:\n{''.join(seen)}")
        seen.append(line)
        if needle in line:
            return seen


def listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# ---- what the hosts' object stores hold, asked of the hosts themselves ------------------

from pathways.testing import (  # noqa: E402,F401
    host_stats,
    store_bytes,
    wait_for_store_bytes,
    wait_until,
)


class CloseBeforePosting:
    """An event loop as it is, except that the first job the asking thread (the one that
    made this) posts is held back while ``close()`` runs on another thread, until the close
    is over or ``hold`` seconds have passed (a close that waits for this post to be queued
    never ends by itself; one that does not wait ends well within them): the
    interleaving where a request found its cluster or client open and the close came
    before the request's job was posted. Put it where the closed object keeps
    its loop; ``joined()`` waits for the close."""

    def __init__(self, loop, close, hold: float = 2.0):
        # private names: anything else is the loop's (its own close() included)
        self._loop, self._closing, self._hold = loop, close, hold
        self.asker = threading.current_thread()
        self.closer: threading.Thread | None = None

    def call_soon_threadsafe(self, callback, *args):
        if self.closer is None and threading.current_thread() is self.asker:
            self.closer = threading.Thread(target=self._closing)
            self.closer.start()
            self.closer.join(self._hold)
        return self._loop.call_soon_threadsafe(callback, *args)

    def joined(self) -> bool:
        """Whether the close was run and has finished (waits up to 30 s for it)."""
        if self.closer is None:
            return False
        self.closer.join(30)
        return not self.closer.is_alive()

    def __getattr__(self, name):
        return getattr(self._loop, name)
