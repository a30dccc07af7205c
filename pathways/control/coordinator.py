"""The Pathways coordinator: the control plane on sockets and a Plaque cluster.

The decisions (resource manager, one gang scheduler per island, programs, runs, client
liveness) are the sans-IO ``ControlPlane`` (``pathways.control.plane``); this adapter feeds it
and carries out what it decides, all on the Plaque cluster's event loop. It embeds a Plaque
cluster (hosts are its workers) and serves clients on a ROUTER socket. A client's program is
installed once as a Plaque graph; each run is one message from the client, sequenced by the
island's scheduler (every gang of the run gets its sequence number on each of its devices) and
started with one START message per host. The client learns the end of the run from here; its
data it fetches from the hosts.
"""

from __future__ import annotations

import logging
import time

import zmq

import plaque
from plaque import security
from plaque.events import Membership
from plaque.zmq_transport import context_for

from ..lowering.wire import rebuild
from ..service import RouterService
from .plane import POLICIES, ControlPlane, InstallGraph, RefuseHost, Reply, StartRun, ToHost

__all__ = ["POLICIES", "Coordinator"]

log = logging.getLogger("pathways.control.coordinator")


class Coordinator:
    """``bind``: ``tcp://HOST`` (``port`` 0: a free one) or ``"inproc"`` (the in-process
    twin: Plaque and clients within this process).

    What it runs on can be given (a simulated cluster, ``pathways.simulated``, gives all
    three): ``cluster``, the Plaque cluster whose loop everything here runs on (default: one
    bound at ``bind``, with ``heartbeat_timeout``); ``serve(on_request, after_batch)``, the
    clients' socket, calling ``on_request(ident, request)`` on that loop (default: a
    ``RouterService`` at ``bind`` and ``port``); ``clock``, the time client liveness is
    counted in (default: ``time.monotonic``)."""

    def __init__(self, bind: str = "tcp://127.0.0.1", heartbeat_timeout: float = 3.0,
                 policy: str = "fifo", window: int = 8, client_timeout: float = 5.0,
                 port: int = 0, *, cluster: plaque.Cluster | None = None, serve=None,
                 clock=time.monotonic):
        self._check_every = min(1.0, client_timeout / 4)
        self.plane = ControlPlane(policy, window, client_timeout, self._check_every)
        self.ctx = None  # the ZeroMQ context of the clients' socket, if it has one
        self._own_ctx = False
        self._now = clock
        self.cluster = cluster if cluster is not None else \
            plaque.Cluster(bind, heartbeat_timeout=heartbeat_timeout)
        try:
            self.service = (serve or self._router(bind, port))(self.on_request,
                                                               self.cluster.soon)
        except BaseException:
            self.cluster.close()
            raise
        self.address = self.service.address
        self.plane.addresses = {"plaque": self.cluster.address, "clients": self.address}
        self.cluster.listeners.append(self._on_cluster_event)
        self.cluster.call_soon(lambda: self.service.start(self.cluster.loop))
        self.cluster.call_soon(self._check_clients)

    def _router(self, bind: str, port: int):
        """The default ``serve``: a ROUTER socket at ``bind`` (and ``port``)."""
        if bind == "inproc":
            self.ctx, self._own_ctx = context_for("inproc://")
            where = "inproc://pathways-coordinator/"
        else:
            self.ctx, self._own_ctx = zmq.Context(), True
            if bind.startswith("ipc://"):  # a fresh name in the directory (no port)
                where = bind if bind.endswith("/") else f"{bind}/"
            else:
                where = bind if bind.startswith("tcp://") else "tcp://127.0.0.1"
                where = f"{where}:{port}" if port else where  # else a free port
        return lambda on_request, after_batch: RouterService(
            self.ctx, where, on_request, sender=-1, after_batch=after_batch)

    def close(self):
        try:
            self.cluster.call_soon(self.service.close)
        except Exception:
            pass
        self.cluster.close()
        self.service.close()
        if self.ctx is not None:
            security.release(self.ctx)
            if self._own_ctx:
                self.ctx.term()

    # ---- inputs (all on the cluster's loop) -------------------------------------------------
    def on_request(self, ident, req) -> None:
        """A client's request (on the cluster's loop)."""
        self.plane.request(ident, req, self._now())
        self._carry_out()

    def _on_cluster_event(self, ev) -> None:
        if not isinstance(ev, Membership):
            return
        core = self.cluster.core
        self.plane.hosts_live({w: core.workers[w].info for w in ev.workers})
        self._carry_out()

    def _check_clients(self) -> None:
        """Every second or so: time passes for the plane. Silence counts only while we could
        hear: up to the last time nothing waited unread on the client socket."""
        now = self._now()
        self.plane.tick(now, self.service.drained_at if self.service.waiting() else now)
        self._carry_out()
        self.cluster.loop.call_later(self._check_every, self._check_clients)

    # ---- outputs ------------------------------------------------------------------------------
    def _carry_out(self) -> None:
        """Do what the plane decided (which may decide more), until nothing is left; wake
        the Plaque loop once for whatever went to hosts."""
        to_hosts = False
        while commands := self.plane.take():
            for c in commands:
                to_hosts |= isinstance(c, ToHost)
                self._DO[type(c)](self, c)
        if to_hosts:
            self.cluster.soon()

    def _reply(self, c: Reply) -> None:
        self.service.reply(c.ident, c.msg)

    def _to_host(self, c: ToHost) -> None:
        self.cluster.core.send_user(c.worker, c.msg)

    def _refuse(self, c: RefuseHost) -> None:
        self.cluster.core.lose_worker(c.worker, c.reason)

    def _install(self, c: InstallGraph) -> None:
        def installed(gid, error):
            self.plane.installed(c.pid, gid, error)
            self._carry_out()

        try:
            graph = rebuild(c.nodes, c.edges, c.blob, self.cluster.core.live_workers())
            self.cluster.install_async(graph, installed)
        except Exception as exc:
            self.plane.installed(c.pid, None, exc)

    def _start(self, c: StartRun) -> None:
        def done(result, error):
            small = () if result is None else tuple(
                value for shards in result.outputs.values() for values in shards.values()
                for value in values)
            self.plane.run_ended(c.key, error, small, self._now())
            self._carry_out()

        try:
            self.plane.run_began(c.key, self.cluster.start_async(c.gid, c.arg, done))
        except Exception as exc:
            self.plane.run_ended(c.key, exc, now=self._now())

    def devices(self) -> list[dict]:
        return self.plane.devices()

    _DO = {Reply: _reply, ToHost: _to_host, RefuseHost: _refuse, InstallGraph: _install,
           StartRun: _start}
