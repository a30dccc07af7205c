"""A host: its emulated devices, object store and executor, and what the coordinator and
peer hosts tell it.

The host is a Plaque worker whose operators are kernel shards (``pathways.host.operators``);
it learns its global device ids from the resource manager (``AssignDevices``), where its peers
are (``Topology``), and which gangs and sequence numbers to drop when a run fails. One
executor runs all of its devices on the host's loop thread (``pathways.host.executor``);
collectives between devices of different hosts travel over the ICI link straight from executor
to executor; within a host they are memory handoffs. Clients reach it through its
``DataService`` (``pathways.host.data_service``); ``pathways.host.process`` starts it.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from .. import protocol
from ..dtypes import is_ml_dtype
from ..errors import ClientGone, HostLost, RemoteError
from ..program.cost import DeviceSpec
from .clock import MONOTONIC, Clock
from .device import EmulatedDevice, enqueue_all
from .exchange import ExecutorEnv
from .executor import KERNEL_LIMIT, Executor
from .hbm import no_room
from .object_store import ObjectStore

if TYPE_CHECKING:
    from plaque.worker import WorkerCore

__all__ = ["Host"]

log = logging.getLogger("pathways.host.host")

DEFAULT = object()  # put's timeout: the host's own (its hbm_wait)
TRANSFERS_KEPT = 10_000
MESHES_KEPT = 4096  # meshes whose device map a host finds by identity


class Host:
    """One host's runtime state, on its process's event-loop thread: its emulated devices
    and the executor that runs them, its object store, where its peers and their devices are
    (``Topology``), and the commands the coordinator and peer hosts send it (``on_user``).

    It is the ``HostServices`` its operators are given, and what its ``DataService`` serves
    clients from. ``serve_host`` (``pathways.host.process``) wires it to Plaque and sockets.
    """

    def __init__(self, island: int, num_devices: int, spec: DeviceSpec | None = None,
                 kernel_limit: float | None = KERNEL_LIMIT, clock: Clock = MONOTONIC,
                 jax_devices: list | None = None):
        self.island, self.num_devices = island, num_devices
        self.spec = spec or DeviceSpec()
        self.clock = clock  # the one clock of this host: executor, store and operators read it
        self.devices: dict[int, EmulatedDevice] = {}
        self.store = ObjectStore(self.devices, clock)
        self.executor = Executor("host", store=self.store, clock=clock,
                                 kernel_limit=kernel_limit)
        self.jax_devices = jax_devices  # its devices' own JAX devices (--backend jax), or None
        self.worker_of: dict[int, int] = {}  # device -> host worker id (kept in place)
        self._flat: dict[tuple, dict] = {}  # mesh devices -> {flat index: device}
        self._flat_of: dict[int, tuple] = {}  # id(mesh) -> (mesh, its _flat entry)
        self._released: deque = deque()  # capabilities to release on the loop
        self._release_posted = False
        self.core: WorkerCore | None = None
        self.loop = None
        self.started = clock.time()
        self.ici = None  # IciLink, set when serving
        self.transfers: deque = deque(maxlen=TRANSFERS_KEPT)  # (device, name, labels, start, end)
        # clients' shards that arrived before the coordinator told this host its devices (a
        # client learns where devices are from the coordinator, on another path)
        self._early_puts: list = []
        self._room_waits: dict = {}  # key -> its _RoomWait, while a buffer waits for HBM

    # ---- devices and kernels (called from the loop or the executor thread) ---------------
    def enqueue(self, items) -> None:
        """Queue each ``(device, seq, kernel)`` of ``items`` (``device``'s ``seq``-th): a
        gang's kernels on this host at once. Any thread."""
        devices = self.devices
        enqueue_all([(devices[d], seq, kernel) for d, seq, kernel in items])

    def kernel_env(self, mesh, flat_index: int, gang_key, device) -> ExecutorEnv:
        """Executor thread: where the collectives of the kernel running on ``device`` go."""
        hit = self._flat_of.get(id(mesh))  # by identity: hashing a mesh's ids costs O(devices)
        if hit is not None and hit[0] is mesh:
            flat = hit[1]
        else:
            flat = self._flat.get(mesh.ids)
            if flat is None:
                flat = self._flat[mesh.ids] = dict(enumerate(mesh.ids))
            if len(self._flat_of) < MESHES_KEPT:  # (the entry keeps the mesh, so its id)
                self._flat_of[id(mesh)] = (mesh, flat)
        return ExecutorEnv(mesh.axis_sizes, mesh.axis_names, flat_index, flat, gang_key,
                           self.executor, device.current,
                           self.executor.jax_of.get(device.device_id))

    def post_release(self, caps) -> None:
        """Executor thread: release each ``(cap, outputs)`` of ``caps`` on the loop,
        ``outputs`` first handed to the run's driver (``cap.output``); one loop wake for a
        whole turn's."""
        self._released.extend(caps)
        if not self._release_posted:
            self._release_posted = True
            self.core.call_soon(self._release_all)

    def _release_all(self) -> None:
        self._release_posted = False
        while self._released:
            cap, outputs = self._released.popleft()
            if cap.valid:  # not uninstalled meanwhile
                for value in outputs:
                    cap.output(value)
                cap.release()

    def abort_gang(self, gang_key, devices, reason, root=None) -> None:
        """Executor thread: stop this gang's collectives here and on its other hosts."""
        self.executor.abort_gang(gang_key, reason, root)
        workers = {self.worker_of[d] for d in devices if d in self.worker_of} - {self.core.id}
        msg = protocol.AbortGang(gang_key, reason, root)
        for w in workers:
            self.core.call_soon(lambda w=w: self.core.send_user(w, msg))

    # ---- messages from the coordinator and peers (loop thread) ----------------------------
    def on_user(self, sender, msg) -> None:
        """A message from the coordinator or a peer host, by its class (``_COMMANDS``)."""
        handler = self._COMMANDS.get(type(msg))
        if handler is None:
            log.warning("unknown message %s from %s", type(msg).__name__[:80], sender)
            return
        handler(self, msg)

    def _abort_gang(self, msg) -> None:
        self.executor.abort_gang(msg.gang, msg.reason, msg.root)

    def _abort_gangs(self, msg) -> None:
        runs = set()
        for gang in msg.gangs:
            self.executor.abort_gang(gang, msg.reason, msg.root)
            runs.add(tuple(gang[:2]))
        # kernels of these runs waiting for inputs that will never come must not hold
        # their devices: fail the run's buffers nobody has produced yet
        # (a save or fetch of them fails as the run did: HostLost when a host was lost)
        err = (HostLost if isinstance(msg.root, HostLost) else RemoteError)(
            f"the run failed: {msg.reason}")
        self.store.fail_awaited(lambda key: protocol.key_run(key) in runs, err)
        # nor may a reader of an output these runs will never make (a save, a fetch, a
        # kernel of a later run) wait for it, now or later
        self.store.doom([(aid, d) for aid in msg.outputs for d in self.devices], err)

    def _assign_devices(self, msg) -> None:
        for d in msg.devices:
            if d not in self.devices:
                self.devices[d] = self.executor.add_device(d, self.spec, name=f"tpu{d}")
        if self.jax_devices is not None:
            self.executor.jax_of = dict(zip(sorted(self.devices), self.jax_devices))
        log.info("host %s owns devices %s", self.core.id, sorted(self.devices))
        early, self._early_puts = self._early_puts, []
        for put in early:  # a client's shards that overtook this message
            try:
                self.put(*put)
            except Exception as exc:
                log.warning("a shard sent before this host knew its devices: %s", exc)

    def _topology(self, msg) -> None:
        self.worker_of.clear()
        self.worker_of.update(msg.worker_of)
        self.ici.peers = dict(msg.links)
        self.executor.call_soon(self.executor.exchanges.forget_plans)  # before later kernels

    def _client_left(self, msg) -> None:
        self.drop_waits(msg.client, ClientGone(msg.reason))
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

    def put(self, key, value, owner, arrival: float | None = None,
            timeout: float | None = DEFAULT) -> None:
        """Loop thread: store a buffer that came from outside (a client's shard, a transfer,
        routed rows) once its device's HBM has room (``put_when_room``), waiting at most
        ``timeout`` seconds (by default the host's ``hbm_wait``; None: without bound); a
        buffer that cannot be stored is failed with why (``DeviceOutOfMemory``), so its
        readers are told instead of waiting."""
        if key[1] not in self.devices:
            if not self.devices:  # it came before AssignDevices: kept until they are known
                self._early_puts.append((key, value, owner, arrival, timeout))
                return
            self.store.put(key, value, owner)  # raises, naming the devices this host has
            return

        def stored(error) -> None:
            if error is not None:
                try:
                    self.store.fail(key, error, owner)
                except ValueError:
                    pass  # resolved meanwhile (failed for its waiting readers)

        self.put_when_room(key, value, owner, timeout, stored, arrival)

    def put_when_room(self, key, value, owner, timeout: float | None, done,
                      arrival: float | None = None) -> None:
        """Loop thread: store a buffer as soon as its device's HBM has room, without
        blocking the thread, waiting at most ``timeout`` seconds for frees (``DEFAULT``: the
        host's ``hbm_wait``; None: without bound); then ``done(None)``, or ``done(error)``
        with nothing stored: ``DeviceOutOfMemory`` at once if it is larger than the whole
        HBM, or when the wait times out (saying what it needs, what is free and held, and
        that deleting arrays makes room); the error of ``delete`` or a client's leaving if
        that comes first."""
        device = self.devices.get(key[1])
        if device is None:
            done(KeyError(f"no device {key[1]} on this host (devices: {sorted(self.devices)})"))
            return
        timeout = self.executor.hbm_wait if timeout is DEFAULT else timeout
        wait = _RoomWait(self, key, value, owner, arrival, done)
        admission = self.store.admit(key[1], value.nbytes, wait.admitted)
        if wait.value is None:  # settled at once, the usual case: nothing waits, no timer
            return
        wait.admission = admission
        self._room_waits[key] = wait
        if timeout is not None and timeout != float("inf"):
            nbytes = value.nbytes
            wait.timer = self.loop.call_later(
                timeout, lambda: wait.end(no_room(device, nbytes, timeout)))

    def delete(self, keys) -> None:
        """Loop thread: a client deleted ``keys``: a wait for room to store one ends (its
        value dropped), then the store forgets them and frees their HBM."""
        for key in keys:
            waiting = self._room_waits.get(key)
            if waiting is not None:
                waiting.end(KeyError(f"object {key!r} was deleted while it waited for HBM room"))
        self.store.delete_all(keys)

    def drop_waits(self, client, error: BaseException) -> None:
        """End the waits for room of ``client``'s buffers: it is gone."""
        for key, waiting in list(self._room_waits.items()):
            if protocol.key_client(key) == client:
                waiting.end(error)

    def status(self) -> dict:
        return {
            "island": self.island,
            "uptime": self.clock.time() - self.started,
            "devices": {d: {"busy_seconds": dev.busy_seconds, "hbm_used": dev.hbm.used,
                            "hbm_capacity": dev.hbm.capacity, "next_seq": dev.next_seq}
                        for d, dev in sorted(self.devices.items())},
            "store": self.store.stats(),
            "waiting_for_room": len(self._room_waits),  # buffers not stored yet: HBM full
            "wire": self.wire_counters(),
            # where its Plaque shards are in the runs in flight here: {graph: {t: {node: n}}}
            "frontier": self.core.frontier() if self.core is not None else {},
        }

    def record_transfer(self, device, name, labels, start, end) -> None:
        """Data that arrived for ``device`` (a transfer, routed rows) from ``start`` until its
        modelled arrival ``end``, for traces. Any thread."""
        self.transfers.append((device, name, labels, start, end))

    def timeline(self, since: float | None = None) -> dict:
        """Each device's kernels (seq, name, labels, start, end, failed) and incoming
        transfers (name, labels, start, end) that ended after ``since``, in this host's
        clock (``self.clock``), with ``now``."""
        out, moved = {}, {}
        for d, dev in sorted(self.devices.items()):
            out[d] = [(r.seq, r.name, r.labels, r.start, r.end, r.error)
                      for r in dev.records_since(since)]
            moved[d] = []
        for d, name, labels, start, end in list(self.transfers):
            if (since is None or end > since) and d in moved:
                moved[d].append((name, labels, start, end))
        return {"now": self.clock.time(), "island": self.island,
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




def on_device(value, jax_device):
    """``value`` (a buffer that came from outside) where its device keeps its buffers: as it
    is, or a ``jax.Array`` on ``jax_device`` where the host's devices are JAX's (kernels then
    read it there, not copied again for each) -- numpy's numeric types and bfloat16, unless
    JAX would change it (a 64-bit type without ``jax_enable_x64``): anything else stays as
    it came (strings, objects, the narrower ml_dtypes types)."""
    if jax_device is None:
        return value
    import jax

    dtype = value.dtype
    numeric = dtype.kind in "biufc" and not is_ml_dtype(dtype)  # (narrower ml_dtypes types
    if not (numeric or dtype.name == "bfloat16"):  # are packed or refused by some devices)
        return value
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:  # JAX would change it
        return value
    return jax.device_put(value, jax_device)


class _RoomWait:
    """A buffer waiting for HBM room (``Host.put_when_room``): ended once, by its admission,
    its timer, a delete or its client leaving; ``value`` is dropped then, so a wait left
    queued in the admissions does not keep it."""

    __slots__ = ("host", "key", "value", "owner", "arrival", "done", "timer", "admission")

    def __init__(self, host: Host, key, value, owner, arrival, done):
        self.host, self.key, self.value, self.owner = host, key, value, owner
        self.arrival, self.done = arrival, done
        self.timer = self.admission = None

    def admitted(self, got) -> None:
        if isinstance(got, BaseException):  # larger than the whole HBM
            self.end(got)
        elif self.value is None:  # over meanwhile
            got.give_back()
        else:
            try:
                value = on_device(self.value, self.host.executor.jax_of.get(self.key[1]))
                self.host.store.put(self.key, value, self.owner, arrival=self.arrival,
                                    grant=got)
            except BaseException as exc:
                got.give_back()  # not stored: give the memory back
                self.end(exc)
                return
            self.end(None)

    def end(self, error: BaseException | None) -> None:
        if self.value is None:
            return
        self.value = None
        waits = self.host._room_waits
        if waits.get(self.key) is self:
            del waits[self.key]
        if self.timer is not None:
            self.timer.cancel()
        if self.admission is not None:
            self.admission.cancel()
        self.done(error)
