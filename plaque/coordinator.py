"""The coordinator as a state machine: membership, graph installation, runs, failure detection.

It keeps the worker table (workers join with HELLO and are declared lost after a heartbeat
timeout of silence, counted only while the coordinator could hear them: ``plaque.liveness``),
installs graphs on the workers that host their shards, starts runs with one START message per
involved worker, and keeps its own copy of each graph's progress counts; a run is over when
nothing at all remains at its timestamp, outputs to the driver included.

Like the worker it does no I/O: ``take_commands`` gives the messages to send
(``plaque.commands``) and ``take_events`` what the driver should learn (``plaque.events``:
``Installed``, ``RunDone``, ``RunFailed``, ``CountersReceived``, ``Membership``,
``UserMessage``).
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from dataclasses import dataclass, field

from . import wire
from .commands import Connect, Disconnect, Send
from .counters import Counters
from .errors import GraphError, OperatorError, WorkerLost
from .events import (
    CountersReceived,
    Installed,
    Membership,
    RunDone,
    RunFailed,
    RunSettled,
    UserMessage,
)
from .graph import Graph, Topology
from .heartbeat import HEARTBEAT_INTERVAL
from .liveness import GRACE_TIMEOUTS, Listening
from .logutil import dropped
from .payloads import (
    Advance,
    CountersReply,
    ErrorReport,
    Feed,
    Hello,
    Install,
    InstallReply,
    Report,
    Start,
    Welcome,
)
from .progress import INPUT, SINK, ProgressTracker
from .shipping import ship
from .wire import CONTROL, COORDINATOR, UNKNOWN_SENDER, Kind

log = logging.getLogger("plaque.coordinator")


@dataclass
class RunResult:
    """What a run produced: ``outputs[node name][shard]`` is the list of values it output."""

    timestamp: object
    outputs: dict[str, dict[int, list]] = field(default_factory=dict)

    def values(self, node: str) -> list:
        """Every value ``node`` output, all shards, in shard order."""
        shards = self.outputs.get(node, {})
        return [v for s in sorted(shards) for v in shards[s]]


@dataclass
class _Worker:
    """A worker as the coordinator knows it: where it listens and what it said at HELLO."""

    address: str
    info: dict
    last_seen: float | None = None
    alive: bool = True


@dataclass
class _Graph:
    """An installed graph: its workers, progress counts and the runs in flight."""

    name: str
    node_names: list[str]
    workers: list[int]
    tracker: ProgressTracker
    awaiting: set[int]
    placement: list = field(default_factory=list)  # per node: the worker of each shard
    next_t: itertools.count = field(default_factory=itertools.count)
    broken: Exception | None = None
    runs: dict[object, _Run] = field(default_factory=dict)


def _split_parts(g: _Graph, parts) -> dict[int, dict]:
    """``{worker: {(node index, shard): part}}`` of a run's ``parts`` (``{node name:
    sequence of one part per shard}``); GraphError naming what does not fit the graph."""
    if not isinstance(parts, dict):
        raise GraphError(f"parts must be a dict of node name -> one part per shard, got"
                         f" {type(parts).__name__}")
    split: dict[int, dict] = {}
    for name, node_parts in parts.items():
        if name not in g.node_names:
            raise GraphError(f"parts for {name!r}: graph {g.name!r} has no such node (its"
                             f" nodes: {', '.join(map(repr, g.node_names))})")
        node = g.node_names.index(name)
        shards = g.placement[node]
        try:
            node_parts = list(node_parts)
        except TypeError:
            raise GraphError(f"parts for {name!r} must be a sequence of one part per shard,"
                             f" got {type(node_parts).__name__}") from None
        if len(node_parts) != len(shards):
            raise GraphError(f"parts for {name!r}: {len(node_parts)} given for its"
                             f" {len(shards)} shards (one per shard)")
        for shard, (worker, part) in enumerate(zip(shards, node_parts)):
            split.setdefault(worker, {})[(node, shard)] = part
    return split


@dataclass
class _Run:
    """A run in flight: its outputs so far, and whether it has already failed."""

    result: RunResult
    failed: bool = False


class CoordinatorCore:
    """The coordinator's logic: a state machine fed received frames (``receive``) and the
    time (``tick``), and called by its driver (``install``, ``start``, ``request_counters``,
    ``stop_workers``, ``lose_worker``, ``send_user``). What it decides waits in
    ``take_commands`` (for the adapter) and ``take_events`` (for the driver).

    ``address`` is its full transport address, told to workers as they join;
    ``heartbeat_timeout`` how long a worker may be heard from not at all before it is lost.
    """

    def __init__(self, address: str = "", heartbeat_timeout: float = 3.0):
        self.address = address  # our full transport address, told to workers on joining
        self.heartbeat_timeout = heartbeat_timeout
        self._listening = Listening(GRACE_TIMEOUTS * heartbeat_timeout)
        self.counters = Counters()
        self.workers: dict[int, _Worker] = {}
        self.graphs: dict[int, _Graph] = {}
        self._ids = itertools.count()
        self._gids = itertools.count()
        self._requests = itertools.count()
        self._heard: set[int] = set()
        self._hash_probe = None  # the first worker's str_hash_probe
        self._hash_warned = False
        self._last_beat: float | None = None
        self.stopping = False
        self._commands: list = []
        self._events: list = []

    # ---- plumbing -------------------------------------------------------------------------
    def take_commands(self) -> list:
        cmds, self._commands = self._commands, []
        return cmds

    def take_events(self) -> list:
        evs, self._events = self._events, []
        return evs

    def _send(self, peer, kind, payload, channel=CONTROL) -> None:
        self._send_frames(peer, kind, wire.encode(kind, COORDINATOR, payload), channel)

    def _send_frames(self, peer, kind, frames, channel=CONTROL) -> None:
        """Send encoded ``frames`` (never changed after: several peers may share them)."""
        self.counters.peer(peer).count_sent(frames, kind is Kind.PROGRESS)
        self._commands.append(Send(peer, channel, frames))

    def live_workers(self) -> list[int]:
        return sorted(w for w, info in self.workers.items() if info.alive)

    def progress(self, gid: int | None = None) -> dict:
        """Where the runs in flight are, per installed graph (``gid``: that one only): ``{gid:
        {"name", "nodes": {node: shards}, "runs": {t: {node: shards not done}}}}``; a node
        missing from a run's dict is done for that run (``ProgressTracker.frontier``). A
        worker tells the coordinator its changes at t once it is done with t, so a shard
        counts as not done here until its worker has finished the whole run
        (``WorkerCore.frontier`` knows its own shards exactly)."""
        out = {}
        for g_id, g in self.graphs.items():
            if gid is not None and g_id != gid:
                continue
            names, shards = g.node_names, g.tracker.topology.shards
            out[g_id] = {"name": g.name, "nodes": dict(zip(names, shards)),
                         "runs": {t: {names[n]: k for n, k in g.tracker.frontier(t).items()}
                                  for t in g.runs}}
        return out

    # ---- driver calls ---------------------------------------------------------------------
    def install(self, graph: Graph) -> int:
        """Send ``graph`` to the workers that host it; an ``installed`` event follows."""
        live = self.live_workers()
        if not graph.nodes:
            raise GraphError(f"graph {graph.name!r} has no nodes")
        placement = [tuple(live[i] for i in p) for p in graph.placement(len(live))]
        topology = Topology.of([n.shards for n in graph.nodes], graph.edges)
        gid = next(self._gids)
        workers = sorted({w for p in placement for w in p})
        self.graphs[gid] = _Graph(graph.name, [n.name for n in graph.nodes], workers,
                                  ProgressTracker(topology), set(workers), placement=placement)
        blob = ship((graph, placement), [n.factory for n in graph.nodes])
        for w in workers:
            self._send(w, Kind.INSTALL, Install(gid, blob).wire())
        return gid

    def uninstall(self, gid: int) -> None:
        g = self.graphs.pop(gid, None)
        if g is not None:
            self._send_uninstall(gid, g)

    def _send_uninstall(self, gid, g) -> None:
        for w in g.workers:
            if self.workers[w].alive:
                self._send(w, Kind.UNINSTALL, gid)

    def start(self, gid: int, arg=None, parts=None, stream: int | None = None):
        """Begin a run of graph ``gid``; returns its timestamp. ``parts``: the run's
        partitioned input, ``{node name: [part of shard 0, part of shard 1, ...]}``; each
        worker is sent the parts of the shards it hosts only (``ctx.part``). ``stream``: the
        stream this run is an epoch of (its input nodes then wait for ``advance``)."""
        g = self.graphs.get(gid)
        if g is None:
            raise GraphError(f"graph {gid} is not installed")
        if g.broken is not None:
            raise g.broken
        split = _split_parts(g, parts) if parts is not None else {}
        t = next(g.next_t)
        g.tracker.update(g.tracker.start_changes(t))
        g.runs[t] = _Run(RunResult(t))
        same = None  # the message of every worker without parts: pickled once, not per worker
        for w in g.workers:
            part = split.get(w)
            if part is not None:
                self._send(w, Kind.START, Start(gid, t, arg, part, stream).wire())
                continue
            if same is None:
                same = wire.encode(Kind.START, COORDINATOR, Start(gid, t, arg, None,
                                                                  stream).wire())
            self._send_frames(w, Kind.START, same)
        return t

    def feed(self, gid: int, t, node: int, shard: int, values, keys=None) -> None:
        """Send ``values`` into epoch ``t`` through shard ``shard`` of input node ``node``."""
        g = self.graphs.get(gid)
        if g is None or g.broken is not None or t not in g.runs:
            return  # the epoch already failed: its future says why
        w = g.placement[node][shard]
        self._send(w, Kind.FEED, Feed(gid, t, node, shard, values, keys).wire())

    def advance(self, gid: int, t, stream: int, last: bool = False) -> None:
        """Epoch ``t`` of ``stream`` takes no more input; ``last``: the stream ends."""
        g = self.graphs.get(gid)
        if g is None or g.broken is not None:
            return
        for w in g.workers:
            self._send(w, Kind.ADVANCE, Advance(gid, t, stream, last).wire())

    def request_counters(self) -> tuple[int, list[int]]:
        """Ask every live worker for its counters; ``counters`` events carry the replies."""
        req = next(self._requests)
        live = self.live_workers()
        for w in live:
            self._send(w, Kind.COUNTERS, req)
        return req, live

    def stop_workers(self, reason="cluster closed") -> None:
        self.stopping = True  # workers going away now are not failures
        for w in self.live_workers():
            self._send(w, Kind.STOP, reason)

    # ---- messages -------------------------------------------------------------------------
    def receive(self, frames) -> None:
        try:
            kind, sender, payload = wire.decode(frames)
            handler = self._handlers[kind]
        except Exception as exc:
            self.counters.peer(UNKNOWN_SENDER).dropped += 1
            dropped(log, "a bad message", "coordinator: %s", exc)
            return
        c = self.counters.peer(sender)
        c.count_received(frames, kind is Kind.PROGRESS or kind is Kind.REPORT)
        if kind is not Kind.HELLO and not (sender in self.workers and self.workers[sender].alive):
            c.dropped += 1
            return  # unknown or already-declared-lost sender
        self._heard.add(sender)
        try:
            handler(self, sender, payload)
        except Exception as exc:
            c.dropped += 1
            dropped(log, f"a {kind.name} it could not apply", "coordinator: %r", exc)

    def _on_hello(self, sender, payload):
        hello = Hello.of(payload)
        address = str(hello.address)
        endpoints = set(address.split("|"))
        if any(w.alive and endpoints & set(w.address.split("|")) for w in self.workers.values()):
            # a replay (a worker says hello once): welcoming it again would give the live
            # worker at that address a second id and get it declared lost under the first
            raise ValueError(f"a live worker already joined from {address!r}")
        wid = next(self._ids)
        if hello.hash_probe is not None:  # absent: not checked
            self._check_string_hash(wid, hello.hash_probe)
        self.workers[wid] = _Worker(address, dict(hello.info))
        self._heard.add(wid)
        self._commands.append(Connect(wid, address))
        self._send(wid, Kind.WELCOME, Welcome(wid, self.address).wire())
        self._broadcast_peers()
        self._events.append(Membership(self.live_workers()))
        log.info("worker %d joined from %s", wid, address)

    def _check_string_hash(self, wid, probe) -> None:
        """Warn (once) when workers hash strings differently: ``hash(text) % n`` then routes
        one key to different shards from different workers; ``emit(key=)`` never does."""
        if self._hash_probe is None:
            self._hash_probe = probe
        elif probe != self._hash_probe and not self._hash_warned:
            self._hash_warned = True
            log.warning("worker %d hashes strings differently from the first worker (it was"
                        " started with another PYTHONHASHSEED): hash() of a str, and the order"
                        " of a set of them, differ there, so an operator routing by hash()"
                        " would split keys across shards (route with emit(key=...)) and a"
                        " Pathways kernel body using them would compute otherwise on that host;"
                        " start every worker or host with one PYTHONHASHSEED (Pathways hosts"
                        " use 0 unless it is set)", wid)

    def _broadcast_peers(self):
        peers = {w: self.workers[w].address for w in self.live_workers()}
        for w in peers:
            self._send(w, Kind.PEERS, peers)

    def _on_installed(self, sender, payload):
        reply = InstallReply.of(payload)
        gid = reply.gid
        g = self.graphs.get(gid)
        if g is None or sender not in g.awaiting:
            return
        if reply.error is not None:
            self._events.append(Installed(gid, GraphError(
                f"installing graph {g.name!r} failed on worker {sender}:\n{reply.error}")))
            self.uninstall(gid)
            return
        g.awaiting.discard(sender)
        if not g.awaiting:
            self._events.append(Installed(gid, None))

    def _on_progress(self, sender, body):
        for gid, changes in body.items():
            g = self.graphs.get(gid)
            if g is None:
                continue
            g.tracker.update(changes)
            for t in {key[3] for key, _ in changes}:
                self._check_done(gid, g, t)

    def _on_report(self, sender, payload):
        report = Report.of(payload)
        self._on_progress(sender, report.progress)
        self._on_output(sender, report.outputs)

    def _on_output(self, sender, outputs):
        consumed = Counter()  # (gid, t) -> outputs taken, applied once per batch
        for gid, node, shard, t, value in outputs:
            g = self.graphs.get(gid)
            run = g.runs.get(t) if g else None
            if run is None:
                continue
            name = g.node_names[node]
            run.result.outputs.setdefault(name, {}).setdefault(shard, []).append(value)
            consumed[(gid, t)] += 1
        for (gid, t), n in consumed.items():
            g = self.graphs[gid]
            g.tracker.update((((INPUT, SINK, 0, t), -n),))
            self._check_done(gid, g, t)

    def _check_done(self, gid, g, t):
        run = g.runs.get(t)
        if run is not None and g.tracker.is_done(t):
            del g.runs[t]
            if not run.failed:
                self._events.append(RunDone(gid, t, run.result))
            else:
                self._events.append(RunSettled(gid, t))

    def _on_error(self, sender, payload):
        r = ErrorReport.of(payload)
        g = self.graphs.get(r.gid)
        run = g.runs.get(r.t) if g else None
        if run is None or run.failed:
            return
        run.failed = True
        err = OperatorError(r.node, r.shard, r.worker, r.t, r.message, r.traceback, r.origin)
        self._events.append(RunFailed(r.gid, r.t, err))

    def _on_heartbeat(self, sender, payload):
        pass

    def _on_user(self, sender, payload):
        self._events.append(UserMessage(sender, payload))

    def send_user(self, worker: int, payload) -> None:
        """Send ``payload`` to ``worker``'s embedding runtime."""
        self._send(worker, Kind.USER, payload)

    def _on_counters(self, sender, payload):
        reply = CountersReply.of(payload)
        if not isinstance(reply.request, int) or not isinstance(reply.snapshot, dict):
            raise ValueError(f"not a reply to a counters request: {reply.request!r:.80}")
        self._events.append(CountersReceived(reply.request, sender, reply.snapshot))

    _handlers = {
        Kind.HELLO: _on_hello, Kind.INSTALLED: _on_installed, Kind.PROGRESS: _on_progress,
        Kind.OUTPUT: _on_output, Kind.ERROR: _on_error, Kind.HEARTBEAT: _on_heartbeat,
        Kind.COUNTERS: _on_counters, Kind.USER: _on_user, Kind.REPORT: _on_report,
    }

    # ---- time -----------------------------------------------------------------------------
    def tick(self, now: float, heard_until: float | None = None) -> None:
        """Heartbeats out; workers silent for longer than the timeout are declared lost.

        Silence counts only while we could hear (``plaque.liveness``): up to ``heard_until``,
        the latest time the adapter found our inbox empty (None: ``now``), and not over our
        own stalls, so a starved coordinator never mistakes its unread inbox for dead workers.
        """
        blind, listened = self._listening.tick(now, heard_until)
        for info in self.workers.values():
            if info.last_seen is not None:
                info.last_seen += blind
        for w in self._heard:
            if w in self.workers:
                self.workers[w].last_seen = now
        self._heard.clear()
        if self._last_beat is None or now - self._last_beat >= HEARTBEAT_INTERVAL:
            self._last_beat = now
            for w in self.live_workers():
                self._send(w, Kind.HEARTBEAT, now)
        for w in [] if self.stopping else self.live_workers():
            seen = self.workers[w].last_seen
            if seen is not None and listened - seen > self.heartbeat_timeout:
                self.lose_worker(w, f"no heartbeat for {listened - seen:.1f} s")

    def lose_worker(self, w: int, detail: str) -> None:
        """Mark ``w`` lost: every graph placed on it fails its runs and refuses new ones."""
        info = self.workers[w]
        if not info.alive:
            return
        info.alive = False
        log.warning("worker %d lost: %s", w, detail)
        self._commands.append(Disconnect(w))
        err = WorkerLost(w, detail)
        for gid, g in list(self.graphs.items()):
            if w not in g.workers or g.broken is not None:
                continue
            g.broken = err
            for t, run in list(g.runs.items()):
                if not run.failed:
                    self._events.append(RunFailed(gid, t, err))
                self._events.append(RunSettled(gid, t))  # uninstalled below, never to finish
            g.runs.clear()
            if g.awaiting:
                self._events.append(Installed(gid, err))
                g.awaiting.clear()
            self._send_uninstall(gid, g)  # w is no longer alive: it gets nothing
        self._broadcast_peers()
        self._events.append(Membership(self.live_workers()))
