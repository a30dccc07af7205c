"""The in-process twin of a local cluster: the coordinator and every host as threads of this
process (``pw.local_cluster(processes=False)``).

Nothing is stubbed: the coordinator is the real one with its Plaque cluster on Plaque's
in-process transport, each host runs ``serve_host`` on an event loop of its own thread, and
clients, data services and ICI links talk over ZeroMQ ``inproc://`` sockets of the process's
shared context. Every message is still encoded, framed and copied as between processes; only
process start-up, TCP and CURVE are left out (no socket of the twin is reachable from outside
this process, so there is nothing to authenticate). Hosts share this process's GIL, so the
twin is for tests, notebooks and examples, not for measuring speed.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import uvloop

from .control.coordinator import Coordinator
from .errors import PathwaysError
from .host.process import serve_host
from .program.cost import DeviceSpec

log = logging.getLogger("pathways.twin")

JOIN_TIMEOUT = 10.0  # seconds a host thread gets to finish once told to stop
STOP_GRACE = 2.0  # seconds a host gets to stop by itself once its coordinator closed


class ThreadHost:
    """One host of the twin: ``serve_host`` on its own event loop in a daemon thread."""

    def __init__(self, coordinator: str, island: int, devices: int, hbm_gib: float,
                 kernel_limit: float | None):
        self.reason: str | None = None  # why it stopped, once it has
        self._loop = uvloop.new_event_loop()
        self._task = None
        spec = DeviceSpec(hbm_bytes=int(hbm_gib * 2**30))
        self.thread = threading.Thread(
            target=self._serve, args=(coordinator, island, devices, spec, kernel_limit),
            name=f"pathways-host-island{island}", daemon=True)
        self.thread.start()

    def _serve(self, coordinator, island, devices, spec, kernel_limit) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self._task = loop.create_task(serve_host(coordinator, island, devices, "inproc://",
                                                     spec=spec,
                                                     kernel_limit=kernel_limit or None))
            self.reason = loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            self.reason = "stopped by its cluster"
        except BaseException as exc:  # a thread's exception would vanish: keep and log it
            self.reason = f"failed: {exc!r}"
            log.exception("an in-process host failed")
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        """Stop the host from outside (one its coordinator lost is not told to stop)."""
        if self.thread.is_alive() and self._task is not None:
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:
                pass  # its loop closed meanwhile: it has stopped

    def join(self, timeout: float = JOIN_TIMEOUT) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise PathwaysError(f"an in-process host did not stop within {timeout:g} s")


class Twin:
    """A coordinator in this process (``bind="inproc"``) and the hosts added to it."""

    def __init__(self, heartbeat_timeout, policy, window, client_timeout):
        self.coordinator = Coordinator("inproc", heartbeat_timeout=heartbeat_timeout,
                                       policy=policy, window=window,
                                       client_timeout=client_timeout)
        self.address = self.coordinator.address
        self.hosts: list[ThreadHost] = []

    def add_host(self, island: int, devices: int, hbm_gib: float,
                 kernel_limit: float | None) -> ThreadHost:
        host = ThreadHost(self.address, island, devices, hbm_gib, kernel_limit)
        self.hosts.append(host)
        return host

    def failed(self) -> bool:
        """Whether a host thread has already stopped (while the cluster is starting)."""
        return any(not h.alive() for h in self.hosts)

    def close(self) -> None:
        """Stop the coordinator, which tells every host to stop, then wait for the hosts."""
        self.coordinator.close()
        for host in self.hosts:
            host.thread.join(STOP_GRACE)
            host.stop()  # still running: its coordinator had lost it, so never told it
        stuck = []
        for host in self.hosts:
            try:
                host.join()
            except PathwaysError as exc:
                stuck.append(exc)
        if stuck:
            raise stuck[0]
