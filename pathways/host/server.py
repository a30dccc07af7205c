"""A host process: a Plaque worker, an object store, and D emulated TPUs.

The host joins the coordinator's Plaque cluster (it is a Plaque worker whose operators are
kernel shards), learns its global device ids from the resource manager, and serves clients
directly on its own data socket (put, get, delete) so that array data never passes through
the coordinator. One executor thread runs all of the host's devices (``pathways.host.executor``);
collectives between devices of different hosts travel over the ICI link straight from
executor to executor; within a host they are memory handoffs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
from collections import deque

import numpy as np
import zmq

import plaque
from plaque import security
from plaque.endpoint import serve_worker_core
from plaque.logutil import dropped
from plaque.transport import InprocTransport
from plaque.worker import WorkerCore
from plaque.zmq_transport import ZmqTransport, context_for

from .. import checkpoint_format, protocol
from ..errors import ClientGone, DeviceOutOfMemory, PathwaysError, ProgramError, RemoteError
from ..program import jax_body
from ..program.cost import DeviceSpec
from ..service import RouterService
from .device import EmulatedDevice
from .exchange import ExecutorEnv
from .executor import KERNEL_LIMIT, Executor
from .ici import IciLink
from .object_store import ObjectStore

log = logging.getLogger("pathways.host.server")

SWITCH_INTERVAL = 0.0005
TRANSFERS_KEPT = 10_000


class Host:
    def __init__(self, island: int, num_devices: int, spec: DeviceSpec | None = None,
                 kernel_limit: float | None = KERNEL_LIMIT):
        self.island, self.num_devices = island, num_devices
        self.spec = spec or DeviceSpec()
        self.devices: dict[int, EmulatedDevice] = {}
        self.store = ObjectStore(self.devices)
        self.executor = Executor("host", store=self.store, kernel_limit=kernel_limit)
        self.worker_of: dict[int, int] = {}  # device -> host worker id (kept in place)
        self._flat: dict[tuple, dict] = {}  # mesh devices -> {flat index: device}
        self._released: deque = deque()  # capabilities to release on the loop
        self._release_posted = False
        self.core: WorkerCore | None = None
        self.loop = None
        self.started = time.monotonic()
        self.ici = None  # IciLink, set when serving
        self._uses: dict = {}  # buffer key -> users done with it so far
        self.transfers: deque = deque(maxlen=TRANSFERS_KEPT)  # (device, name, labels, start, end)
        self._uses_lock = threading.Lock()

    # ---- devices and kernels (called from the loop or the executor thread) ---------------
    def enqueue(self, device: int, seq: int, kernel) -> None:
        self.devices[device].enqueue(seq, kernel)

    def kernel_env(self, mesh, flat_index: int, gang_key, device) -> ExecutorEnv:
        """Executor thread: where the collectives of the kernel running on ``device`` go."""
        flat = self._flat.get(mesh.ids)
        if flat is None:
            flat = self._flat[mesh.ids] = dict(enumerate(mesh.ids))
        return ExecutorEnv(mesh.axis_sizes, mesh.axis_names, flat_index, flat, gang_key,
                           self.executor, device.current)

    def current_end(self, device: int) -> float:
        """Executor thread: the modelled end of the kernel finishing on ``device``."""
        return self.devices[device].current.end

    def post_release(self, cap) -> None:
        """Executor thread: release ``cap`` on the loop; one loop wake for a whole turn's."""
        self._released.append(cap)
        if not self._release_posted:
            self._release_posted = True
            self.core.call_soon(self._release_all)

    def _release_all(self) -> None:
        self._release_posted = False
        while self._released:
            cap = self._released.popleft()
            if cap.valid:  # not uninstalled meanwhile
                cap.release()

    def abort_gang(self, gang_key, devices, reason) -> None:
        """Executor thread: stop this gang's collectives here and on its other hosts."""
        self.executor.abort_gang(gang_key, reason)
        workers = {self.worker_of[d] for d in devices if d in self.worker_of} - {self.core.id}
        msg = protocol.AbortGang(gang_key, reason)
        for w in workers:
            self.core.call_soon(lambda w=w: self.core.send_user(w, msg))

    def release(self, key, uses: int) -> None:
        """One user of ``key`` is done with it; the last of ``uses`` users frees it."""
        with self._uses_lock:
            n = self._uses.get(key, 0) + 1
            if n < uses:
                self._uses[key] = n
                return
            self._uses.pop(key, None)
        self.store.delete(key)

    # ---- messages from the coordinator and peers (loop thread) ----------------------------
    def on_user(self, sender, msg) -> None:
        """A message from the coordinator or a peer host, by its class (``_COMMANDS``)."""
        handler = self._COMMANDS.get(type(msg))
        if handler is None:
            log.warning("unknown message %s from %s", type(msg).__name__[:80], sender)
            return
        handler(self, msg)

    def _abort_gang(self, msg) -> None:
        self.executor.abort_gang(msg.gang, msg.reason)

    def _abort_gangs(self, msg) -> None:
        runs = set()
        for gang in msg.gangs:
            self.executor.abort_gang(gang, msg.reason)
            runs.add(tuple(gang[:2]))
        # kernels of these runs waiting for inputs that will never come must not hold
        # their devices: fail the run's buffers nobody has produced yet
        err = RemoteError(f"the run failed: {msg.reason}")
        self.store.fail_awaited(lambda key: protocol.key_run(key) in runs, err)

    def _assign_devices(self, msg) -> None:
        for d in msg.devices:
            if d not in self.devices:
                self.devices[d] = self.executor.add_device(d, self.spec, name=f"tpu{d}")
        log.info("host %s owns devices %s", self.core.id, sorted(self.devices))

    def _topology(self, msg) -> None:
        self.worker_of.clear()
        self.worker_of.update(msg.worker_of)
        self.ici.peers = dict(msg.links)

    def _client_left(self, msg) -> None:
        n = self.store.retire_client(msg.client, ClientGone(msg.reason))
        log.info("client %s gone (%s): freed %d buffers", msg.client, msg.reason, n)

    def _skip(self, msg) -> None:
        for d, seqs in msg.seqs.items():
            for s in seqs:
                if d in self.devices:
                    self.devices[d].skip(s, msg.reason)

    _COMMANDS = {protocol.AbortGang: _abort_gang, protocol.AbortGangs: _abort_gangs,
                 protocol.AssignDevices: _assign_devices, protocol.Topology: _topology,
                 protocol.ClientLeft: _client_left, protocol.SkipSeqs: _skip}

    def put(self, key, value, owner, arrival: float | None = None) -> None:
        """Loop thread: store a buffer that came from outside (a client's shard, a transfer,
        routed rows) at once if its device's HBM has room, else once frees make room: the
        host's one thread must never block waiting for memory."""
        device = self.devices.get(key[1])
        if device is None:
            self.store.put(key, value, owner)  # raises, naming the devices this host has
            return
        frees = device.hbm.frees
        try:
            fits = device.hbm.try_allocate(value.nbytes)
        except DeviceOutOfMemory as exc:  # larger than the whole HBM
            self.store.fail(key, exc, owner)
            return
        if not fits:
            self.executor.wait_for_hbm(device.hbm, frees,
                                       lambda: self.put(key, value, owner, arrival))
            return
        try:
            self.store.put(key, value, owner, arrival=arrival, allocated=True)
        except Exception:
            device.hbm.free(value.nbytes)  # not stored: give the memory back
            raise

    def put_when_room(self, key, value, owner, timeout: float | None, done) -> None:
        """Loop thread: store a buffer made on this host (a generated shard) as soon as its
        device's HBM has room, without blocking the thread, waiting at most ``timeout``
        seconds for frees (None: without bound); then ``done(None)``, or ``done(error)``
        with nothing stored: ``DeviceOutOfMemory`` at once if it is larger than the whole
        HBM, or when the wait times out (saying what it needs, what is free and held, and
        that deleting arrays makes room)."""
        device = self.devices.get(key[1])
        if device is None:
            done(KeyError(f"no device {key[1]} on this host (devices: {sorted(self.devices)})"))
            return
        hbm, nbytes = device.hbm, value.nbytes
        pending = [value]  # emptied when over: a retry left queued must not keep the value
        timer = None

        def finish(error) -> None:
            if pending:
                pending.clear()
                if timer is not None:
                    timer.cancel()
                done(error)

        def attempt() -> None:
            if not pending:
                return
            frees = hbm.frees
            try:
                if not hbm.try_allocate(nbytes):
                    self.executor.wait_for_hbm(hbm, frees, attempt)
                    return
            except DeviceOutOfMemory as exc:  # larger than the whole HBM
                finish(exc)
                return
            try:
                self.store.put(key, pending[0], owner, allocated=True)
            except BaseException as exc:
                hbm.free(nbytes)  # not stored: give the memory back
                finish(exc)
                return
            finish(None)

        if timeout is not None and timeout != float("inf"):
            timer = self.loop.call_later(timeout, lambda: finish(_no_room(
                device, nbytes, timeout)))
        attempt()

    def status(self) -> dict:
        return {
            "island": self.island,
            "uptime": time.monotonic() - self.started,
            "devices": {d: {"busy_seconds": dev.busy_seconds, "hbm_used": dev.hbm.used,
                            "hbm_capacity": dev.hbm.capacity, "next_seq": dev.next_seq}
                        for d, dev in sorted(self.devices.items())},
            "store": self.store.stats(),
            "wire": self.wire_counters(),
        }

    def record_transfer(self, device, name, labels, start, end) -> None:
        """Data that arrived for ``device`` (a transfer, routed rows) from ``start`` until its
        modelled arrival ``end``, for traces. Any thread."""
        self.transfers.append((device, name, labels, start, end))

    def timeline(self, since: float | None = None) -> dict:
        """Each device's kernels (seq, name, labels, start, end, failed) and incoming
        transfers (name, labels, start, end) that ended after ``since``, in this host's
        monotonic clock (``time.perf_counter``), with ``now``."""
        out, moved = {}, {}
        for d, dev in sorted(self.devices.items()):
            out[d] = [(r.seq, r.name, r.labels, r.start, r.end, r.error) for r in dev.timeline
                      if since is None or r.end > since]
            moved[d] = []
        for d, name, labels, start, end in list(self.transfers):
            if (since is None or end > since) and d in moved:
                moved[d].append((name, labels, start, end))
        return {"now": time.perf_counter(), "island": self.island,
                "host": self.core.id if self.core is not None else None,
                "devices": out, "transfers": moved}

    def wire_counters(self) -> dict:
        """What this host sent to other hosts: Plaque messages (routed rows, transfers,
        progress) and ICI messages (collectives), in messages and bytes."""
        from plaque.counters import total

        peers = self.core.counters.snapshot() if self.core is not None else {}
        plaque_total = total({p: c for p, c in peers.items() if p >= 0})
        ici = dict(self.ici.sent) if self.ici is not None else {"messages": 0, "bytes": 0}
        return {"plaque": plaque_total, "ici": ici}

    def close(self) -> None:
        self.executor.close(timeout=1.0)
        if self.ici is not None:
            self.ici.close()


def _no_room(device, nbytes: int, timeout: float) -> DeviceOutOfMemory:
    hbm = device.hbm
    return DeviceOutOfMemory(
        f"{device.name}: waited {timeout:g} s for {nbytes} bytes of HBM, but only"
        f" {max(hbm.capacity - hbm.used, 0)} of its {hbm.capacity} bytes are free"
        f" ({hbm.used} held by live arrays and running kernels); deleting arrays that are"
        " no longer needed (array.delete()) frees room, or pass a longer timeout")


def _refusal(exc: Exception) -> PathwaysError:
    """What a refused data-service request says: a missing or deleted array by name."""
    if isinstance(exc, PathwaysError):
        return exc
    if isinstance(exc, KeyError):
        return PathwaysError(f"no such array on this host: {exc.args[0] if exc.args else exc}")
    return PathwaysError(f"the host could not serve the request: {exc!r}")


class DataService:
    """The host's client-facing socket: put, get (answered when ready), delete."""

    def __init__(self, host: Host, bind: str, ctx: zmq.Context):
        self.host = host
        self.service = RouterService(ctx, bind, self._handle)
        self.address = self.service.address

    def start(self, loop) -> None:
        self.loop = loop
        self.service.start(loop)

    def _reply(self, ident, payload) -> None:
        self.service.reply(ident, payload)

    def _handle(self, ident, req) -> None:
        try:
            self._serve(ident, req)
        except Exception as exc:
            # a request someone waits for is answered, whatever went wrong: a reader of an
            # array deleted meanwhile gets that error, not a wait without end
            if getattr(req, "req", None) is None:
                dropped(log, "a data-service request", repr(exc))
            else:
                self._reply(ident, protocol.Refused(req.req, _refusal(exc)))

    def _serve(self, ident, msg) -> None:
        handler = self._REQUESTS.get(type(msg))
        if handler is None:
            raise ValueError(f"unknown request {type(msg).__name__}")
        handler(self, ident, msg)

    def _put(self, ident, msg) -> None:
        self.host.put((msg.array_id, msg.device), np.asarray(msg.value), msg.owner)

    def _delete(self, ident, msg) -> None:
        for key in msg.keys:
            self.host.store.delete(key)

    def _delete_owner(self, ident, msg) -> None:
        self.host.store.delete_owner(msg.owner)

    def _status(self, ident, msg) -> None:
        self._reply(ident, protocol.Answer(msg.req, self.host.status()))

    def _timeline(self, ident, msg) -> None:
        self._reply(ident, protocol.Answer(msg.req, self.host.timeline(msg.since)))

    def _generate(self, ident, msg) -> None:
        """Input processing on the host (the paper's Appendix C): run the client's function
        for this device's part of the array on a worker thread, then store the result once
        the device's HBM has room (``Host.put_when_room``: at most ``msg.timeout`` seconds).
        Whatever the function raises -- any ``BaseException``, ``SystemExit`` too -- fails
        this array only."""
        key = (msg.array_id, msg.device)

        def failed(exc: BaseException) -> None:
            err = exc if isinstance(exc, PathwaysError) else RemoteError(
                f"the input function failed on host {self.host.core.id} for device"
                f" {msg.device}: {type(exc).__name__}: {exc}")
            try:
                self.host.store.fail(key, err, msg.owner)
            except Exception:
                pass  # resolved already (e.g. failed for its waiting readers)
            self._reply(ident, protocol.Refused(msg.req, err))

        def stored(error: BaseException | None) -> None:
            if error is None:
                self._reply(ident, protocol.Answer(msg.req, None))
            else:
                failed(error)

        def made(fut) -> None:
            error = fut.exception()  # any BaseException the function raised
            if error is not None:
                failed(error)
                return
            self.host.put_when_room(key, fut.result(), msg.owner, msg.timeout, stored)

        fut = self.loop.run_in_executor(None, _make_shard, msg)
        fut.add_done_callback(made)

    def _when_ready(self, ident, msg, use) -> None:
        """Once the buffer ``msg`` names is resolved, on the loop: ``use(value)``; a failed
        buffer, or ``use`` raising, answers the request with that error."""
        key = (msg.array_id, msg.device)

        def ready(_key):
            self.loop.call_soon_threadsafe(answer)

        def answer():
            try:
                use(self.host.store.get(key, 0))
            except Exception as exc:
                self._reply(ident, protocol.Refused(msg.req, exc))

        self.host.store.add_done_callback(key, ready)

    def _get(self, ident, msg) -> None:
        self._when_ready(ident, msg, lambda value: self._reply(ident, protocol.Answer(
            msg.req, value)))

    def _save_shard(self, ident, msg) -> None:
        """Write a shard as a checkpoint's chunk, on a worker thread (the loop goes on)."""
        def write(value):
            fut = self.loop.run_in_executor(None, checkpoint_format.write_chunk, msg.path,
                                            msg.chunk, value)
            fut.add_done_callback(lambda f: self._reply(ident, written(f)))

        def written(fut):
            if fut.exception() is None:
                return protocol.Answer(msg.req, None)
            return protocol.Refused(msg.req, RemoteError(
                f"host {self.host.core.id} could not write the shard of device {msg.device}"
                f" to {msg.path}: {fut.exception()!r}"))

        self._when_ready(ident, msg, write)

    _REQUESTS = {protocol.PutShard: _put, protocol.GetShard: _get,
                 protocol.SaveShard: _save_shard,
                 protocol.DeleteShards: _delete, protocol.DeleteOwner: _delete_owner,
                 protocol.Status: _status, protocol.Generate: _generate,
                 protocol.Timeline: _timeline}


def _make_shard(msg: protocol.Generate) -> np.ndarray:
    """A worker thread: the part of a generated array ``msg`` asks for, checked."""
    import cloudpickle

    shape, dtype = tuple(msg.shape), np.dtype(msg.dtype)
    value = np.asarray(cloudpickle.loads(msg.blob)(msg.slices))
    if value.shape != shape or value.dtype != dtype:
        raise ProgramError(f"the input function returned {value.dtype}{list(value.shape)}"
                           f" for the part {msg.slices} of device {msg.device}; expected"
                           f" {dtype}{list(shape)}")
    return value


def _coordinator_info(address: str, ctx: zmq.Context, timeout: float = 30.0) -> dict:
    """Ask the coordinator where its Plaque cluster listens."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    security.connect(s, address)
    try:
        s.send_multipart(protocol.pack(protocol.Info(0)))
        reply = protocol.unpack(s.recv_multipart())
    except zmq.Again:
        raise plaque.CoordinatorLost(f"no coordinator answered at {address}") from None
    finally:
        s.close(0)
    if not isinstance(reply, protocol.Answer) or not isinstance(reply.value, dict):
        raise plaque.ProtocolError(f"the coordinator at {address} answered {reply!r}")
    return reply.value


async def serve_host(coordinator: str, island: int, num_devices: int, bind: str,
                     spec: DeviceSpec | None = None, coordinator_timeout: float = 10.0,
                     kernel_limit: float | None = KERNEL_LIMIT) -> str:
    """Serve a host until the coordinator stops it (or it is lost); returns why it stopped.

    A coordinator at an ``inproc://`` address is the in-process twin's: the host then runs
    in a thread of that process, on its Plaque in-process transport and ``inproc://``
    sockets (``bind`` should be ``inproc://``), and leaves JAX's process-wide settings alone.
    """
    loop = asyncio.get_running_loop()
    # Threads and the event loop take turns on the GIL; Python's default 5 ms switch
    # interval would add up to 5 ms to every hand-off between them (a dispatch arriving, a
    # kernel finishing), so hand over far more often.
    sys.setswitchinterval(SWITCH_INTERVAL)
    in_process = security.in_process(coordinator)
    if not in_process:
        jax_body.on_host()
    ctx, own_ctx = context_for(coordinator)
    info = await loop.run_in_executor(None, _coordinator_info, coordinator, ctx)
    host = Host(island, num_devices, spec, kernel_limit)
    host.loop = loop
    host.ici = host.executor.link = IciLink(ctx, bind, host.worker_of)
    host.executor.run_on(loop)  # one thread: the loop runs the devices too
    data = DataService(host, bind, ctx)
    transport = InprocTransport() if in_process else ZmqTransport(bind, context=ctx)
    core = WorkerCore(transport.address, info["plaque"],
                      info={"role": "host", "island": island, "devices": num_devices,
                            "data": data.address, "ici": host.ici.address, "pid": os.getpid(),
                            "hostname": socket.gethostname(), "spec": host.spec},
                      coordinator_timeout=coordinator_timeout, services={"host": host})
    core.on_user = host.on_user
    host.core = core
    data.start(loop)
    try:
        return await serve_worker_core(core, transport)
    finally:
        host.close()
        data.service.close()
        security.release(ctx)
        if own_ctx:
            ctx.term()
