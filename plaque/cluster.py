"""The driver's side: a coordinator on a background event loop, and local clusters.

``Cluster`` runs the coordinator in a thread of the calling process; workers join it at
``cluster.address`` (started by ``local_cluster`` as subprocesses, or by hand with
``plaque worker --join ADDRESS``). Its methods are ordinary blocking calls or return
``concurrent.futures.Future`` objects.

>>> with plaque.local_cluster(workers=2) as cluster:
...     graph = cluster.install(g)
...     result = graph.run(arg=10).result(timeout=10)
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import secrets
import subprocess
import sys
import threading
import time

from . import leftovers, security
from .coordinator import CoordinatorCore, RunResult
from .endpoint import Endpoint
from .errors import ClusterClosed, PlaqueError
from .events import CountersReceived, Installed, Membership, RunDone, RunFailed, RunSettled
from .graph import Graph
from .runtime import LoopThread
from .staging import StagedRun, sink_nodes
from .streams import MAX_IN_FLIGHT, Stream
from .worker import WorkerCore

log = logging.getLogger("plaque.cluster")

__all__ = ["Cluster", "InstalledGraph", "RunResult", "local_cluster"]


class InstalledGraph:
    """A graph installed on a cluster; run it as many times as you like, runs may overlap."""

    def __init__(self, cluster: Cluster, gid: int, graph: Graph):
        self.cluster, self.gid, self.graph = cluster, gid, graph
        self._swept = False  # whether a run cleared what dead drivers left by its targets

    def run(self, arg=None, parts=None) -> cf.Future:
        """Start a run; the future gives a ``RunResult`` or raises the run's error.

        ``arg`` reaches every shard (``ctx.arg``); ``parts`` is the run's partitioned input,
        ``{node name: [part of shard 0, part of shard 1, ...]}``, and each shard gets only its
        own (``ctx.part``), sent to the worker that hosts it alone: files, line ranges or
        numpy chunks to read there, not the whole input to every worker. A node or a count
        of parts that does not fit the graph fails the future with ``GraphError``.

        A graph with sinks (``plaque.sinks``) gets a staging directory per sink for the run,
        renamed to the sink's target before the future succeeds; if that fails (the target
        exists, a shard's file is missing) the future fails with ``SinkError`` and no sink
        is published. The first run also clears, next to the sinks' targets, what a killed
        driver left there (``plaque.leftovers``)."""
        try:
            parts, staged = self._staged(parts)
        except Exception as exc:
            fut = self.cluster.runtime.future()
            fut.set_exception(exc)
            return fut
        return self.cluster._run(self.gid, arg, parts, staged)

    def stream(self, arg=None, max_in_flight: int = MAX_IN_FLIGHT) -> Stream:
        """Open a stream of this graph (it needs an input node, ``g.input``): its epochs are
        runs with ``arg``, fed by the driver (``plaque.streams``); ``advance`` waits while
        ``max_in_flight`` closed epochs are unfinished."""
        return Stream(self, arg, max_in_flight)

    def _staged(self, parts):
        """A run's parts and its sinks' staging (None without sinks)."""
        sinks = sink_nodes(self.graph)
        if not sinks:
            return parts, None
        staged = StagedRun(sinks, sweep=not self._swept)
        self._swept = True
        try:
            return staged.parts(parts), staged
        except Exception:
            staged.abort()
            raise

    def progress(self, timeout: float = 10.0) -> dict:
        """This graph's runs in flight: ``{t: {node: shards not done}}`` (a node missing is
        done for that run; ``Cluster.progress``)."""
        got = self.cluster.progress(timeout).get(self.gid)
        return {} if got is None else got["runs"]

    def uninstall(self) -> None:
        self.cluster._call(lambda: self.cluster._core.uninstall(self.gid))


class Cluster:
    """A coordinator listening at ``bind`` (``tcp://HOST``, ``ipc``, or ``inproc``).

    ``keys``: the directory of the CURVE keys its sockets require (default ``$PLAQUE_KEYS``;
    neither: plain sockets); the worker processes it starts get them too. ``runtime``: what
    it runs on (default: a ``plaque.runtime.LoopThread``; a simulation gives its own).
    """

    def __init__(self, bind: str = "tcp://127.0.0.1", heartbeat_timeout: float = 3.0,
                 keys: str | None = None, runtime=None):
        self._inproc = bind == "inproc"
        self.keys = keys
        self.socket_dir = None  # a local_cluster's private directory of ipc:// sockets
        self.runtime = runtime if runtime is not None else LoopThread()
        self.clock = self.runtime.clock  # the time the endpoints tick with
        self._transport = self.runtime.transport(bind, keys)
        self.address = self._transport.address
        self._core = CoordinatorCore(self.address, heartbeat_timeout=heartbeat_timeout)
        self._loop = self.runtime.loop()
        # callback(value, error) of each install in progress (by graph id) and each run in
        # flight (by (graph id, timestamp))
        self._installs: dict[int, object] = {}
        self._runs: dict[tuple, object] = {}
        self._staged: dict[tuple, StagedRun] = {}  # (gid, t) -> sinks' staging of a run
        self._counter_requests: dict[int, tuple] = {}  # request -> (future, workers, replies)
        self._members: list[int] = []
        self._member_cv = threading.Condition()
        self._inproc_workers: list[Endpoint] = []
        self.processes: list[subprocess.Popen] = []
        self._closed = False
        self._posting = threading.Lock()  # a job is posted only while the cluster is open:
        # close() sets _closed under it, so every job posted is queued before its shutdown
        self.listeners: list = []  # called on the loop thread with every ``plaque.events``
        self._endpoint = Endpoint(self._core, self._transport, self._loop,
                                  after_turn=self._dispatch_events, clock=self.clock)
        self.runtime.start(self._loop, self._endpoint)

    def _dispatch_events(self):
        for ev in self._core.take_events():
            try:
                self._dispatch(ev)
            except Exception:  # one bad event must not drop the others of this turn
                log.exception("dropped a cluster event %s", type(ev).__name__)

    def _dispatch(self, ev):
        for listener in self.listeners:
            try:
                listener(ev)
            except Exception:
                log.exception("cluster event listener failed on %s", type(ev).__name__)
        handler = self._ON_EVENT.get(type(ev))
        if handler is not None:  # others (UserMessage) are for the listeners only
            handler(self, ev)

    def _on_membership(self, ev: Membership):
        with self._member_cv:
            self._members = ev.workers
            self._member_cv.notify_all()

    def _on_installed(self, ev: Installed):
        _settle(self._installs, ev.gid, ev.error, ev.gid)

    def _on_run_done(self, ev: RunDone):
        _settle(self._runs, (ev.gid, ev.t), None, ev.result)

    def _on_run_failed(self, ev: RunFailed):
        _settle(self._runs, (ev.gid, ev.t), ev.error, None)

    def _on_run_settled(self, ev: RunSettled):
        staged = self._staged.pop((ev.gid, ev.t), None)
        if staged is not None:  # no worker writes there any more
            staged.abort()

    def _on_counters(self, ev: CountersReceived):
        fut, want, got = self._counter_requests.get(ev.request, (None, None, None))
        if fut is not None:
            got[ev.worker] = ev.snapshot
            if set(got) >= set(want):
                del self._counter_requests[ev.request]
                fut.set_result(got)

    _ON_EVENT = {
        Membership: _on_membership, Installed: _on_installed, RunDone: _on_run_done,
        RunFailed: _on_run_failed, CountersReceived: _on_counters, RunSettled: _on_run_settled,
    }

    def _call(self, fn, timeout=30.0):
        """Run ``fn`` on the loop thread, then a turn; return its result here."""
        out = self.runtime.future()

        def job():
            try:
                out.set_result(fn())
            except BaseException as exc:
                out.set_exception(exc)
            self._endpoint.turn()

        if not self._post(job):
            raise ClusterClosed("the cluster is closed")
        return out.result(timeout)

    # ---- for runtimes embedding the coordinator (loop thread only unless said) -------------
    @property
    def loop(self):
        return self._loop

    @property
    def core(self) -> CoordinatorCore:
        return self._core

    def call_soon(self, fn) -> None:
        """Thread-safe: run ``fn()`` on the coordinator's loop, then a turn."""

        def job():
            try:
                fn()
            except Exception:
                log.exception("call_soon job failed")
            self._endpoint.turn()

        self._loop.call_soon_threadsafe(job)

    def soon(self) -> None:
        """Loop thread: make sure a turn runs (commands are sent) soon."""
        self._endpoint.soon()

    def install_async(self, graph: Graph, callback) -> int:
        """Loop thread: install ``graph``; ``callback(gid, error)`` runs once installed."""
        gid = self._core.install(graph)
        self._installs[gid] = callback
        self._endpoint.soon()
        return gid

    def start_async(self, gid: int, arg, callback, parts=None, stream=None):
        """Loop thread: start a run (``parts``: its partitioned input, as ``run`` takes it;
        ``stream``: the stream it is an epoch of); ``callback(result, error)`` runs when it
        ends."""
        t = self._core.start(gid, arg, parts, stream)
        self._runs[(gid, t)] = callback
        self._endpoint.soon()
        return t

    # ---- public ---------------------------------------------------------------------------
    def workers(self) -> list[int]:
        """Ids of the live workers."""
        with self._member_cv:
            return list(self._members)

    def wait_for_workers(self, n: int, timeout: float = 30.0) -> list[int]:
        """Block until at least ``n`` workers are live."""
        deadline = time.monotonic() + timeout
        with self._member_cv:
            while len(self._members) < n:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise PlaqueError(f"only {len(self._members)} of {n} workers joined"
                                      f" within {timeout:.0f} s")
                self._member_cv.wait(min(left, 0.2))
            return list(self._members)

    def install(self, graph: Graph, timeout: float = 30.0) -> InstalledGraph:
        """Ship ``graph`` to its workers and wait until every one has installed it."""
        fut = self.runtime.future()
        self._call(lambda: self.install_async(graph, _resolver(fut)))
        gid = fut.result(timeout)
        return InstalledGraph(self, gid, graph)

    def _run(self, gid, arg, parts=None, staged: StagedRun | None = None) -> cf.Future:
        fut = self.runtime.future()

        def job():
            try:
                settle = _resolver(fut) if staged is None else self._committer(gid, fut, staged)
                t = self.start_async(gid, arg, settle, parts)
            except BaseException as exc:
                if staged is not None:
                    staged.abort()
                fut.set_exception(exc)
                return
            if staged is not None:  # a failed run's staging goes once the run settles
                self._staged[(gid, t)] = staged
            self._endpoint.turn()

        if not self._post(job, fut) and staged is not None:
            staged.abort()
        return fut

    def progress(self, timeout: float = 10.0) -> dict:
        """Where each installed graph's runs in flight are: ``{gid: {"name", "nodes":
        {node: shards}, "runs": {t: {node: shards not done}}}}``, from the coordinator's
        pointstamp counts; a node missing from a run's dict is done for that run. Workers
        tell the coordinator once per run, so a shard counts as not done until its worker
        has finished the run.

        >>> for t, pending in cluster.progress()[graph.gid]["runs"].items():
        ...     print(t, pending)   # e.g. 3 {'sum': 2}: the sources are done
        """
        return self._call(self._core.progress, timeout)

    def counters(self, timeout: float = 10.0) -> dict:
        """Traffic counters of every live worker and of the coordinator (key -1)."""
        fut = self.runtime.future()

        def job():
            req, want = self._core.request_counters()
            if not want:
                fut.set_result({})
            else:
                self._counter_requests[req] = (fut, want, {})
            return self._core.counters.snapshot()

        own = self._call(job)
        result = dict(fut.result(timeout))
        result[-1] = own
        return result

    def add_inproc_workers(self, n: int) -> None:
        """Start ``n`` workers inside this process (the in-process transport)."""
        if not self._inproc:
            raise PlaqueError("in-process workers need a Cluster(bind='inproc')")

        def job():
            for _ in range(n):
                t = self.runtime.worker_transport()
                loop = self.runtime.worker_loop(self._loop,
                                                f"worker-{len(self._inproc_workers)}")
                ep = Endpoint(WorkerCore(t.address, self.address), t, loop, clock=self.clock)
                self._inproc_workers.append(ep)
                loop.call_soon(ep.start)  # its first tick on its own loop

        self._call(job)

    def add_endpoint(self, endpoint: Endpoint) -> None:
        """An in-process worker's endpoint made elsewhere (a simulated host), stopped with
        the cluster and found by ``endpoint_of``; the caller starts it."""
        self._inproc_workers.append(endpoint)

    def endpoint_of(self, worker: int) -> Endpoint:
        """The endpoint of the in-process worker with id ``worker`` (ids follow the order of
        joining, which need not be the order the endpoints were made in)."""
        for ep in self._inproc_workers:
            if ep.core.id == worker:
                return ep
        raise KeyError(f"no in-process worker with id {worker}")

    def kill_inproc_worker(self, index: int) -> None:
        """Silence an in-process worker abruptly (to test failure handling)."""
        self._call(lambda: self._inproc_workers[index].stop("killed"))

    def start_worker_processes(self, n: int, bind: str = "tcp://127.0.0.1") -> None:
        """Spawn ``n`` worker processes that join this cluster."""
        env = worker_env(self.keys)
        # without keys outside a private directory, as its creator asked in code: its
        # workers must be told --insecure too, and need not each warn about it
        plain = self.keys is None and security.keys_dir() is None and \
            not security.private_ipc(bind)
        if plain:
            env[security.WARNED_ENV] = "1"
        for _ in range(n):
            verbose = ["-v"] * int(os.environ.get("PLAQUE_VERBOSE", "0") or 0)
            cmd = [sys.executable, "-m", "plaque", *verbose, "worker", "--join", self.address,
                   "--bind", bind]
            if plain:
                cmd.append("--insecure")
            self.processes.append(subprocess.Popen(cmd, env=env))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers this cluster started, then the coordinator; always cleans up."""
        if self._closed:
            return
        try:
            self._call(self._core.stop_workers, timeout=timeout)
        except Exception:
            pass
        with self._posting:  # from here no job is posted: those posted run before shutdown
            self._closed = True
        deadline = time.monotonic() + timeout
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

        def shutdown():
            for ep in self._inproc_workers:
                ep.stop("cluster closed")
            self._endpoint.stop("cluster closed")
            closed = ClusterClosed("the cluster closed before this finished")
            for callback in [*self._installs.values(), *self._runs.values()]:
                callback(None, closed)
            for fut, _, _ in self._counter_requests.values():
                fut.set_exception(closed)
            self._installs.clear()
            self._runs.clear()
            self._counter_requests.clear()
            for staged in self._staged.values():  # the workers are gone: nobody writes there
                staged.abort()
            self._staged.clear()
            self._loop.stop()

        self._loop.call_soon_threadsafe(shutdown)
        self.runtime.join(self._loop, timeout)
        with self._member_cv:
            self._member_cv.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def open_epoch(self, stream: Stream, closing: cf.Future | None) -> cf.Future:
        """Any thread: advance ``stream``'s open epoch (if ``closing`` is its future) and
        start the next; returns the new epoch's future."""
        fut = self.runtime.future()
        gid = stream.installed.gid
        try:
            parts, staged = stream.installed._staged(None)
        except Exception as exc:
            fut.set_exception(exc)
            parts = staged = None

        def job():
            if closing is not None and stream.loop_t is not None:
                self._core.advance(gid, stream.loop_t, stream.id)
            stream.loop_t = None
            if fut.done():  # its sinks could not be staged
                return
            try:
                settle = _resolver(fut) if staged is None else self._committer(gid, fut, staged)
                stream.loop_t = t = self.start_async(gid, stream.arg, settle, parts, stream.id)
            except BaseException as exc:
                if staged is not None:
                    staged.abort()
                fut.set_exception(exc)
                return
            if staged is not None:
                self._staged[(gid, t)] = staged
            self._endpoint.turn()

        if not self._post(job, fut) and staged is not None:
            staged.abort()
        return fut

    def feed(self, stream: Stream, node, shard: int, values, keys) -> None:
        """Any thread: send ``values`` into ``stream``'s open epoch."""
        def job():
            if stream.loop_t is not None:
                self._core.feed(stream.installed.gid, stream.loop_t, node.index, shard, values,
                                keys)
                self._endpoint.soon()
        self._post(job)

    def close_epoch(self, stream: Stream, fut: cf.Future) -> None:
        """Any thread: advance ``stream``'s last epoch and end the stream."""
        def job():
            if stream.loop_t is not None:
                self._core.advance(stream.installed.gid, stream.loop_t, stream.id, last=True)
                self._endpoint.turn()
        self._post(job, fut)

    def _post(self, job, fut: cf.Future | None = None) -> bool:
        """Any thread: run ``job`` on the loop; False (and ``fut`` failed) once closed. A
        job posted runs before the loop's shutdown, which settles what it started."""
        with self._posting:
            if not self._closed:
                self._loop.call_soon_threadsafe(job)
                return True
        if fut is not None and not fut.done():
            fut.set_exception(ClusterClosed("the cluster is closed"))
        return False

    def _committer(self, gid: int, fut: cf.Future, staged: StagedRun):
        """Loop thread: a callback(value, error) that publishes a successful run's sinks
        before settling ``fut`` (a failure to publish fails it)."""
        settle = _resolver(fut)

        def done(result, error):
            if error is None:
                self._staged.pop((gid, result.timestamp), None)
                try:
                    staged.commit(result)
                except Exception as exc:
                    error = exc
            settle(result if error is None else None, error)
        return done


def _settle(pending: dict, key, error, value) -> None:
    """Call (once) the callback waiting in ``pending`` under ``key``, if any."""
    callback = pending.pop(key, None)
    if callback is not None:
        callback(value, error)


def _resolver(fut: cf.Future):
    """A callback(value, error) that settles ``fut`` (once)."""
    def settle(value, error):
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
    return settle


def worker_env(keys=None) -> dict:
    """The environment of the worker processes a local cluster starts: they die with it, use
    its keys, and share one ``PYTHONHASHSEED`` (the caller's, else one drawn per cluster), so
    even ``hash()`` of text agrees between them; workers started elsewhere are checked at join
    (``emit(key=)`` never depends on it)."""
    env = dict(os.environ, PLAQUE_DIE_WITH_PARENT="1")
    if keys is not None:
        env[security.ENV] = str(keys)
    env.setdefault("PYTHONHASHSEED", str(secrets.randbelow(2**32)))
    return env


@contextlib.contextmanager
def local_cluster(workers: int = 2, transport: str | None = None,
                  heartbeat_timeout: float = 3.0, timeout: float = 30.0, insecure: bool = False):
    """A coordinator here and ``workers`` workers; always torn down on exit.

    ``transport``: None (the default) runs workers as processes on Unix sockets in a private
    temporary directory (mode 0700, ``cluster.socket_dir``, removed on exit), where the kernel
    refuses any other user's connect: no CURVE, nothing encrypted between the processes of
    one user. ``"tcp"`` (loopback) or ``"ipc"`` (the system's temporary directory) run them on
    those, every socket requiring CURVE with a throw-away key pair made in a private
    temporary directory (``cluster.keys``) and removed on exit. ``"inproc"`` runs them on the
    coordinator's event loop, for fast tests. ``$PLAQUE_KEYS`` naming keys makes the default
    ``"tcp"`` with those keys; ``insecure=True`` makes it ``"tcp"`` with plain sockets, which
    any local user can reach (and so run code in the cluster). Both temporary directories
    are named for this process, so ``plaque clean`` can remove them if it is killed.
    """
    if transport not in (None, "tcp", "ipc", "inproc"):
        raise ValueError(f"transport must be 'tcp', 'ipc' or 'inproc', got {transport!r}")
    private = None
    if transport is None and not insecure and security.keys_dir() is None:
        private = security.private_socket_dir(leftovers.socket_prefix("plaque-"))
    if private is not None:
        bind = f"ipc://{private}/"
    else:
        bind = {None: "tcp://127.0.0.1", "tcp": "tcp://127.0.0.1", "ipc": "ipc",
                "inproc": "inproc"}[transport]
    own = None
    if private is None and transport != "inproc" and not insecure and \
            security.keys_dir() is None:
        own = security.ephemeral(leftovers.socket_prefix("plaque-keys-"))
    try:
        with _cluster(bind, heartbeat_timeout, own, workers, timeout) as cluster:
            cluster.socket_dir = private
            yield cluster
    finally:
        for directory in (own, private):
            if directory is not None:
                security.discard(directory)


@contextlib.contextmanager
def _cluster(bind, heartbeat_timeout, keys, workers, timeout):
    cluster = Cluster(bind, heartbeat_timeout=heartbeat_timeout, keys=keys)
    try:
        if bind == "inproc":
            cluster.add_inproc_workers(workers)
        else:
            cluster.start_worker_processes(workers, bind)
        cluster.wait_for_workers(workers, timeout)
        yield cluster
    finally:
        cluster.close()
