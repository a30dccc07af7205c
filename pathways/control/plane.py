"""The coordinator's decisions without sockets, threads or clocks: the control plane.

Inputs are method calls: a client's request (``request``), the hosts that are live now
(``hosts``), the end of an install or of a run (``installed``, ``run_ended``) and the passing of
time (``tick``, with ``now`` given). Outputs are commands collected for the caller to carry out
(``take``): replies to clients, messages to hosts, hosts to refuse, graphs to install and runs
to start. ``pathways.control.coordinator`` is the thin adapter that feeds it from its sockets
and its Plaque cluster, on one event loop; tests drive it directly.

It holds the resource manager (virtual slices), the preemptions (``pathways.control.preemption``),
one gang scheduler per island, the programs installed and the runs waiting or running, and each
client's liveness.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field

import plaque
from plaque.liveness import GRACE_TIMEOUTS, Listening
from plaque.logutil import dropped

from .. import protocol as m
from ..errors import ClientGone, HostLost, RemoteError, ResourceError
from .preemption import Preemptions
from .resource_manager import DEFAULT_KIND, ResourceManager
from .scheduler import FifoPolicy, Gang, IslandScheduler, PriorityPolicy, ProportionalSharePolicy

log = logging.getLogger("pathways.control.plane")

POLICIES = ("fifo", "share", "priority")


# ---- commands out ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    """Send ``msg`` to the client connection ``ident``."""
    ident: bytes
    msg: m.Message


@dataclass(frozen=True)
class ToHost:
    """Send ``msg`` to the host (Plaque worker) ``worker``."""
    worker: int
    msg: m.Message


@dataclass(frozen=True)
class RefuseHost:
    """Put ``worker`` out of the cluster: it is no valid host."""
    worker: int
    reason: str


@dataclass(frozen=True)
class InstallGraph:
    """Install program ``pid``'s graph (its skeleton and shipped code); report the outcome
    with ``installed(pid, gid, error)``."""
    pid: tuple
    nodes: list
    edges: list
    blob: bytes


@dataclass(frozen=True)
class StartRun:
    """Start run ``key`` of the installed graph ``gid`` with ``arg``; report its end with
    ``run_ended(key, error)``."""
    key: tuple
    gid: int
    arg: object


# ---- state ---------------------------------------------------------------------------------------

@dataclass
class _Program:
    ident: bytes  # the connection that installed it
    client: int
    gangs: list
    islands: list  # island of each gang
    gid: int | None = None
    error: Exception | None = None

    @property
    def installing(self) -> bool:
        return self.gid is None and self.error is None


@dataclass
class _Run:
    ident: bytes
    pid: tuple
    run_id: int
    arg: object
    prog: _Program
    programs: dict  # island -> the gangs submitted to that island's scheduler
    seqs: dict = field(default_factory=dict)  # eqn index -> {device: seq}
    started: bool = False
    since: float = 0.0  # when it was numbered (the plane's time)
    t: object = None  # its Plaque timestamp once started (``run_began``)


ERRORS_KEPT = 20  # failed runs ``status`` lists, the latest
RUNS_LISTED = 16  # runs in flight ``status`` lists per client, the oldest (all are counted)


def _error_record(run: _Run, error: BaseException, at: float) -> dict:
    """What ``status`` says of a failed run: whose, when, why and, for a kernel's own
    exception, where it failed and its remote traceback."""
    text = str(error)
    origin = error.origin if isinstance(error, RemoteError) else None
    return {"client": run.prog.client, "program": run.pid[1], "run": run.run_id, "at": at,
            "type": type(error).__name__ if origin is None else origin["type"][1],
            "message": (text.split("\n--- remote traceback", 1)[0] if origin else text)[:2000],
            "function": origin and origin.get("function"),
            "device": origin and origin.get("device"), "host": origin and origin.get("host"),
            "traceback": (origin or {}).get("traceback") or ""}


def _short(value) -> str:
    """A loggable glimpse of a value a stranger sent (repr may fail or be huge)."""
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


class ControlPlane:
    """The coordinator's decisions without I/O: requests from clients, hosts joining and
    leaving, installs and runs ending, and the time, all passed in; replies, messages to hosts,
    installs and starts come out as commands (``take()``) for the adapter to carry out.
    Holds the resource manager, one gang scheduler per island and the runs in flight."""
    def __init__(self, policy: str = "fifo", window: int = 8, client_timeout: float = 5.0,
                 check_every: float = 1.0, preempt_timeout: float = 60.0):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.policy, self.window = policy, window
        self.rm = ResourceManager()
        self.schedulers: dict[int, IslandScheduler] = {}
        self.runs: dict[tuple, _Run] = {}  # (pid, run_id) -> a run waiting or running, in
        # the order they were numbered (status lists the oldest by it)
        # client -> its runs held, in order, behind one whose program is being installed
        self._held: dict[int, deque] = {}
        self.client_info: dict[int, dict] = {}  # weight, priority
        self.client_timeout = client_timeout
        self._listening = Listening(GRACE_TIMEOUTS * client_timeout, interval=check_every)
        self._last_seen: dict[int, float] = {}  # client -> time of its last word
        self._client_of: dict[bytes, int] = {}  # connection identity -> client id
        self._departed: dict[int, dict] = {}  # lost host -> its info (devices, island)
        self.hosts: dict[int, dict] = {}  # worker id -> info
        self.programs: dict[tuple, _Program] = {}
        self.clients: dict[int, bytes] = {}  # client id -> connection identity
        self._client_ids = itertools.count()
        self.addresses: dict = {}  # what "info" answers (the Plaque and client addresses)
        self._out: list = []
        self._now = 0.0  # the time of the request being handled
        self.preemptions = Preemptions(self.rm, preempt_timeout)
        self.errors: deque = deque(maxlen=ERRORS_KEPT)  # the latest failed runs (status)

    def take(self) -> list:
        """The commands decided since the last call, in order."""
        out, self._out = self._out, []
        return out

    def _reply(self, ident, msg) -> None:
        self._out.append(Reply(ident, msg))

    def _replies(self, replies) -> None:
        for ident, msg in replies:
            self._reply(ident, msg)

    def _to_hosts(self, msg) -> None:
        for w in self.hosts:
            self._out.append(ToHost(w, msg))

    # ---- hosts ------------------------------------------------------------------------------
    def hosts_live(self, live: dict[int, object]) -> None:
        """The Plaque workers live now, each with the info of its hello: hosts join (and are
        given their devices) or are lost (and every client is told); all learn the topology."""
        for w in sorted(set(live) - set(self.hosts)):
            info = live[w]
            try:
                if not isinstance(info, dict) or not all(
                        isinstance(info.get(k), str) for k in ("data", "ici")):
                    raise ValueError("its hello does not describe a host")
                kind = getattr(info.get("spec"), "kind", None)  # e.g. a --backend jax GPU's
                devs = self.rm.add_host(w, int(info.get("island", 0)),
                                        int(info.get("devices", 0)),
                                        str(kind) if kind else DEFAULT_KIND)
            except Exception as exc:  # a stranger or a broken host: keep it out
                log.warning("worker %d refused as a host: %r", w, exc)
                self._out.append(RefuseHost(w, f"not a valid host: {exc!r}"))
                continue
            self.hosts[w] = dict(info, device_ids=[d.id for d in devs])
            self._out.append(ToHost(w, m.AssignDevices([d.id for d in devs])))
            log.info("host %d joined island %s with devices %s", w, info.get("island"),
                     [d.id for d in devs])
        for w in sorted(set(self.hosts) - set(live)):
            lost = self.rm.remove_host(w)
            log.warning("host %d lost with devices %s", w, lost)
            info = self._departed[w] = self.hosts.pop(w)
            notice = m.HostLostNotice(w, info.get("data"), lost, self._host_lost(
                plaque.WorkerLost(w, "it stopped answering")))
            for ident in self.clients.values():  # their reads from it must not wait forever
                self._reply(ident, notice)
        topology = {d: w for w, h in self.hosts.items() for d in h["device_ids"]}
        links = {w: h["ici"] for w, h in self.hosts.items()}
        self._to_hosts(m.Topology(topology, links))

    def devices(self) -> list[dict]:
        out = []
        for d in self.rm.devices():
            h = self.hosts[d.host]
            spec = h.get("spec")
            out.append({"id": d.id, "island": d.island, "host": d.host, "index": d.index,
                        "kind": d.kind, "data": h["data"],
                        "hbm": getattr(spec, "hbm_bytes", None)})
        return out

    # ---- clients ----------------------------------------------------------------------------
    def tick(self, now: float, heard_until: float) -> None:
        """Time passed: a client silent for ``client_timeout`` is gone. ``heard_until``: up to
        when nothing waited unread from clients (``now`` if nothing waits); silence counts
        only while we could hear (``plaque.liveness``), not over our own stalls."""
        blind, listened = self._listening.tick(now, heard_until)
        for client, seen in list(self._last_seen.items()):
            seen = self._last_seen[client] = seen + blind
            if listened - seen > self.client_timeout:
                log.warning("client %s lost: silent for %.1f s", client, listened - seen)
                self._forget_client(client, f"client {client} stopped answering for"
                                            f" {listened - seen:.1f} s")
        self._replies(self.preemptions.expire(now))

    def request(self, ident: bytes, msg, now: float) -> None:
        """A request from the client connection ``ident``."""
        self._now = now
        cid = self._client_of.get(ident)
        if cid is not None:
            self._last_seen[cid] = now
        handler = self._HANDLERS.get(type(msg))
        if handler is None:
            dropped(log, "a client message of unknown kind", _short(msg))
            return
        if isinstance(msg, m.ActsForClient) and msg.owner != cid:
            gone = ClientGone("this client was disconnected (closed, or silent too long)"
                              if cid is None else "a request for another client")
            if isinstance(msg, m.RunProgram):
                self._reply(ident, m.RunFailed(msg.run_id, gone))
            elif hasattr(msg, "req"):
                self._reply(ident, m.Refused(msg.req, gone))
            log.warning("refused a %s for a client this connection is not",
                        type(msg).__name__)
            return
        try:
            handler(self, ident, msg)
        except Exception as exc:
            log.info("request %s failed: %r", type(msg).__name__, exc)
            req = getattr(msg, "req", None)
            if isinstance(req, int):
                self._reply(ident, m.Refused(req, exc))

    def _ping(self, ident, msg):
        self._reply(ident, m.Answer(None, None))  # the client knows the coordinator lives

    def _info(self, ident, msg):
        self._reply(ident, m.Answer(msg.req, dict(self.addresses)))

    def _hello(self, ident, msg):
        cid = next(self._client_ids)
        self.clients[cid] = ident
        self.client_info[cid] = dict(msg.info or {})
        self._last_seen[cid] = self._now
        self._client_of[ident] = cid
        self._reply(ident, m.Answer(msg.req, cid))

    def _devices(self, ident, msg):
        self._reply(ident, m.Answer(msg.req, self.devices()))

    def _mesh(self, ident, msg):
        if msg.preempt:  # pathways.control.preemption
            victims = self.preemptions.ask(ident, msg, self._now, self._priority)
            for s in victims:
                self._reply(self.clients[s.client], m.SuspendNotice(
                    s.slice_id, f"client {msg.client} of priority"
                                f" {self._priority(msg.client)} needs its devices"))
            if victims:
                return
        sl = self.rm.allocate(msg.client, tuple(msg.shape), island=msg.island, hosts=msg.hosts)
        self._reply(ident, m.Answer(msg.req, sl))

    def _priority(self, client) -> int:
        return self.client_info.get(client, {}).get("priority", 0)

    def _own_slice(self, msg):
        owner = self.rm.client_of(msg.slice_id)
        if owner is None:
            raise ResourceError(f"unknown slice {msg.slice_id}")
        if owner != msg.client:
            raise ResourceError(f"slice {msg.slice_id} belongs to another client")

    def _remap(self, ident, msg):
        self._own_slice(msg)
        self._reply(ident, m.Answer(msg.req, self.rm.remap(msg.slice_id)))

    def _suspend(self, ident, msg):
        self._own_slice(msg)
        self.rm.suspend(msg.slice_id)
        self._reply(ident, m.Answer(msg.req, None))
        self._replies(self.preemptions.slices_freed())

    def _cancel_suspend(self, ident, msg):
        """The client did not hear that its ``Suspend`` was done in time and still holds the
        slice's arrays on its devices: put the slice back there, unless its suspension made
        room for a preemption or a device was lost (then it stands, answer None, and the
        client completes it: its arrays are safe on disk)."""
        self._own_slice(msg)
        sid = msg.slice_id
        if self.rm.is_live(sid):  # its Suspend was refused: nothing to undo
            self._reply(ident, m.Answer(msg.req, self.rm.slice(sid)))
            return
        restored = None
        if not self.preemptions.stands(sid):
            try:
                restored = self.rm.restore(sid)
            except ResourceError as exc:
                log.info("the suspension of slice %s stands: %s", sid, exc)
        self._reply(ident, m.Answer(msg.req, restored))

    def _resume(self, ident, msg):
        self._own_slice(msg)
        self._replies(self.preemptions.resume(ident, msg, self._now))

    def _status(self, ident, msg):
        self._reply(ident, m.Answer(msg.req, self.status()))

    def status(self) -> dict:
        """The cluster as the plane sees it: hosts, devices, the policy, the resource
        manager's snapshot (slices, suspended slices), each client's weight, priority, runs
        running (started on the hosts), gangs queued, runs ``held`` behind a program being
        installed and its oldest runs in flight (``runs``: program, run, started, ``since``
        it was numbered, and the Plaque graph and timestamp ``t`` once started), the latest
        failed runs (``errors``, with remote tracebacks), the hosts lost so far
        (``lost_hosts``: their infos, as ``hosts`` had them) and ``now``, the time ``since``
        and ``at`` are in."""
        clients = {}
        for cid in sorted(self.clients):
            info = self.client_info.get(cid, {})
            clients[cid] = {"weight": info.get("weight", 1.0),
                            "priority": info.get("priority", 0), "queued": 0, "running": 0,
                            "held": len(self._held.get(cid, ())), "runs": []}
        for sched in self.schedulers.values():
            for cid, n in sched.policy.waiting().items():
                if cid in clients:
                    clients[cid]["queued"] += n
        for run in self.runs.values():  # oldest first: a run is added when it is numbered
            mine = clients.get(run.prog.client)
            if mine is None:
                continue
            mine["running"] += run.started
            if len(mine["runs"]) < RUNS_LISTED:
                mine["runs"].append({"program": run.pid[1], "run": run.run_id,
                                     "started": run.started, "since": run.since,
                                     "graph": run.prog.gid, "t": run.t})
        return {"hosts": self.hosts, "devices": self.devices(), "clients": clients,
                "policy": self.policy, "resources": self.rm.snapshot(), "now": self._now,
                "errors": list(self.errors), "lost_hosts": dict(self._departed)}

    def _bye(self, ident, msg):
        self._forget_client(msg.client, f"client {msg.client} closed")

    # ---- programs and runs ------------------------------------------------------------------
    def _install(self, ident, msg):
        pid, client = msg.pid, msg.pid[0]
        prog = self.programs[pid] = _Program(ident, client, [tuple(g) for g in msg.gangs],
                                             list(msg.islands))
        foreign = sorted({d for g in prog.gangs for d in g} - self.rm.devices_of(client))
        if foreign:  # a mesh made by hand must stay within the client's own slices
            prog.error = ResourceError(f"devices {foreign} are in no slice of client {client}:"
                                       " get meshes from client.mesh(...)")
            self._reply(ident, m.InstallFailed(pid, prog.error))
            return
        self._out.append(InstallGraph(pid, msg.nodes, msg.edges, msg.blob))

    def installed(self, pid, gid, error) -> None:
        """The install of program ``pid`` ended: graph ``gid``, or ``error``."""
        prog = self.programs.get(pid)
        if prog is None:
            return
        error = self._explain(error)
        prog.gid, prog.error = gid, error
        if error is not None:
            self._reply(prog.ident, m.InstallFailed(pid, error))
        self._release_held(prog.client)

    def _run(self, ident, msg):
        """A client's run. It is numbered once its program is installed; until then it and
        every later run of the client wait, in order (``_held``): a later run may take this
        one's outputs as inputs, and numbered first on the same devices it would wait there
        for them forever."""
        prog = self.programs.get(msg.pid)
        if prog is not None and (prog.installing or prog.client in self._held):
            self._held.setdefault(prog.client, deque()).append((ident, msg))
            return
        self._number(ident, msg)

    def _release_held(self, client) -> None:
        """Number the client's held runs, in order, up to the next whose program is still
        being installed."""
        held = self._held.get(client)
        while held:
            prog = self.programs.get(held[0][1].pid)
            if prog is not None and prog.installing:
                return
            self._number(*held.popleft())
        self._held.pop(client, None)

    def _number(self, ident, msg):
        pid, run_id, arg = msg.pid, msg.run_id, msg.arg
        prog = self.programs.get(pid)
        if prog is None:
            self._refuse_run(ident, run_id, arg, plaque.GraphError(f"no program {pid}"))
            return
        if prog.error is not None:
            self._refuse_run(ident, run_id, arg, prog.error)
            return
        if prog.client not in self.clients:
            self._reply(ident, m.RunFailed(run_id, ClientGone(
                f"client {prog.client} was disconnected (closed or silent too long)")))
            return
        # each island's scheduler orders that island's gangs of the run
        per_island: dict[int, list] = {}
        for e, (devs, island) in enumerate(zip(prog.gangs, prog.islands)):
            per_island.setdefault(island, []).append(Gang((pid, run_id, e), prog.client, devs))
        run = _Run(ident, pid, run_id, arg, prog, {i: tuple(g) for i, g in per_island.items()},
                   since=self._now)
        self.runs[(pid, run_id)] = run
        spans = len(run.programs) > 1
        for island, gangs in run.programs.items():
            self._released(self._scheduler(island).submit(gangs, spans_islands=spans))

    def _refuse_run(self, ident, run_id, arg, error) -> None:
        """A run that will never start: its client is told, and the hosts, where a reader
        (a save, a kernel of a later run) may already wait for one of its outputs."""
        self._reply(ident, m.RunFailed(run_id, error))
        outputs = list((getattr(arg, "outputs", None) or {}).values())
        if outputs:
            self._to_hosts(m.AbortGangs([], f"its run failed: {error}", outputs))

    def _scheduler(self, island: int) -> IslandScheduler:
        sched = self.schedulers.get(island)
        if sched is None:
            info = self.client_info
            if self.policy == "share":
                policy = ProportionalSharePolicy(
                    lambda c: info.get(c, {}).get("weight", 1.0), self.window)
            elif self.policy == "priority":
                policy = PriorityPolicy(lambda c: info.get(c, {}).get("priority", 0),
                                        self.window)
            else:
                policy = FifoPolicy()
            sched = self.schedulers[island] = IslandScheduler(island, policy)
        return sched

    def _released(self, releases) -> None:
        """Gangs the schedulers numbered: start each run whose gangs all have their numbers."""
        ready = []
        for (pid, run_id, e), seqs in releases:
            run = self.runs.get((pid, run_id))
            if run is None:
                continue
            run.seqs[e] = dict(seqs)
            if len(run.seqs) == len(run.prog.gangs) and not run.started:
                run.started = True
                ready.append(run)
        for run in ready:
            arg = dataclasses.replace(run.arg, seqs=run.seqs)
            self._out.append(StartRun((run.pid, run.run_id), run.prog.gid, arg))

    def run_began(self, key, t) -> None:
        """Run ``key`` started as Plaque run ``t`` of its program's graph (``status`` says
        where it is by it)."""
        run = self.runs.get(key)
        if run is not None:
            run.t = t

    def run_ended(self, key, error, results=(), now: float | None = None) -> None:
        """Run ``key`` (program id, run id) finished, or failed with ``error``; ``results``:
        the small results its kernels handed on (``RunDone``); ``now``: the time it ended
        (default: that of the last request or tick)."""
        run = self.runs.get(key)
        if run is None:
            return
        self._finished(run)
        error = self._explain(error)
        if error is None:
            self._reply(run.ident, m.RunDone(run.run_id, results))
            return
        self.errors.append(_error_record(run, error, self._now if now is None else now))
        self._reply(run.ident, m.RunFailed(run.run_id, error))
        # Kernels of this run still queued or waiting in collectives on surviving hosts
        # must not hold their devices until a timeout: fail their gangs now.
        self._abort([run], str(error), error)
        # Sequence numbers of this run whose kernels never reached a host (its START was
        # cut short) would stall their devices: skip them (no-op where they ran).
        self._skip(run.seqs, f"its run failed: {error}")

    def _abort(self, runs, reason: str, root=None) -> None:
        """Fail the gangs of these runs on every host (collectives and waiting kernels);
        ``root``: the runs' error, when it is a kernel's own (a RemoteError) or a lost host
        (HostLost: what readers of the runs' outputs get there too)."""
        gangs = [(run.prog.client, run.run_id, e) for run in runs
                 for e in range(len(run.prog.gangs))]
        outputs = [aid for run in runs for aid in run.arg.outputs.values()]
        if gangs:
            self._to_hosts(m.AbortGangs(gangs, reason, outputs, root if isinstance(
                root, (RemoteError, HostLost)) else None))

    def _explain(self, error):
        """What a client should see: a lost Plaque worker is a lost host, named; a kernel's
        own exception is said as the kernel's, not as the operator that carried it."""
        if isinstance(error, plaque.WorkerLost):
            return self._host_lost(error)
        origin = getattr(error, "origin", None)
        if isinstance(error, plaque.OperatorError) and isinstance(origin, dict):
            return RemoteError.from_origin(origin)
        return error

    def _host_lost(self, error: plaque.WorkerLost) -> HostLost:
        info = self.hosts.get(error.worker) or self._departed.get(error.worker, {})
        pid = info.get("pid", "?")
        where = info.get("hostname", "?") + ("" if pid is None else f" pid {pid}")
        return HostLost(f"host {error.worker} (island {info.get('island', '?')}, devices"
                        f" {info.get('device_ids', '?')}, {where}) was lost: {error}")

    def _finished(self, run: _Run) -> None:
        """The run is over: its programs leave the schedulers' windows."""
        if self.runs.pop((run.pid, run.run_id), None) is None:
            return
        for island, gangs in run.programs.items():
            self._released(self._scheduler(island).finished(gangs))

    def _skip(self, seqs, reason: str):
        """Tell hosts to skip sequence numbers of gangs that will never run, and why."""
        per_host: dict[int, dict] = {}
        owner = {d: w for w, h in self.hosts.items() for d in h["device_ids"]}
        for per_device in seqs.values():
            for d, s in per_device.items():
                if d in owner:
                    per_host.setdefault(owner[d], {}).setdefault(d, []).append(s)
        for w, skips in per_host.items():
            self._out.append(ToHost(w, m.SkipSeqs(skips, reason)))

    def _forget_client(self, client, reason: str) -> None:
        """A client left or was lost: its slices, its runs still waiting for the scheduler,
        its running gangs (aborted), and every buffer it owns on every host."""
        ident = self.clients.pop(client, None)
        if ident is None:
            return
        self._last_seen.pop(client, None)
        self._client_of.pop(ident, None)
        self.rm.release_client(client)
        self._held.pop(client, None)  # nobody waits for their ends any more
        self._to_hosts(m.ClientLeft(client, reason))
        self._replies(self.preemptions.forget(client))
        self._abort([run for run in self.runs.values()
                     if run.prog.client == client and run.started], reason)
        gone = set()
        for sched in self.schedulers.values():
            gone.update((pid, run_id) for pid, run_id, _ in sched.drop_client(client))
        for key in gone:
            run = self.runs.get(key)
            if run is None:
                continue
            self._skip(run.seqs, reason)  # gangs numbered on another island never run
            self._finished(run)
        self.client_info.pop(client, None)

    _HANDLERS = {m.Ping: _ping, m.Info: _info, m.Hello: _hello, m.ListDevices: _devices,
                 m.AllocateMesh: _mesh, m.Remap: _remap, m.Suspend: _suspend,
                 m.CancelSuspend: _cancel_suspend, m.Resume: _resume, m.Status: _status,
                 m.InstallProgram: _install, m.RunProgram: _run, m.Bye: _bye}

