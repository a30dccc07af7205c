"""``pw.local_cluster``: a coordinator and emulated hosts as subprocesses, always torn down."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from plaque import security
from plaque.cluster import worker_env

from .client.client import Client
from .errors import PathwaysError
from .program.cost import BACKENDS
from .twin import Twin

# what ``pathways simulate`` runs a script with: every local_cluster it starts is simulated,
# with these options of pathways.simulated.SimCluster (None: as asked)
simulation_defaults: dict | None = None

# PYTHONHASHSEED of every host, unless the caller set one: a fixed value, so a host started by
# hand (``pathways host`` re-execs itself with it) hashes text as the cluster's hosts do
HASH_SEED = "0"

LOOPBACK = "tcp://127.0.0.1"  # a local cluster's bind unless told otherwise

# the pid of the process that started a coordinator or host of a local cluster, in its
# environment: it dies with that process (``pathways.cli``), and at once if that process died
# before it could ask to (Linux sends the signal only to a child that asked while its parent
# was alive)
PARENT_ENV = "PATHWAYS_PARENT_PID"


class LocalCluster:
    """Processes of a local cluster; ``address`` is what clients connect to.

    Unless given ``keys`` (or ``$PLAQUE_KEYS`` names some), ``bind``, ``port`` or
    ``insecure=True``, its processes listen on ``ipc://`` sockets in a private temporary
    directory, ``socket_dir`` (mode 0700: the kernel refuses another user's connect; no
    CURVE), which ``close`` removes, and ``address`` is the coordinator's socket there
    (``ipc:///tmp/pathways-.../plaque-...``). Given a ``bind`` (``tcp://HOST``) or a ``port``
    instead, it makes a throw-away CURVE key pair in such a directory, ``keys``, and
    ``address`` names it (``tcp://127.0.0.1:PORT?keys=/tmp/pathways-keys-...``). Either way
    ``pw.connect(cluster.address)`` needs nothing else. ``insecure=True``: plain TCP on
    loopback, which any local user can reach. ``pathways slurm`` binds every interface on
    multi-node jobs; ``port``: the coordinator's client port (0: a free one). Subclasses
    start hosts elsewhere (``_start_hosts``) or keep keys elsewhere (``_new_keys``).
    ``processes=False``: the in-process twin (``pathways.twin``) instead of processes.
    ``hosts=False``: start the coordinator only; ``start_hosts()`` starts the hosts (what
    ``pathways up --dashboard`` does once its page is served, so the page shows them join).
    """

    def __init__(self, islands=1, hosts_per_island=2, devices_per_host=4,
                 heartbeat_timeout=3.0, verbose=0, policy="fifo", window=8,
                 client_timeout=5.0, hbm_gib=16.0, keys=None, insecure=False,
                 kernel_limit=30.0, bind=None, port=0, processes=True, hosts=True,
                 backend="emulated"):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        if backend != "emulated" and not processes:
            raise ValueError("backend='jax' runs hosts as processes, each with its own JAX"
                             " devices: not with processes=False")
        self.backend = backend
        if keys is not None and insecure:
            raise ValueError("keys=DIR and insecure=True contradict each other: choose one")
        if keys is not None and not processes:
            raise ValueError("keys=DIR with processes=False: the in-process cluster has no"
                             " socket outside this process, so it takes no keys")
        self.processes: list[subprocess.Popen] = []
        self.twin: Twin | None = None  # the in-process cluster, with processes=False
        self.islands, self.hosts_per_island = islands, hosts_per_island
        self.devices_per_host = devices_per_host
        self._own_keys = None  # the throw-away key directory this cluster made, if any
        self.socket_dir = None  # the private directory of its ipc:// sockets, if it made one
        if processes and keys is None and not insecure and security.keys_dir() is None:
            if bind is None and not port:
                self.socket_dir = security.private_socket_dir("pathways-")
            if self.socket_dir is not None:
                bind = f"ipc://{self.socket_dir}/"
            else:
                keys = self._own_keys = self._new_keys()
        bind = LOOPBACK if bind is None else bind
        env = {**worker_env(keys), "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", HASH_SEED)}
        if insecure:  # asked for in code, or said once by pathways up: not again per process
            env[security.WARNED_ENV] = "1"
        self.keys, self.insecure = keys, insecure
        self._env, self._v, self.hbm_gib = env, ["-v"] * verbose, hbm_gib
        self.kernel_limit, self.bind, self.port = kernel_limit, bind, port
        try:
            if processes:
                self.address = self._start_coordinator(heartbeat_timeout, policy, window,
                                                       client_timeout)
            else:
                self.twin = Twin(heartbeat_timeout, policy, window, client_timeout)
                self.address = self.twin.address
            if hosts:
                self._start_hosts()
        except BaseException:
            self.close()
            raise

    def start_hosts(self) -> None:
        """Start the hosts of a cluster made with ``hosts=False``."""
        self._start_hosts()

    def _new_keys(self) -> str:
        """A throw-away key directory for this cluster (``close`` removes it)."""
        return security.ephemeral("pathways-keys-")

    def _start_hosts(self) -> None:
        for island in range(self.islands):
            for _ in range(self.hosts_per_island):
                self.add_host(island, self.devices_per_host)

    def _start_coordinator(self, heartbeat_timeout, policy, window, client_timeout) -> str:
        """Start the coordinator; its address, naming the key directory if this cluster
        made it."""
        coord = subprocess.Popen(
            [sys.executable, "-m", "pathways", *self._v, "coordinator",
             "--heartbeat-timeout", str(heartbeat_timeout), "--policy", policy,
             "--window", str(window), "--client-timeout", str(client_timeout),
             "--bind", self.bind, "--port", str(self.port), *self._insecure_flag()],
            stdout=subprocess.PIPE, text=True, env=self._child_env())
        self.processes.append(coord)
        address = self._read_address(coord)
        return address if self._own_keys is None else security.with_keys(address,
                                                                          self._own_keys)

    @staticmethod
    def _read_address(proc, timeout=30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise PathwaysError(f"coordinator exited with {proc.wait()} before starting")
            if line.startswith("pathways coordinator at "):  # without the keys it names:
                return security.split_address(line.split()[-1])[0]  # the caller says them
        raise PathwaysError("coordinator did not report its address")

    def add_host(self, island: int, devices: int):
        """Start one more host in ``island``: a process (its ``Popen``), or with
        ``processes=False`` a thread (its ``pathways.twin.ThreadHost``)."""
        if self.twin is not None:
            return self.twin.add_host(island, devices, self.hbm_gib, self.kernel_limit)
        p = subprocess.Popen([*self._host_argv(devices), "--island", str(island)],
                             env=self._child_env())
        self.processes.append(p)
        return p

    def _child_env(self) -> dict:
        """The environment of a process started here: it dies with this one (``PARENT_ENV``;
        hosts started elsewhere, as ``pathways slurm``'s, get ``_env`` without it)."""
        return {**self._env, PARENT_ENV: str(os.getpid())}

    def coordinator_exit(self) -> str | None:
        """How the coordinator process ended ("exited with code 1", "was killed by
        SIGKILL"), or None while it runs (or when there is none: the twin)."""
        code = self.processes[0].poll() if self.twin is None and self.processes else None
        if code is None:
            return None
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def _host_argv(self, devices: int) -> list[str]:
        """``pathways host`` joining this cluster, all but its ``--island``."""
        return [sys.executable, "-m", "pathways", *self._v, "host", "--coordinator",
                self.address, "--devices", str(devices), "--hbm-gib", str(self.hbm_gib),
                "--kernel-limit", str(self.kernel_limit or 0), "--bind", self.bind,
                "--backend", self.backend, *self._insecure_flag()]

    def _insecure_flag(self) -> list[str]:
        """``--insecure`` for the processes it starts, when it was told ``insecure=True``
        (they refuse to listen on plain TCP otherwise; ``$PLAQUE_INSECURE_WARNED`` in their
        environment keeps each from warning again)."""
        return ["--insecure"] if self.insecure else []

    def wait_ready(self, num_devices: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with Client(self.address, keys=self.keys) as c:
            while len(c.devices()) < num_devices:
                if time.monotonic() > deadline:
                    raise PathwaysError(f"only {len(c.devices())} of {num_devices} devices"
                                        f" joined within {timeout:.0f} s")
                if any(p.poll() is not None for p in self.processes) or (
                        self.twin is not None and self.twin.failed()):
                    raise PathwaysError("a cluster process exited while starting")
                time.sleep(0.05)

    def close(self) -> None:
        """Stop every process (or thread), then remove the key directory this cluster made
        (if any)."""
        try:
            if self.twin is not None:
                self.twin.close()
        finally:
            stop_processes(list(reversed(self.processes)))
            for own in (self._own_keys, self.socket_dir):
                if own is not None:
                    security.discard(own)


def hosts_per_island(hosts: int, islands: int) -> int:
    """How many of ``hosts`` each of ``islands`` equal islands gets; ``ValueError`` unless
    both are positive and the hosts split evenly."""
    if hosts < 1 or islands < 1:
        raise ValueError(f"hosts and islands must be positive, got {hosts} and {islands}")
    if hosts % islands:
        raise ValueError(f"{hosts} hosts do not split into {islands} equal islands")
    return hosts // islands


def stop_processes(processes, grace: float = 5.0) -> None:
    """SIGTERM every process still running, wait ``grace`` seconds each, then SIGKILL; close
    their output pipes. Safe to call on processes that already exited."""
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        if p.stdout:
            p.stdout.close()


@contextlib.contextmanager
def local_cluster(islands=1, hosts_per_island=2, devices_per_host=4, heartbeat_timeout=3.0,
                  verbose=0, timeout=60.0, policy="fifo", window=8, client_timeout=5.0,
                  hbm_gib=16.0, keys=None, insecure=False, kernel_limit=30.0,
                  processes=True, simulate=None, seed=None, backend="emulated", **simulation):
    """Start a coordinator and ``islands * hosts_per_island`` host processes on this machine.

    ``policy`` orders the gangs of several clients on each island: "fifo", "share" (device
    time in proportion to ``pw.connect(..., weight=w)``) or "priority" (strict, by
    ``pw.connect(..., priority=p)``); ``window`` bounds the programs admitted at once. A
    client silent for ``client_timeout`` seconds is taken for dead: its buffers are freed and
    its runs dropped. ``hbm_gib``: each emulated device's HBM. ``kernel_limit``: seconds a
    kernel body may run on its host before it is stopped and its call fails with
    ``KernelTimeout`` (None: no limit; ``shard_map(..., limit=)`` overrides it per function).
    ``backend="jax"``: each host's devices are its process's own JAX devices (GPUs or TPUs
    where there are, else ``devices_per_host`` XLA CPU devices), whose kernels take their
    real time; "emulated" (the default): modelled TPUs (``pathways host --backend``).

    By default every socket of the cluster is a Unix socket (``ipc://``) in a private
    temporary directory, removed when the cluster stops: the kernel lets no other user
    connect, and nothing is encrypted (``cluster.address`` is ``ipc:///tmp/pathways-.../
    plaque-...``; ``pw.connect(cluster.address)`` just works, for the same user). ``keys``:
    a directory from ``pathways keys DIR`` to listen on TCP with CURVE instead (also what
    ``$PLAQUE_KEYS`` gives when set), so only holders of the key get anything in; give the
    same ``keys`` to ``pw.connect``. ``insecure=True``: no keys, plain TCP that any local
    user can reach.

    ``processes=False`` starts the same coordinator and hosts as threads of this process
    instead (``pathways.twin``): real messages over in-process transports, no process
    start-up, no TCP, no keys (nothing outside this process can reach it); quick to start,
    for tests and notebooks, but every host shares this process's GIL, so not for measuring.

    ``simulate=True`` starts the same roles as one deterministic simulation in virtual time
    in this process instead (``pathways.simulated``): every role has its own virtual CPU, so
    figures are the modelled cluster's, not this machine's; ``seed`` draws every chance
    (faults), and ``simulation`` takes ``SimCluster``'s options (``cpu``, ``cost``,
    ``latency``, ``bandwidth``, ``faults``, ``record``). ``timeout`` is then virtual seconds,
    and ``cluster.clock()`` reads the virtual time. Under ``pathways simulate`` every cluster
    is simulated unless it asks for ``simulate=False`` or ``processes=False``.

    >>> with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as cluster:
    ...     with pw.connect(cluster.address) as client:
    ...         print(client.devices())
    """
    if simulate is None and simulation_defaults is not None and processes:
        # under ``pathways simulate``: keys mean nothing in a simulation
        simulate, simulation = True, {**simulation_defaults, **simulation}
        keys, insecure = None, False
    if simulate:
        if backend != "emulated":
            raise ValueError("a simulated cluster's devices are modelled: backend='jax' runs"
                             " real hosts")
        if keys is not None or insecure or not processes:
            raise ValueError("a simulated cluster takes no keys, insecure or processes: it has"
                             " no socket outside this process")
        from .simulated import SimCluster

        simulation.setdefault("seed", 0)
        if seed is not None:
            simulation["seed"] = seed
        sim = SimCluster(islands, hosts_per_island, devices_per_host,
                         heartbeat_timeout=heartbeat_timeout, policy=policy, window=window,
                         client_timeout=client_timeout, hbm_gib=hbm_gib, timeout=timeout,
                         kernel_limit=kernel_limit or None, **simulation)
        try:
            yield sim
        finally:
            sim.close()
            if simulation_defaults is not None:  # under pathways simulate: say what it took
                print(f"pathways simulate: {sim.summary()}", file=sys.stderr)
        return
    if simulation or seed is not None:
        given = sorted(simulation) + (["seed"] if seed is not None else [])
        raise TypeError(f"{', '.join(given)}: options of a simulated cluster,"
                        " given without simulate=True")
    cluster = LocalCluster(islands, hosts_per_island, devices_per_host, heartbeat_timeout,
                           verbose, policy, window, client_timeout, hbm_gib, keys, insecure,
                           kernel_limit, processes=processes, backend=backend)
    try:
        cluster.wait_ready(islands * hosts_per_island * devices_per_host, timeout)
        yield cluster
    finally:
        cluster.close()
