"""The Plaque operator that runs one shard of a compiled function on an emulated device.

Parallel dispatch (the default): when run t starts on a host, each kernel shard at once
enqueues its kernel on its device, at the sequence number the island scheduler fixed, with
its inputs as object-store keys; the host's executor starts it once they are ready.
Sequential dispatch: a shard enqueues only when Plaque tells it that every producer shard is
done ("complete for t"). Either way the shard holds its Plaque capability until the kernel has
finished, so consumers and the coordinator learn completion through progress tracking.
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

import plaque

from ..dtypes import shippable, unwrap
from ..errors import RemoteError
from ..lowering.specs import KernelSpec, SendSpec
from ..program import cost as cost_model
from ..protocol import transfer_key
from .device import DeviceWork, Finish
from .services import HostServices

log = logging.getLogger("pathways.host.kernel")
_HOSTNAME = socket.gethostname()


class Piece(NamedTuple):
    """A block of an input that moves by transfer, for the consumer shard it is emitted to:
    where it goes in that shard's buffer, and the link it takes ("dcn", "ici", in memory)."""

    dst_slices: tuple
    block: object
    link: str


class Failed(NamedTuple):
    """What a consumer is sent instead of its data when the producer side failed: why."""

    reason: str


def input_key(spec, arg, i: int, device: int):
    """The buffer input ``i`` of equation ``spec.index`` is read from on ``device``."""
    if i in spec.incoming:
        return transfer_key(arg, spec.index, i, device)
    return (arg.array_id(spec.inputs[i]), device)


def releases(spec, inputs) -> list:
    """``[(i, users)]``: which of the inputs ``i`` of equation ``spec.index`` a user lets go of
    when done, and how many users each has (``ObjectStore.release_uses`` takes their buffers
    with that count): a transfer buffer is its only user's, a value shared by
    ``spec.releases[i]`` users is freed by the last of them; kept values are left out."""
    return [(i, 1 if i in spec.incoming else spec.releases[i]) for i in inputs
            if i in spec.incoming or spec.releases[i]]


class DispatchedOp(plaque.Operator):
    """An operator whose host work for run t starts when the run starts (parallel dispatch)
    or when Plaque says its producers are done (sequential dispatch). It holds its capability
    from the start and hands it to ``dispatch``, which releases it when the work is over.
    ``host``: what it may call on the host that runs it."""

    sequential = False  # True: always wait for the producers, whatever the run's mode

    def __init__(self, host: HostServices):
        self.host = host
        self.caps: dict = {}

    def on_start(self, ctx, t):
        self.caps[t] = ctx.hold()
        if not (self.sequential or ctx.arg.mode == "sequential"):
            self._dispatch(ctx, t, self.caps.pop(t))

    def on_complete(self, ctx, t):
        if self.sequential or ctx.arg.mode == "sequential":
            self._dispatch(ctx, t, self.caps.pop(t))

    def _dispatch(self, ctx, t, cap) -> None:
        """``dispatch``; if it raises, nothing took the capability over: release it here, or
        the node would hold back every later run of the graph."""
        try:
            self.dispatch(ctx, t, cap)
        except BaseException:
            if not cap.released:
                cap.release()
            raise

    def dispatch(self, ctx, t, cap) -> None:
        raise NotImplementedError


class KernelOp(DispatchedOp):
    """One shard of a compiled function: enqueues its ``Kernel`` on its device at the
    sequence number the island scheduler fixed; inputs arriving by transfer are assembled
    into their buffers on the way."""

    def __init__(self, spec: KernelSpec, host: HostServices):
        super().__init__(host)
        self.spec = spec
        self.assembler = Assembler(spec.index, spec.incoming, spec.fn.mesh.ids, host)
        # its inputs' global avals, for traces: the same for every run (an aval's str,
        # numpy's dtype.name inside, costs microseconds: once per node, not per run)
        self.input_avals = [str(a) for a in spec.expect.ins]

    def on_input(self, ctx, t, port, piece):
        self.assembler.on_piece(ctx, t, port, piece)

    def on_start_shards(self, shards, t):
        """Run t starts on this host's shards of the node (``[(op, ctx)]``): in parallel
        dispatch, their kernels are made and queued as one gang (one lock, one wake); in
        sequential dispatch, False: each starts alone and waits for its own producers."""
        if self.sequential or shards[0][1].arg.mode == "sequential":
            return False
        caps = []
        try:
            for _, ctx in shards:
                caps.append(ctx.hold())
            spec, arg, host = self.spec, shards[0][1].arg, self.host
            gang = self._gang(arg)
            ids, seqs = spec.fn.mesh.ids, arg.seqs[spec.index]
            items = []
            for (_, ctx), cap in zip(shards, caps):
                device = ids[ctx.shard]
                items.append((device, seqs[device], Kernel(gang, ctx.shard, device, host, cap)))
            host.enqueue(items)  # all or nothing: then the kernels hold the capabilities
        except BaseException:
            for cap in caps:
                cap.release()
            raise

    def dispatch(self, ctx, t, cap):
        spec, arg = self.spec, ctx.arg
        device = spec.fn.mesh.ids[ctx.shard]
        self.host.enqueue([(device, arg.seqs[spec.index][device],
                            Kernel(self._gang(arg), ctx.shard, device, self.host, cap))])

    def _gang(self, arg) -> KernelGang:
        """What the node's shards share in the run of ``arg`` (made once per run and
        process: a shard dispatched on its own finds its gang's)."""
        spec = self.spec
        gang = _GANGS.get(id(spec))
        if gang is None or gang.spec is not spec or gang.arg is not arg:
            gang = KernelGang(spec, arg, self.input_avals)
            if len(_GANGS) >= GANGS_KEPT:
                _GANGS.clear()
            _GANGS[id(spec)] = gang  # (the gang keeps its spec, so the id stays its own)
        return gang


GANGS_KEPT = 4096  # kernel nodes whose latest gang a process keeps for their next shard
_GANGS: dict[int, KernelGang] = {}  # id(spec) -> the gang of its latest run


class KernelGang:
    """What the shards of one kernel node share in one run: worked out once for all the
    devices a host runs it on, not per device (its shards on a host are dispatched one after
    the other, in one turn of the host's worker): the labels of their records, the owner
    of their outputs, the key of their collectives, the ids of the buffers they read and
    write, and which outputs ride on the run's end to the client."""

    __slots__ = ("spec", "arg", "labels", "owner", "key", "inputs", "outputs", "ships",
                 "uses")

    def __init__(self, spec: KernelSpec, arg, input_avals: list):
        self.spec, self.arg = spec, arg
        self.labels = {"client": arg.client, "run": arg.run_id, "eqn": spec.index,
                       "inputs": input_avals}  # global avals, for traces (shared: not changed)
        self.owner = (arg.client, arg.run_id)
        self.key = (arg.client, arg.run_id, spec.index)
        # per input: its array id, or None for one that arrives by transfer (keyed per device)
        self.inputs = tuple(None if i in spec.incoming else arg.array_id(v)
                            for i, v in enumerate(spec.inputs))
        self.outputs = tuple(arg.array_id(v) for v in spec.outputs)
        self.ships = tuple((k, shards, arg.outputs[v]) for k, shards in spec.ships
                           if (v := spec.outputs[k]) in arg.ship)
        # (input index, its users) of the inputs a shard lets go of when done
        self.uses = releases(spec, range(len(spec.inputs)))

    def input_keys(self, device: int) -> list:
        """The buffers its shard on ``device`` reads, as ``input_key`` says."""
        return [(aid, device) if aid is not None
                else transfer_key(self.arg, self.spec.index, i, device)
                for i, aid in enumerate(self.inputs)]

    def on_done_all(self, done: list) -> None:
        """``on_done`` of its kernels ``done`` (``[(kernel, finish)]``, on devices of this
        host) as one: their outputs put under one lock, their inputs let go of under one,
        their capabilities released in one wake of the loop. All or nothing: if it raises,
        nothing was published."""
        host = done[0][0].host
        outputs, ships, gang_uses = self.outputs, self.ships, self.uses
        batches, uses, caps = [], [], []
        for kernel, finish in done:
            device, outs = kernel.device_id, kernel._outputs
            batches.append(([((aid, device), o) for aid, o in zip(outputs, outs)],
                            finish.end, finish.grant))
            if gang_uses:
                keys = kernel.input_keys()
                for i, n in gang_uses:
                    uses.append((keys[i], n))
            caps.append((kernel.cap, [(array, kernel.shard, shippable(outs[k]))
                                      for k, shards, array in ships
                                      if kernel.shard in shards] if ships else ()))
        host.store.put_all(batches, self.owner)
        for kernel, _ in done:
            kernel._outputs = None
        host.store.release_uses(uses)
        host.post_release(caps)


class Assembler:
    """Where the pieces of inputs that arrive by transfer are put together, per run, into the
    buffer the consuming kernel waits on (its transfer key in the object store)."""

    def __init__(self, index: int, incoming: dict, devices, host: HostServices):
        self.index, self.incoming, self.devices, self.host = index, incoming, devices, host
        self.assembling: dict[tuple, _Assembly] = {}  # (t, input index) -> what came so far

    def on_piece(self, ctx, t, port, piece):
        """A piece of an input that arrives by transfer; put the input once it is whole."""
        inc = self.incoming[port]
        host, arg = self.host, ctx.arg
        device = self.devices[ctx.shard]
        key = transfer_key(arg, self.index, port, device)
        owner = (arg.client, arg.run_id)
        if type(piece) is Failed:
            host.store.fail(key, RemoteError(piece.reason), owner)
            return
        dst_slices, block, link = piece
        block = unwrap(block)  # unpickled already if it came from a shard of this worker
        now = host.clock.time()
        got = self.assembling.get((t, port))
        if got is None:
            got = self.assembling[(t, port)] = _Assembly(np.empty(inc.shape, inc.dtype),
                                                         inc.expect[ctx.shard], started=now)
        # The modelled link time of this piece: the consuming kernel waits until the last
        # piece would have arrived (event-loop timers are too coarse for microseconds).
        got.arrival = max(got.arrival, now + link_time(link, block.nbytes, host))
        got.nbytes += block.nbytes
        got.links.add(link)
        try:
            got.buffer[dst_slices] = block
            got.missing -= 1
            if got.missing:
                return
            del self.assembling[(t, port)]
            host.record_transfer(device, f"v{inc.var} in", {
                "client": arg.client, "run": arg.run_id, "eqn": self.index,
                "bytes": got.nbytes, "link": "+".join(sorted(got.links))},
                got.started, max(got.arrival, now))
            host.put(key, got.buffer, owner, arrival=got.arrival)
        except Exception as exc:  # never leave the consumer waiting for its input
            self.assembling.pop((t, port), None)
            log.exception("assembling a transferred input failed")
            host.store.fail(key, RemoteError(f"transfer into {key} failed: {exc!r}"), owner)


@dataclass
class _Assembly:
    """An input arriving by transfer, piece by piece."""

    buffer: np.ndarray
    missing: int  # pieces still expected
    started: float  # when the first piece came (the host's clock)
    arrival: float = 0.0  # modelled arrival of the last piece so far
    nbytes: int = 0
    links: set = field(default_factory=set)


class Kernel(DeviceWork):
    """One shard of one equation of one run, as its device executes it (what it shares with
    the gang's other shards on its host: ``gang``)."""

    __slots__ = ("gang", "spec", "shard", "device_id", "host", "cap", "name", "labels",
                 "_keys", "_outputs")

    def __init__(self, gang: KernelGang, shard: int, device: int, host: HostServices, cap):
        self.gang, self.spec, self.shard, self.device_id = gang, gang.spec, shard, device
        self.host, self.cap = host, cap
        self.name = gang.spec.fn.name
        self.labels = gang.labels
        self._keys = None
        self._outputs = None

    @property
    def limit(self):
        """Seconds the body may run (None: the host's default)."""
        return self.spec.fn.limit

    @property
    def calls(self) -> int:
        """How many of the program's calls the body runs (``pathways.program.fusion``)."""
        return self.spec.fn.calls

    def input_keys(self):
        if self._keys is None:
            self._keys = self.gang.input_keys(self.device_id)
        return self._keys

    def output_keys(self) -> list:
        return [(aid, self.device_id) for aid in self.gang.outputs]

    def execute(self, device) -> float:
        shards = self.host.store.get_all(self.input_keys())
        fn = self.spec.fn
        env = self.host.kernel_env(fn.mesh, self.shard, self.gang.key, device)
        if env.jax_device is not None and fn.jax is None:  # a numpy body sees numpy
            shards = [np.asarray(s) for s in shards]
        outs, seconds = fn.run_shard(env, shards, device.spec, self.spec.expect, self.device_id)
        self._outputs = outs
        remote = env.bytes_sent_remote
        if env.collectives:  # its record says so (traces, the dashboard)
            self.labels = {**self.gang.labels, "collectives": env.collectives,
                           "remote_bytes": remote}
        return seconds + env.link_seconds + (
            cost_model.transfer_time(remote, cost_model.ICI) if remote else 0.0)

    def output_bytes(self) -> int:
        return sum([o.nbytes for o in self._outputs])

    def on_done(self, finish: Finish):
        """The device has been occupied for the kernel's time: publish its outputs (their
        HBM is already taken: ``finish.grant``), available from its modelled end (as its
        gang's ``on_done_all`` publishes several at once)."""
        self.gang.on_done_all([(self, finish)])

    def on_error(self, exc):
        err = kernel_error(self.name, self.device_id, exc)
        poison(self.host, self.output_keys(), err, self.gang.owner)
        keys = self.input_keys()
        self.host.store.release_uses([(keys[i], n) for i, n in self.gang.uses])
        self.host.abort_gang(self.gang.key, self.spec.fn.mesh.ids, f"{self.name} failed on"
                             f" device {self.device_id}: {exc!r}", root=err)

        def fail(cap):
            raise err

        self.cap.post(fail)


def kernel_error(name: str, device: int, exc: BaseException) -> RemoteError:
    """What the readers of a failed kernel's outputs get: where it failed (function, device,
    host), why (the exception's class and message), and its traceback as lines. A kernel
    that failed because another of its gang did (an abandoned collective that knows why)
    fails with that failure's own error: the real exception, wherever it is read."""
    root = getattr(exc, "root", None)
    if isinstance(root, RemoteError):
        return root
    if isinstance(exc, RemoteError):
        return exc
    return RemoteError.from_origin({
        "type": (type(exc).__module__, type(exc).__qualname__), "message": str(exc),
        "function": name, "device": device, "host": f"{_HOSTNAME} pid {os.getpid()}",
        "traceback": "".join(traceback.format_exception(exc))})


def poison(host: HostServices, keys, err: Exception, owner) -> None:
    """Fail these output buffers, so their readers get ``err`` instead of waiting."""
    for key in keys:
        try:
            host.store.fail(key, err, owner)
        except ValueError:
            pass  # already resolved (e.g. failed for its waiting readers)
        except Exception:
            log.exception("could not poison output %s", key)


def link_time(link: str, nbytes: int, host: HostServices) -> float:
    """Modelled seconds ``nbytes`` take over ``link`` ("dcn", "ici", or in memory) to
    ``host``: none to real devices (``--backend jax``), where the data took its real time."""
    if host.spec.real:
        return 0.0
    if link == "dcn":
        return cost_model.transfer_time(nbytes, cost_model.DCN)
    if link == "ici":
        return cost_model.transfer_time(nbytes, cost_model.ICI)
    return 0.0


class SendOp(DispatchedOp):
    """The shards of a value that must move: once a shard's buffer is ready, emit to each
    consumer shard the block it needs (over a KEYED edge), then let the buffer go."""

    def __init__(self, spec: SendSpec, host: HostServices):
        super().__init__(host)
        self.spec = spec

    def dispatch(self, ctx, t, cap):
        host, arg, shard = self.host, ctx.arg, ctx.shard
        key = (arg.array_id(self.spec.var), self.spec.devices[shard])
        host.store.add_done_callback(key, lambda _k: cap.post(
            lambda c: self._send(c, host, key, shard)))

    def _send(self, cap, host, key, shard):
        pieces = self.spec.pieces[shard]
        try:
            value = host.store.get(key, 0)
        except Exception as exc:
            for dst, *_ in pieces:  # consumers must fail, not wait for pieces forever
                cap.emit(Failed(f"input of a transfer failed: {exc!r}"), shard=dst)
        else:
            for dst, src_slices, dst_slices, link in pieces:
                block = np.asarray(value)[src_slices]  # stays 0-d for a scalar
                if not block.flags.c_contiguous:
                    block = block.copy()
                cap.emit(Piece(dst_slices, shippable(block), link), shard=dst)
        if self.spec.uses:
            host.store.release_uses([(key, self.spec.uses)])
        cap.release()

