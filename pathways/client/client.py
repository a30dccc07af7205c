"""The single-controller client: devices, meshes, arrays, and runs that never wait.

All socket traffic happens on the client's own event-loop thread (``session``); user calls hand
it work and return at once. A call of a compiled function or program names its output buffers itself
(client id, run id, output index), so the futures it returns can be passed to the next call
before the backend has seen the first: there is no enqueue round trip. A program is lowered
and installed once per input placement; each call is then one "run" message.

The client composes its state from objects that the other modules of this package use in its
place: ``session`` (the I/O), ``cluster`` (devices, hosts, the newest mapping of each slice),
``runs`` (the runs in flight), ``programs`` (the program cache), ``ledger`` (the arrays' lives:
holds and freeing), ``shards`` (shards to and from the hosts) and ``suspensions`` (the slices
suspended); ``put`` and ``device_put`` are ``placing``'s. It keeps the user's calls and the
handlers of the coordinator's messages.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import os
import shutil

import numpy as np

from plaque import security

from .. import protocol
from ..errors import (
    ClientClosed,
    PathwaysError,
    ProgramError,
    SliceSuspended,
    received,
)
from ..lowering.lower import Placement
from ..program import sharding, tree
from ..program.compiled import Aval, CompiledFunction
from ..program.mesh import Device, Mesh
from ..protocol import RunArg
from . import checkpoint, placing, suspension
from .array import Array, teach_jax
from .cluster_view import ClusterView
from .ledger import ArrayLedger
from .program_cache import ProgramCache
from .runs import Run, RunBook
from .session import open_session, refuse_stopped, split_address
from .shards import Shards
from .trace import Tracing, collect

log = logging.getLogger("pathways.client.client")

MAX_IN_FLIGHT = 1024  # calls given and not ended before a new one waits (_wait_for_room)


def room_after(max_in_flight: int) -> int:
    """Runs in flight a call that found ``max_in_flight`` of them waits down to: three
    quarters (at least one fewer)."""
    return max_in_flight - max(1, max_in_flight // 4)


class Client:
    """A connection to a Pathways coordinator. It reserves meshes, places arrays on devices
    and runs compiled functions and programs; no call waits for the devices. Create one with
    ``pw.connect``.

    >>> with pw.connect(cluster.address) as client:
    ...     mesh = client.mesh((2, 4), ("data", "model"))
    ...     x = client.put(np.zeros((8, 4)), mesh, P("data"))
    """

    def __init__(self, address: str, dispatch: str = "parallel", timeout: float = 30.0,
                 weight: float = 1.0, priority: int = 0, coordinator_timeout: float = 5.0,
                 keys: str | None = None, connect_timeout: float | None = None,
                 suspend_dir: str | None = None, max_in_flight: int = MAX_IN_FLIGHT):
        if dispatch not in ("parallel", "sequential"):
            raise ValueError(f"dispatch must be 'parallel' or 'sequential', got {dispatch!r}")
        teach_jax()  # (when JAX is loaded: it refuses to trace a pw.Array, saying why)
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or \
                max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        if not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight!r}")
        # "tcp://HOST:PORT?keys=DIR" names the cluster's keys; keys= and then $PLAQUE_KEYS
        # are the other ways to give them (checked now: a bad directory would only time out)
        self.address, named = split_address(address)
        self.dispatch, self.timeout = dispatch, timeout
        self.keys = str(keys) if keys is not None else named or security.keys_dir()
        if self.keys is not None:
            security.check(self.keys)
        self.runs = RunBook()
        self.ledger = ArrayLedger(self._free)
        self.suspend_dir = suspend_dir
        self.closed = False
        self.session = open_session(self.address, self.keys, coordinator_timeout,
                                    set(self._MESSAGES), self._on_message, self._fail_runs)
        # blocking work off the loop thread: awaiting an array, committing a checkpoint
        self.executor = self.session.blocking_executor()
        self.suspensions = suspension.Suspensions(self.session.future)
        self.cluster = ClusterView(self.session, timeout)
        self.weight, self.priority = float(weight), int(priority)
        wait = timeout if connect_timeout is None else connect_timeout
        try:  # CoordinatorLost saying what the connection saw, if no answer
            self.id = self.session.first_answer(protocol.Hello(None, {
                "weight": self.weight, "priority": self.priority}), wait)
        except BaseException:
            self.close()
            raise
        self.shards = Shards(self.id, self.session, self.cluster, self.suspensions,
                             self._hbm_wait(None))
        self.programs = ProgramCache(self.id, dispatch, self.session, self.cluster)
        self.session.start_pings(self.id)
        self.cluster.refresh()

    def clock(self) -> float:
        """Seconds on the client's clock, the one its traces are drawn in: monotonic time,
        or a simulated cluster's virtual time.

        >>> t0 = client.clock(); step(x).block_until_ready(); took = client.clock() - t0
        """
        return self.session.clock()

    # ---- the session's loop thread: runs ending, notices --------------------------------
    @property
    def lost(self):
        """The ``CoordinatorLost`` error once the coordinator went silent, else None."""
        return self.session.lost

    def _on_message(self, msg):
        """A message about this client's runs or slices, by its class (``_MESSAGES``)."""
        self._MESSAGES[type(msg)](self, msg)

    def _run_ended(self, msg):
        run = self.runs.pop(msg.run_id)
        if run is None:
            return
        self.ledger.unhold(run.inputs)
        if isinstance(msg, protocol.RunDone):
            if msg.results:  # before the status: result() then finds the value
                self.shards.adopt(run.outputs, msg.results)
            run.status.set_result(None)
        else:
            run.status.set_exception(received(msg.error, of_run=True))

    def _install_failed(self, msg):
        """Every run of that program fails."""
        for run in self.runs.pop_program(msg.pid):
            self.ledger.unhold(run.inputs)
            run.status.set_exception(received(msg.error, of_run=True))

    def _suspend_notice(self, msg):
        suspension.suspend_for_coordinator(self, msg.slice_id, msg.reason, self.timeout)

    _MESSAGES = {protocol.RunDone: _run_ended, protocol.RunFailed: _run_ended,
                 protocol.InstallFailed: _install_failed, protocol.SuspendNotice: _suspend_notice}

    def _fail_runs(self, err: Exception) -> None:
        """Every run still in flight fails with ``err``."""
        for run in self.runs.pop_all():
            self.ledger.unhold(run.inputs)
            if not run.status.done():
                run.status.set_exception(err)

    # ---- cluster --------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        """Every emulated device: id, island, host, kind.

        >>> [d.id for d in client.devices() if d.island == 0]
        """
        return self.cluster.devices()

    def host_status(self, timeout: float = 10.0) -> dict:
        """Each host's status by host id: its devices (busy time, HBM), object store, and the
        messages and bytes it sent to other hosts (``["wire"]``: Plaque and ICI).

        >>> for host, status in client.host_status().items():
        ...     print(host, {d: s["hbm_used"] for d, s in status["devices"].items()})
        """
        futures = {h: self.session.request(a, protocol.Status(None))
                   for h, a in self.cluster.hosts().items()}
        return {h: f.result(timeout) for h, f in sorted(futures.items())}

    def cluster_status(self, timeout: float = 10.0) -> dict:
        """The coordinator's view: ``hosts`` (each host's hello: island, devices, addresses,
        pid, hostname), ``devices``, ``clients`` (weight, priority, runs running, gangs
        queued, runs held behind an install, its oldest runs in flight), the scheduling
        ``policy``, the resource manager's ``resources`` (slices, suspended slices), the
        latest failed runs (``errors``, with remote tracebacks), the hosts lost so far
        (``lost_hosts``, each host's hello as ``hosts`` had it) and the coordinator's clock
        ``now`` (``ControlPlane.status``).

        >>> sorted(client.cluster_status())
        ['clients', 'devices', 'errors', 'hosts', 'lost_hosts', 'now', 'policy', 'resources']
        """
        return self.session.request(self.address, protocol.Status(None)).result(timeout)

    def timeline(self, timeout: float = 10.0) -> dict:
        """Every device's recent kernels by device id: ``(seq, name, labels, start, end,
        failed)`` with labels client/run/eqn, times in seconds of the device host's clock.

        >>> for seq, name, labels, start, end, failed in client.timeline()[mesh.ids[0]]:
        ...     print(seq, name, labels, f"{(end - start) * 1e3:.3f} ms", failed)
        """
        out = {}
        for records in collect(self, timeout=timeout):
            out.update(records["devices"])
        return dict(sorted(out.items()))

    def trace(self, path=None):
        """Record every device's timeline while a ``with`` block runs; write it to ``path``
        as Chrome trace JSON (open in https://ui.perfetto.dev). The trace is also kept as
        the context's ``.trace`` dict.

        >>> with client.trace("step.json"):
        ...     step(x).result()
        """
        return Tracing(self, path)

    def mesh(self, shape, axis_names, island=None, preempt: bool = False,
             hosts: int | None = None) -> Mesh:
        """A virtual slice of ``shape`` devices from the resource manager, as a mesh.

        The least loaded devices are taken, whole hosts before a host is split, and laid out
        row-major by host (``pathways.control.resource_manager``), so the last axes stay
        inside a host: a (2, 4) mesh on 3 hosts of 4 devices is two whole hosts, its last
        axis inside each. ``hosts=H`` asks for exactly H hosts with an equal share on each:
        a (4,) mesh with ``hosts=2`` has two devices on each of two hosts. A remap or resume
        keeps the layout.
        ``island`` asks for devices of that island; by default the resource manager chooses.
        ``preempt=True`` makes room: clients of lower priority (``pw.connect(priority=...)``)
        with slices on the devices this one gets are suspended first (their runtime moves
        their arrays to disk once their running gangs finish; see ``suspend``), and the call
        returns once they all have (``ResourceError`` if they have not within the
        coordinator's preemption timeout). What preemption promises: while this slice holds
        those devices, the slices it suspended do not come back onto them (their ``resume``
        takes other devices of the island, or waits, or fails naming this client). It does
        not reserve the devices against anyone else: other slices, old or new, share them
        as usual, and the island's scheduling policy orders everyone's gangs.

        >>> mesh = client.mesh((2, 4), ("data", "model"))     # 8 devices
        >>> other = client.mesh((4,), ("data",), island=1)    # 4 devices of island 1
        >>> spread = client.mesh((4,), ("d",), hosts=2)        # 2 devices on each of 2 hosts
        """
        shape = tuple(int(n) for n in shape)
        if len(shape) != len(tuple(axis_names)):
            raise sharding.ShardingError(f"mesh shape {shape} and axis names {axis_names}"
                                         " differ in length")
        sl = self.session.request(self.address, protocol.AllocateMesh(
            None, self.id, shape, island, bool(preempt), hosts)).result(self.timeout)
        self.cluster.refresh()
        return Mesh(shape, tuple(axis_names), sl.devices, sl.slice_id, sl.island, sl.version,
                    client=self)

    # ---- arrays ---------------------------------------------------------------------------
    def put(self, value, mesh: Mesh, spec=None):
        """Shard ``value`` over ``mesh`` by ``spec`` and send each shard to its device.

        ``value`` is an array (numpy, JAX, a Python number) or a tree of them (dicts, lists,
        tuples, None; with JAX loaded, any JAX pytree: ``pathways.client.pytrees``), and the
        result is the same tree of arrays; ``spec`` (a ``P`` or JAX's ``PartitionSpec``;
        none: ``P()``) is then one spec for every leaf or a tree prefix of specs. A
        ``pw.NamedSharding`` may stand for ``mesh`` and ``spec``. A leaf numpy makes no
        numeric array of (a string, a set) is refused, and nothing is sent unless every leaf
        fits.

        >>> x = client.put(np.arange(32.0).reshape(8, 4), mesh, P("data"))
        >>> w = client.put(np.eye(4), mesh)        # no spec: a full copy on every device
        >>> params = client.put({"w": np.eye(4), "b": np.zeros(4)}, mesh,
        ...                     {"w": P("data"), "b": P()})
        >>> params["w"].spec, params["b"].spec
        (P('data', None), P(None))
        """
        return placing.put(self, value, mesh, spec)

    def device_put(self, x, sharding):
        """``x`` placed as ``sharding`` says, as ``jax.device_put(x, sharding)`` does:
        ``sharding`` is a ``pw.NamedSharding(mesh, spec)``, or a tree prefix of them, and
        ``x`` an array or a tree of them as for ``put``. Returns the same tree of arrays. A
        leaf that is a ``pw.Array`` of this client placed so already is returned as it is;
        another ``pw.Array`` is fetched and put again (through this client).

        >>> s = pw.NamedSharding(mesh, P("data"))
        >>> state = client.device_put({"w": x0, "step": np.arange(8)}, s)
        >>> state["w"].sharding == x.sharding
        True
        >>> client.device_put(x, x.sharding) is x
        True
        """
        return placing.device_put(self, x, sharding)

    def generate(self, fn, shape, dtype, mesh: Mesh, spec=None,
                 timeout: float | None = None) -> Array:
        """An array whose shards the hosts compute themselves with ``fn`` (input processing on
        the hosts: the data never passes through the client).

        ``fn(index)`` gets the tuple of slices of the global array a device holds and returns
        that part, of ``dtype``; it runs on each device's host, on a CPU thread. Whatever it
        raises fails the array (``RemoteError``), not the host.

        A shard larger than a device's whole HBM raises ``DeviceOutOfMemory`` at once. One
        that does not fit beside the arrays living there now waits for them to be deleted,
        at most ``timeout`` seconds (default: the client's ``timeout``, 30 s unless
        ``pw.connect(timeout=...)`` says otherwise; ``math.inf``: without bound); then the
        array fails with ``DeviceOutOfMemory`` saying how many bytes it needs and how many
        are free. So delete what is no longer needed before, not after, waiting for it.

        >>> x = client.generate(lambda idx: np.random.default_rng(idx[0].start)
        ...                     .normal(size=(idx[0].stop - idx[0].start, 8)),
        ...                     (1024, 8), np.float64, mesh, P("data"))
        """
        if not callable(fn):
            raise ProgramError(f"generate needs a function of the slices, got {fn!r}")
        timeout = self._hbm_wait(timeout)
        self.suspensions.check([mesh])
        shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        spec = sharding.normalize_spec(spec, len(shape), mesh.axis_names)
        array_id = self.shards.new_id()
        status = self.shards.generate(array_id, fn, shape, dtype, mesh, spec, timeout)
        return Array(self, array_id, Aval(shape, dtype), mesh, spec, status)

    def _hbm_wait(self, timeout) -> float | None:
        """Seconds a generated shard may wait for HBM room (None: without bound)."""
        if timeout is None:
            return self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        return None if math.isinf(timeout) else float(timeout)

    def _free(self, array: Array) -> None:
        """Free ``array``'s shards on the hosts (the ledger's ``free``): nothing once closed,
        since closing frees everything the client owns, nor once the coordinator is lost
        (the hosts free a client's buffers when it goes silent)."""
        if not self.closed and self.session.lost is None:
            self.shards.delete(array)

    # ---- checkpoints ----------------------------------------------------------------------
    def save(self, path, values, overwrite: bool = False) -> cf.Future:
        """Write ``values`` (an array, or dicts, tuples and lists of them) to ``path`` as a
        Zarr v3 checkpoint; returns a future at once, which gets ``path`` when it is committed.

        Each host writes the shards its devices hold, in parallel, straight to ``path`` (a
        shared file system, or the local disk of one machine); the client writes only
        metadata. Arrays still being computed are written when ready, so a save overlaps
        the steps after it. The save is atomic: until it commits nothing is at ``path`` (or
        the old checkpoint, with ``overwrite=True``); a failed save leaves nothing behind.

        >>> saved = client.save("ckpt/step_1", {"x": x, "opt": (y, y)})
        >>> z = step(y)                                  # the save goes on meanwhile
        >>> path = saved.result(timeout=60)              # the path, once committed
        """
        self.suspensions.check([a.mesh for a in tree.flatten(values)[0]
                                if isinstance(a, Array)])
        return checkpoint.save(self, path, values, overwrite)

    def load(self, path, mesh: Mesh, specs=None, timeout: float | None = None):
        """The checkpoint at ``path`` as arrays on ``mesh``, in the tree it was saved with,
        split by ``specs`` (one spec, or a tree prefix of them; default: the spec each array
        was saved with). Each host reads the chunks its devices need, so the mesh and specs
        may differ from the saved ones. Returns at once; the arrays are futures. Device
        memory is as for ``generate``: an array larger than a device's HBM raises
        ``DeviceOutOfMemory`` at once, and one that does not fit beside live arrays waits at
        most ``timeout`` seconds (default: the client's ``timeout``) for them to be deleted.

        >>> path = client.save("ckpt/step_2", {"x": x}).result(timeout=60)
        >>> state = client.load("ckpt/step_2", mesh)                  # as saved
        >>> np.array_equal(state["x"].result(), x0)
        True
        >>> line = client.mesh((4,), ("data",))
        >>> state = client.load("ckpt/step_2", line, {"x": P(None, "data")})  # resharded
        >>> state["x"].sharding.spec
        P(None, 'data')
        """
        self._hbm_wait(timeout)  # a bad timeout fails here, whatever the checkpoint holds
        return checkpoint.load(self, path, mesh, specs, timeout)

    # ---- programs -------------------------------------------------------------------------
    def op_program(self, fn: CompiledFunction, avals):
        """The one-equation program that calls ``fn`` alone on arguments of ``avals``
        (made once per ``fn`` and avals, then cached). Calling ``fn`` outside a program
        runs this.

        >>> prog = client.op_program(step, [x.aval])
        >>> y = client.run_program(prog, [x])      # what step(x) does
        """
        return self.programs.op_program(fn, avals)

    def run_program(self, program, arrays):
        """Run a traced program on ``arrays``; returns its output futures at once.

        >>> prog = chain.trace([x.aval])           # chain: a @pw.program
        >>> z = client.run_program(prog, [x])      # what chain(x) does
        """
        for i, a in enumerate(arrays):
            if a.client is not self:
                raise ProgramError(f"argument {i} belongs to another client")
            if a.is_deleted():
                raise ProgramError(f"argument {i} was deleted")
            if self.cluster.current(a.mesh) is not a.mesh:
                self._move(i, a, self.cluster.current(a.mesh))
        self._wait_for_room()
        program = self.programs.retarget(program)
        meshes = [a.mesh for a in arrays] + [getattr(e.fn, "mesh", None) for e in program.eqns]
        if self.suspensions:  # refused before any output exists (re-checked under the lock)
            self.suspensions.check(meshes)
        placements = tuple(Placement(a.mesh.ids, tuple(a.spec), a.mesh.axis_sizes,
                                     a.mesh.axis_names) for a in arrays)
        pid, out_places = self.programs.install(program, placements)
        run_id = self.runs.new_id()
        status = self.session.future()
        outputs, out_ids = [], {}
        for v in program.outputs:
            if v in program.inputs:
                outputs.append(arrays[program.inputs.index(v)])
                continue
            mesh, spec = out_places[v.id]
            out_ids[v.id] = self.shards.new_id()
            outputs.append(Array(self, out_ids[v.id], v.aval, mesh, spec, status,
                                 origin=(pid, v.id)))
        arg = RunArg(self.id, run_id, self.dispatch,
                     {v.id: a.id for v, a in zip(program.inputs, arrays)}, out_ids, {},
                     self.programs.wanted(pid))
        with self.suspensions.lock:  # a slice is suspended either before this run or after it
            try:
                if self.suspensions:
                    self.suspensions.check(meshes)
            except SliceSuspended as exc:  # a suspension came meanwhile: the outputs made for
                status.set_exception(exc)  # this call end failed, never pending (a suspension
                raise  # waits for the arrays of its slice still being made)
            self.ledger.hold(arrays)
            self.runs.add(run_id, Run(status, tuple(arrays), tuple(outputs), pid))
            try:
                self.session.send(self.address, protocol.RunProgram(pid, run_id, arg))
            except BaseException as exc:  # not sent (closed, lost): nothing stays held
                if self.runs.pop(run_id) is not None:
                    self.ledger.unhold(arrays)
                if not status.done():
                    status.set_exception(exc)
                raise
        return outputs[0] if program.single_output else tuple(outputs)

    def _wait_for_room(self) -> None:
        """Back-pressure, as JAX's runtime gives: with ``max_in_flight`` runs given and not
        ended, a call waits until a quarter of them have ended (``room_after``). A program
        called in a loop without waiting then keeps the coordinator's queue (and the time a
        ping waits behind it) bounded, instead of queueing without end until the client
        takes the coordinator for lost; and its calls leave in bursts, batched into a few
        messages, not one message per run that ends. Never on the session's own thread (a
        done callback), which ends runs."""
        if len(self.runs) < self.max_in_flight or self.session.on_loop_thread():
            return
        low = room_after(self.max_in_flight)
        while len(self.runs) > low:
            waited = self.runs.status_at(len(self.runs) - low - 1)  # its end makes the room
            if waited is None:
                return
            self.session.check_open()
            try:  # it ends, or the session fails it (exception() waits as result() does,
                waited.exception(self.timeout)  # so a simulated client drives its cluster)
            except (TimeoutError, cf.CancelledError):
                pass

    # ---- after a host loss: the same virtual slices on healthy devices ---------------------
    def remap(self, mesh: Mesh) -> Mesh:
        """The slice of ``mesh`` with its lost devices replaced by healthy (or newly joined)
        ones. Programs and compiled functions built on ``mesh`` keep working: they are
        re-lowered onto the new devices at their next call, and arguments whose value this
        client holds (put, or fetched) are put again where they now belong.

        >>> y.result()                     # HostLost: a host of mesh's slice died
        >>> mesh = client.remap(mesh)      # same shape and axes, healthy devices
        >>> y = step(x)                    # step and x were built on the old mesh
        """
        if mesh.slice_id is None:
            raise ProgramError("remap needs a mesh from client.mesh(...)")
        sl = self.session.request(self.address, protocol.Remap(None, self.id, mesh.slice_id)
                                  ).result(self.timeout)
        self.cluster.refresh()
        new = Mesh(mesh.axis_sizes, mesh.axis_names, sl.devices, sl.slice_id, sl.island, sl.version,
                   client=self)
        self.cluster.adopt(new)
        return new

    # ---- suspend and resume: a slice's arrays to disk, its devices to others -------------------
    def suspend(self, mesh: Mesh, timeout: float = 120.0) -> None:
        """Move every array this client holds on ``mesh``'s slice to disk and free the
        slice's devices for others. Runs already given to the devices finish first; calls on
        the slice meanwhile and after raise ``SliceSuspended``. The hosts write the arrays
        (a checkpoint under ``suspend_dir``, default the system's temporary directory: give a
        shared one when hosts are on several machines); their device memory is freed only
        once the coordinator has confirmed the suspension. If anything fails first, or the
        coordinator does not confirm within ``timeout`` (the suspension is then undone, which
        may take ``timeout`` more), a ``PathwaysError`` says so and in what state it left
        the slice: live with its arrays as before, or (rarely) in doubt until the
        coordinator answers, which ``resume`` waits for.

        >>> client.suspend(mesh)           # x, y: on disk; the devices: free
        >>> mesh = client.resume(mesh)     # back, possibly on other devices
        >>> np.array_equal(x.result(), x0)
        True
        """
        if mesh.slice_id is None:
            raise ProgramError("suspend needs a mesh from client.mesh(...)")
        suspension.suspend(self, mesh.slice_id, "by this client", timeout)

    def resume(self, mesh: Mesh, timeout: float = 120.0) -> Mesh:
        """Map a suspended slice onto devices again (by the allocation rule: possibly other
        devices) and bring its arrays back from disk, under the same ``Array`` objects.
        Programs and arrays built on the old mesh keep working, as after a remap. Returns
        the new mesh; the arrays are futures again until they are read back.

        A slice suspended to make room for a preempting client (``mesh(..., preempt=True)``)
        does not come back onto the devices that client's slice holds: it takes other
        devices of its island if there are enough, else waits up to ``timeout`` for them,
        then raises ``ResourceError`` naming the preempting client. A slice whose suspension
        is in doubt (see ``suspend``) is waited for: if it was undone, the live mesh is
        returned as it is."""
        return suspension.resume(self, mesh, timeout)

    def _move(self, i, array: Array, mesh: Mesh) -> None:
        """Put an argument again on its slice's new devices, from the value this client has."""
        value = array.local_copy()
        if value is None:
            raise PathwaysError(
                f"argument {i} lived on slice {mesh.slice_id}, which lost devices, and this"
                " client holds no copy of its value: put it again (or fetch it before)")
        self.ledger.release(array)  # what is left of it on the devices that survived
        array.rebind(self.shards.new_id(), mesh)
        self.shards.put(array.id, mesh, sharding.split(value, mesh.axis_sizes,
                                                       mesh.axis_names, array.spec))

    # ---- life cycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Free everything this client owns on the hosts and disconnect.

        >>> client.close()      # or let a ``with pw.connect(...) as client:`` block end
        """
        if self.closed:
            return
        try:
            for address in self.cluster.data_addresses():
                self.session.send(address, protocol.DeleteOwner(self.id))
            self.session.send(self.address, protocol.Bye(self.id))
        except Exception:
            pass
        self.closed = True
        self.session.close(ClientClosed("the client closed before this run finished"))
        for directory in self.suspensions.directories():
            shutil.rmtree(directory, ignore_errors=True)
        self.executor.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(address: str | None = None, dispatch: str = "parallel", timeout: float = 30.0,
            weight: float = 1.0, priority: int = 0, coordinator_timeout: float = 5.0,
            keys: str | None = None, suspend_dir: str | None = None,
            max_in_flight: int = MAX_IN_FLIGHT) -> Client:
    """Connect to a Pathways coordinator at ``address`` (printed by ``pathways up``, or a
    ``pw.local_cluster``'s ``cluster.address``); default: ``$PATHWAYS_ADDRESS``, which
    ``pathways slurm`` sets for the command it runs.

    ``weight`` is this client's share of device time when the coordinator runs the "share"
    policy; ``priority`` its rank under the "priority" policy (higher goes first). If the
    coordinator is silent for ``coordinator_timeout`` seconds, every pending future fails with
    ``CoordinatorLost`` and so do later calls; so does connecting: no answer within it (or a
    handshake the coordinator refuses, at once) raises ``CoordinatorLost`` saying "no
    coordinator answered at ADDRESS" and why (nothing listens there; keys missing or not the
    cluster's), and an address naming a key directory that is gone, that the cluster has
    stopped. ``timeout`` bounds every later request. ``keys`` is the directory of the
    cluster's CURVE keys (``pathways keys DIR``) when the cluster requires them; default: the
    directory the address names (``tcp://HOST:PORT?keys=DIR``, what local clusters report),
    else ``$PLAQUE_KEYS``. ``suspend_dir``: where the hosts write a suspended slice's arrays
    (default: the system's temporary directory). ``max_in_flight``: calls given and not
    yet ended past which a new call waits, until a quarter of them have ended (as JAX's
    dispatch bounds its queue).
    A malformed address raises ``ValueError``; a directory without a key pair,
    ``FileNotFoundError``.

    >>> with pw.connect(cluster.address, weight=2.0) as client:   # or "tcp://HOST:PORT?keys=DIR"
    ...     print(len(client.devices()))
    """
    if address is None:
        address = os.environ.get("PATHWAYS_ADDRESS")
        if not address:
            raise ValueError("pw.connect() needs an address: give one, or set"
                             " $PATHWAYS_ADDRESS (pathways slurm does)")
    refuse_stopped(address, keys)
    return Client(address, dispatch=dispatch, timeout=timeout, weight=weight,
                  priority=priority, coordinator_timeout=coordinator_timeout, keys=keys,
                  suspend_dir=suspend_dir, connect_timeout=coordinator_timeout,
                  max_in_flight=max_in_flight)
