"""A worker as a state machine: frames in, commands out. No sockets, threads or clocks inside.

The adapter (``endpoint.py``) feeds received frames to ``receive``, calls ``step`` to run local
work (tuples between shards of this worker, completion notifications) and ``tick`` with the
time, then carries out the commands returned by ``take_commands`` (``plaque.commands``:
``Send``, ``Connect``, ``Disconnect``, ``Exit``).

Everything produced in one turn (between two ``take_commands``) leaves together: one data
message per peer (split only when very large) and one progress message per peer.
"""

from __future__ import annotations

import logging
import traceback
from collections import deque

import cloudpickle

from . import wire
from .commands import Connect, Disconnect, Exit, Send
from .counters import Counters
from .heartbeat import HEARTBEAT_INTERVAL
from .liveness import GRACE_TIMEOUTS, Listening
from .local_graph import LocalGraph
from .logutil import dropped
from .operator import Capability
from .outbox import Outbox
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
from .progress import CAP, INPUT, SINK, ChangeBatch
from .wire import CONTROL, COORDINATOR, DATA, UNKNOWN_SENDER, Kind

log = logging.getLogger("plaque.worker")


def str_hash_probe() -> int:
    """``hash()`` of a fixed string: equal in two processes iff they hash text alike."""
    return hash("plaque: is PYTHONHASHSEED the same everywhere?")


MAX_OUTPUTS_WITH_PROGRESS = 64  # a turn's outputs ride on its progress report if this few ...
MAX_REPORT_BYTES = 16384  # ... and this small (control messages are never behind bulk data)


class WorkerCore:
    """The worker's logic. ``address`` is where peers reach this worker's transport."""

    def __init__(self, address: str, coordinator_address: str, info=None,
                 coordinator_timeout: float = 10.0, services=None):
        self.id: int | None = None
        self.services = services if services is not None else {}
        self.wakeup = None  # set by the adapter: thread-safe "run a turn soon"
        self.on_user = None  # callback(sender, payload) for USER messages (embedding runtime)
        self._posted: deque = deque()
        self._wake_pending = False
        self.address = address
        self.info = info or {}
        self.coordinator_timeout = coordinator_timeout
        self._listening = Listening(GRACE_TIMEOUTS * coordinator_timeout)
        self.counters = Counters()
        self.graphs: dict[int, LocalGraph] = {}
        self.peers: dict[int, str] = {}
        self._commands: list = [Connect(COORDINATOR, coordinator_address)]
        self.coordinator_control = coordinator_address.split("|")[0]
        self.outbox = Outbox()  # this turn's tuples, by destination
        self._outputs: list = []
        self._last_heard = None  # when we last heard the coordinator (see tick)
        self._heard = True  # something came from the coordinator since the last tick
        self._heard_at = None  # when the adapter handed us the latest of it, if it said
        self._last_beat = None
        self.last_tick = None
        self.exited = False
        self._send(COORDINATOR, CONTROL, Kind.HELLO,
                   Hello(address, self.info, str_hash_probe()).wire())

    # ---- carrying out -------------------------------------------------------------------
    def take_commands(self) -> list:
        """Everything to do now: buffered tuples and progress become messages here."""
        self._commit()
        self._flush_data()
        self._flush_progress()
        self.outbox.end_turn()
        cmds, self._commands = self._commands, []
        return cmds

    def _send(self, peer, channel, kind, payload, tuples=0) -> None:
        frames = wire.encode(kind, UNKNOWN_SENDER if self.id is None else self.id, payload)
        self.counters.peer(peer).count_sent(frames, kind is Kind.PROGRESS, tuples)
        self._commands.append(Send(peer, channel, frames))

    def _flush_data(self) -> None:
        """One DATA message per peer (split when very large)."""
        for peer, messages in self.outbox.messages().items():
            for msg, count in messages:
                self._send(peer, DATA, Kind.DATA, msg, tuples=count)

    def _flush_progress(self) -> None:
        """One progress message per peer per turn; the coordinator, which only needs to know
        when a run is over, gets each timestamp's changes once, when this worker is done
        with it (its capabilities there are among them, so it cannot conclude early)."""
        per_peer: dict[int, dict] = {}
        for gid, g in self.graphs.items():
            if not g.outgoing:
                continue
            interested, me = g.interested, self.id
            for key, delta in g.outgoing.drain():
                for w in interested[(key[1], key[2])]:
                    if w != me:
                        per_peer.setdefault(w, {}).setdefault(gid, []).append((key, delta))
        for peer, body in per_peer.items():
            self._send(peer, CONTROL, Kind.PROGRESS, body)
        to_coordinator = {}
        for gid, g in self.graphs.items():
            # timestamps finished here, and late input consumed by non-notified shards after
            # their timestamp finished (so changes made after the report are reported too)
            due = [t for t in g.for_coordinator if t in g.retired] if g.eager else []
            if g.finished or due:
                changes = []
                for t in (*g.finished, *due):
                    batch = g.for_coordinator.pop(t, None)
                    if batch:
                        changes.extend(batch.drain())
                g.finished.clear()
                if changes:
                    to_coordinator[gid] = changes
        outputs, self._outputs = self._outputs, []
        if to_coordinator and outputs and len(outputs) <= MAX_OUTPUTS_WITH_PROGRESS:
            frames = wire.encode(Kind.REPORT, self.id, Report(to_coordinator, outputs).wire())
            if wire.frame_bytes(frames) <= MAX_REPORT_BYTES:  # small: one message, not two
                self.counters.peer(COORDINATOR).count_sent(frames, True, len(outputs))
                self._commands.append(Send(COORDINATOR, CONTROL, frames))
                return
        if outputs:
            self._send(COORDINATOR, DATA, Kind.OUTPUT, outputs, tuples=len(outputs))
        if to_coordinator:
            self._send(COORDINATOR, CONTROL, Kind.PROGRESS, to_coordinator)

    # ---- input ----------------------------------------------------------------------------
    def receive(self, frames, at: float | None = None) -> None:
        """Handle one message; a malformed one is logged and dropped. ``at``: the adapter's
        time now, if it tells it (else a message from the coordinator counts as heard at the
        next tick, which a loop busy with work of its own may hold up for long)."""
        try:
            kind, sender, payload = wire.decode(frames)
            handler = self._handlers[kind]
        except Exception as exc:
            self.counters.peer(UNKNOWN_SENDER).dropped += 1
            dropped(log, "a bad message", "worker %s: %s", self.id, exc)
            return
        c = self.counters.peer(sender)
        c.count_received(frames, kind is Kind.PROGRESS)
        if sender == COORDINATOR:
            self._heard = True  # the core has no clock: the next tick stamps it
            self._heard_at = at
        try:
            handler(self, sender, payload)
        except Exception as exc:
            c.dropped += 1
            dropped(log, f"a {kind.name} message it could not apply", "worker %s: %r", self.id,
                    exc)

    def _on_welcome(self, sender, payload):
        if self.id is not None:  # the coordinator welcomes a worker once: this is a replay
            raise ValueError(f"already joined as worker {self.id}")
        welcome = Welcome.of(payload)
        self.id = self.outbox.me = int(welcome.worker)
        if welcome.coordinator_address:  # we may have joined with the control endpoint only
            self._commands.append(Connect(COORDINATOR, str(welcome.coordinator_address)))
        log.info("joined as worker %d", self.id)

    def _on_peers(self, sender, peers):
        peers = {int(k): str(v) for k, v in dict(peers).items() if int(k) != self.id}
        for gone in set(self.peers) - set(peers):
            self._commands.append(Disconnect(gone))
        for pid, addr in peers.items():
            if self.peers.get(pid) != addr:
                self._commands.append(Connect(pid, addr))
        self.peers = peers

    def _on_install(self, sender, payload):
        install = Install.of(payload)
        gid = install.gid
        try:
            graph, placement = cloudpickle.loads(install.blob)
            self.graphs[gid] = LocalGraph(gid, graph, placement, self.id, self, self.services)
            error = None
        except Exception:
            error = traceback.format_exc()
        self._send(COORDINATOR, CONTROL, Kind.INSTALLED, InstallReply(gid, error).wire())

    def _on_uninstall(self, sender, gid):
        self.graphs.pop(gid, None)

    def _on_start(self, sender, payload):
        start = Start.of(payload)
        g, t, arg = self.graphs[start.gid], start.t, start.arg
        g.tracker.update(((CAP, n, s, t), 1) for n, s in g.tracked)
        g.args[t] = arg
        if start.parts:
            g.parts[t] = start.parts
        if start.stream is not None:
            g.stream_of[t] = start.stream
        g.live[t] = set(g.ops)
        for shard in g.ops:
            if g.graph.nodes[shard[0]].notify:
                g.pending.setdefault(shard, []).append(t)
                g.unchecked.add(shard)
        for node, shards, together in g.starts:
            for _, _, ctx in shards:
                ctx.arg, ctx.t = arg, t
            if together is not None:  # the node's shards here start as one
                try:
                    if together[0][0].on_start_shards(together, t) is not False:
                        continue
                except Exception as exc:  # the run fails: one report says so
                    self.report(g, node, shards[0][0], t, exc)
                    continue
            for shard, op, ctx in shards:
                on_start = getattr(op, "on_start", None)
                if on_start is None:
                    continue
                try:
                    on_start(ctx, t)
                except Exception as exc:
                    self.report(g, node, shard, t, exc)
        for node, shard, port, values in g.early.pop(t, ()):
            self._deliver(g, node, shard, port, t, values)
        for node, shard in [k for k in g.ops if not g.graph.nodes[k[0]].notify]:
            self._settle(g, node, shard, t)  # never notified: done unless it holds on
        if not g.ops:
            self._finish_timestamp(g, t)

    def _on_data(self, sender, batch):
        for (gid, node, shard, port, t), values in batch:
            self.counters.peer(sender).tuples_received += len(values)
            g = self.graphs.get(gid)
            if g is None:
                continue
            if t not in g.args:  # START comes on another channel: hold until it does
                g.early.setdefault(t, []).append((node, shard, port, values))
                continue
            self._deliver(g, node, shard, port, t, values)

    def _on_progress(self, sender, body):
        for gid, changes in body.items():
            g = self.graphs.get(gid)
            if g is not None:
                g.apply(changes)

    def _on_feed(self, sender, payload):
        feed = Feed.of(payload)
        g = self.graphs.get(feed.gid)
        cap = g.inputs.get((feed.node, feed.shard, feed.t)) if g is not None else None
        if cap is None:  # uninstalled, or the epoch already advanced: the driver refuses that
            raise ValueError(f"no open epoch {feed.t} of input {feed.node}[{feed.shard}]")
        try:
            cap.emit_batch(feed.values, keys=feed.keys)
        except Exception as exc:
            self.report(g, feed.node, feed.shard, feed.t, exc)

    def _on_advance(self, sender, payload):
        adv = Advance.of(payload)
        g = self.graphs.get(adv.gid)
        if g is None:
            return
        for node, shard in g.ops:
            cap = g.inputs.pop((node, shard, adv.t), None)
            if cap is not None:
                cap.release()
        if adv.last:
            if adv.t in g.live:
                g.stream_last[adv.stream] = adv.t  # dropped when this worker finishes t
            else:
                g.drop_stream(adv.stream)

    def _on_heartbeat(self, sender, payload):
        pass

    def _on_counters(self, sender, request_id):
        reply = CountersReply(request_id, self.counters.snapshot())
        self._send(COORDINATOR, CONTROL, Kind.COUNTERS, reply.wire())

    def _on_user(self, sender, payload):
        if self.on_user is not None:
            self.on_user(sender, payload)

    def frontier(self) -> dict:
        """Where this worker's shards are in the runs in flight here: ``{gid: {"nodes":
        {node name: shards}, "runs": {t: {node name: shards here whose capability at t is
        not dropped}}}}``, graphs with runs in flight only; a node missing from a run's dict
        has no shard here left in it (exact for this worker's own shards)."""
        out = {}
        for gid, g in self.graphs.items():
            if not g.live:
                continue
            nodes = g.graph.nodes
            runs = {}
            for t, live in g.live.items():
                counts: dict[str, int] = {}
                for node, _ in live:
                    counts[nodes[node].name] = counts.get(nodes[node].name, 0) + 1
                runs[t] = counts
            out[gid] = {"nodes": {n.name: n.shards for n in nodes}, "runs": runs}
        return out

    def send_user(self, peer: int, payload, channel: int = DATA) -> None:
        """Send ``payload`` to worker ``peer`` (or -1, the coordinator); call on the loop."""
        self._send(peer, channel, Kind.USER, payload)

    def call_soon(self, fn) -> None:
        """Thread-safe: run ``fn()`` on the worker's loop at the next turn."""
        self._posted.append((None, fn))
        self._wake()

    def _wake(self) -> None:
        # One wake-up per batch of posts: the flag is cleared before the loop drains them.
        if not self._wake_pending and self.wakeup is not None:
            self._wake_pending = True
            self.wakeup()

    def _on_stop(self, sender, reason):
        self._exit(f"stopped by coordinator: {reason}")

    _handlers = {
        Kind.WELCOME: _on_welcome, Kind.PEERS: _on_peers, Kind.INSTALL: _on_install,
        Kind.UNINSTALL: _on_uninstall, Kind.START: _on_start, Kind.DATA: _on_data,
        Kind.PROGRESS: _on_progress, Kind.HEARTBEAT: _on_heartbeat,
        Kind.COUNTERS: _on_counters, Kind.STOP: _on_stop, Kind.USER: _on_user,
        Kind.FEED: _on_feed, Kind.ADVANCE: _on_advance,
    }

    # ---- operators ------------------------------------------------------------------------
    def _deliver(self, g, node, shard, port, t, values) -> None:
        op, ctx = g.ops[(node, shard)]
        if t not in g.failed:
            ctx.arg, ctx.t = g.args.get(t), t
            try:
                on_batch = getattr(op, "on_batch", None)
                if on_batch is not None:
                    on_batch(ctx, t, port, values)
                else:  # an operator not derived from Operator: the per-tuple form only
                    for v in values:
                        op.on_input(ctx, t, port, v)
            except Exception as exc:
                self.report(g, node, shard, t, exc)
        self._change(g, (INPUT, node, shard, t), -len(values))

    def _deliver_local(self) -> None:
        """Hand the tuples sent to shards of this worker to them, until none are left."""
        moved = True
        while moved:
            moved = False
            self.outbox.flush_combined()  # folded pairs of combining edges into their buckets
            for b in list(self.outbox.local):
                if b:
                    moved = True
                    g = b.graph
                    _, node, shard, port, t = b.key
                    chunks = self.outbox.take(b)
                    if self.graphs.get(g.gid) is not g:
                        continue  # uninstalled meanwhile: nothing to deliver to
                    for chunk in chunks:
                        self._deliver(g, node, shard, port, t, chunk)

    def hold_capability(self, g, node, shard, t):
        """``ctx.hold()`` of shard ``(node, shard)`` of ``g`` at t: a ``Capability``."""
        key = (node, shard, t)
        if (node, shard) not in g.live.get(t, ()):
            n = g.graph.nodes[node]
            why = "" if n.notify else (": it is never notified (notify=False, or no on_complete),"
                                       " so its capability goes when on_start returns; hold it"
                                       " there, or give the node notify=True")
            raise RuntimeError(f"shard {shard} of {n.name!r} has no capability for t={t} (not"
                               f" started, or already complete){why}")
        g.holds[key] = g.holds.get(key, 0) + 1
        return Capability(self, g.ops[(node, shard)][1], t)

    def release_capability(self, g, node, shard, t) -> None:
        """``Capability.release()``: once the last hold goes, a completed shard is done."""
        key = (node, shard, t)
        g.holds[key] -= 1
        if not g.holds[key]:
            del g.holds[key]
            if key in g.held_complete:
                g.held_complete.discard(key)
                self._drop_capability(g, node, shard, t)

    def post(self, cap, fn) -> None:
        """Thread-safe: queue ``fn(cap)`` to run on the worker's loop at the next turn."""
        self._posted.append((cap, fn))
        self._wake()

    def _run_posted(self) -> None:
        self._wake_pending = False
        while self._posted:
            cap, fn = self._posted.popleft()
            if cap is None:
                try:
                    fn()
                except Exception:
                    log.exception("worker %s: a posted call failed", self.id)
                continue
            graph = cap.ctx.local_graph
            if self.graphs.get(graph.gid) is not graph:
                continue  # graph uninstalled meanwhile
            try:
                fn(cap)
            except Exception as exc:
                ctx = cap.ctx
                self.report(ctx.local_graph, ctx.node_index, ctx.shard, cap.t, exc)
                if not cap.released:
                    cap.release()

    def add_output(self, g, node, shard, t, value) -> None:
        """``ctx.output(value)``: for the driver, with this turn's outputs."""
        self._change(g, (INPUT, SINK, 0, t), 1)
        self._outputs.append((g.gid, node, shard, t, value))

    def _change(self, g, key, delta) -> None:
        g.staged.add(key, delta)

    def _commit(self) -> None:
        """Apply staged changes to the local copy and queue them for the peers, atomically.

        Staging keeps the per-tuple cost to one dict update; committing before every
        completion test keeps the local copy exact where it matters.
        """
        self.outbox.count()
        for g in self.graphs.values():
            if g.staged:
                changes = g.staged.drain()
                g.apply(changes)
                for key, delta in changes:
                    if key[1] != SINK:
                        g.outgoing.add(key, delta)
                    t = key[3]
                    batch = g.for_coordinator.get(t)
                    if batch is None:
                        batch = g.for_coordinator[t] = ChangeBatch()
                    batch.add(key, delta)

    def report(self, g, node, shard, t, exc) -> None:
        """Fail run ``t`` of ``g``: shard ``shard`` of ``node`` raised ``exc``; the
        coordinator is told (the run's later handlers here are skipped)."""
        g.failed.add(t)
        name = g.graph.nodes[node].name
        tb = "".join(traceback.format_exception(exc))
        log.info("operator %s[%d] failed at t=%s: %r", name, shard, t, exc)
        # an error that knows its own origin (e.g. a kernel's exception it wraps) says so
        report = ErrorReport(g.gid, t, name, shard, self.id, repr(exc), tb,
                             getattr(exc, "origin", None))
        self._send(COORDINATOR, CONTROL, Kind.ERROR, report.wire())

    def step(self) -> None:
        """Run local work until nothing is left: local tuples, then due notifications."""
        while True:
            self._run_posted()
            self._deliver_local()
            if not self._notify_due():
                return

    def _notify_due(self) -> bool:
        self._commit()
        fired = False
        for g in list(self.graphs.values()):
            dropped = g.tracker.dropped
            if not dropped and not g.unchecked:
                continue
            candidates, g.unchecked = g.unchecked, set()
            for w in dropped:
                candidates.update(g.waiting_on.pop(w, ()))
            dropped.clear()
            for shard_key in candidates:
                fired |= self._test_shard(g, shard_key)
        return fired

    def _test_shard(self, g, shard_key) -> bool:
        """Complete ``shard_key`` for each of its timestamps that is complete, in order."""
        ts = g.pending.get(shard_key)
        fired = False
        while ts:
            w = g.tracker.blocker(shard_key[0], shard_key[1], ts[0])
            if w is not None:
                g.waiting_on.setdefault(w, set()).add(shard_key)
                break
            self._complete(g, shard_key, ts.pop(0))
            fired = True
        if ts is not None and not ts:
            del g.pending[shard_key]
        return fired

    def _complete(self, g, shard_key, t) -> None:
        node, shard = shard_key
        op, ctx = g.ops[shard_key]
        if t not in g.failed:
            ctx.arg, ctx.t = g.args.get(t), t
            try:
                op.on_complete(ctx, t)
            except Exception as exc:
                self.report(g, node, shard, t, exc)
        self._settle(g, node, shard, t)

    def _settle(self, g, node, shard, t) -> None:
        """The shard is done with t unless it holds its capability; then at release."""
        if (node, shard, t) in g.holds:
            g.held_complete.add((node, shard, t))
        else:
            self._drop_capability(g, node, shard, t)

    def _drop_capability(self, g, node, shard, t) -> None:
        g.ops[(node, shard)][1].run_states.pop(t, None)  # the shard's state for t goes with it
        live = g.live[t]
        live.discard((node, shard))
        self._change(g, (CAP, node, shard, t), -1)
        if not live:
            self._finish_timestamp(g, t)

    def _finish_timestamp(self, g, t) -> None:
        g.finished.append(t)
        del g.live[t]
        g.failed.discard(t)
        stream = g.stream_of.get(t)
        if stream is not None and g.stream_last.get(stream) == t:
            g.drop_stream(stream)  # the stream's last epoch: its keyed state goes
        if not g.eager:
            g.args.pop(t, None)
            g.parts.pop(t, None)
            g.stream_of.pop(t, None)
            return
        # Shards that are never notified may still get input for t: keep its argument for
        # a while (input with no argument would wait for a START that already came).
        g.retired[t] = None
        while len(g.retired) > LocalGraph.RETIRED_KEPT:
            old, _ = g.retired.popitem(last=False)
            g.args.pop(old, None)
            g.parts.pop(old, None)
            g.stream_of.pop(old, None)
            for ctx in g.unnotified_states.pop(old, ()):
                ctx.run_states.pop(old, None)

    # ---- time -----------------------------------------------------------------------------
    def tick(self, now: float, heard_until: float | None = None,
             stalled: float | None = None) -> None:
        """Send heartbeats; give up if the coordinator has been silent too long.

        Silence counts only while we could hear (``plaque.liveness``): up to ``heard_until``,
        the latest time the adapter found our inbox empty (None: ``now``), and not over our
        own stalls (``stalled``: the process's by a ``StallMeter``; None: a late tick is one).
        """
        self.last_tick = now  # read by the heartbeat thread: the loop is alive
        blind, listened = self._listening.tick(now, heard_until, stalled)
        if self._heard:
            heard = now if self._heard_at is None else self._heard_at
            self._heard, self._heard_at, self._last_heard = False, None, heard
        if self._last_heard is not None:  # our own stall is not the coordinator's silence
            self._last_heard = min(self._last_heard + blind, now)
        if self.id is not None and (self._last_beat is None
                                    or now - self._last_beat >= HEARTBEAT_INTERVAL):
            self._last_beat = now
            self._send(COORDINATOR, CONTROL, Kind.HEARTBEAT, now)
        if listened - self._last_heard > self.coordinator_timeout:
            self._exit(f"coordinator silent for {listened - self._last_heard:.1f} s")

    def _exit(self, reason) -> None:
        if not self.exited:
            self.exited = True
            log.info("worker %s exiting: %s", self.id, reason)
            self._commands.append(Exit(reason))
