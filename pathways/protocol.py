"""Messages between clients, the coordinator and hosts, as frozen dataclasses.

They reuse Plaque's framing (``plaque.wire``): a small header, a pickle body and large numpy
buffers as their own frames. Every message is an instance of one ``Message`` class below;
each role handles them through a table from class to handler (the coordinator's control
plane, a host's data service, a host's Plaque user messages, the client's session), so an
unknown or malformed message is dropped in one place. A request that expects an answer carries
``req``, the id its ``Answer`` (or ``Refused``) echoes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import NamedTuple

from plaque import wire

CLIENT = -3  # sender id used by clients in headers


class Message:
    """Base of every message."""

    __slots__ = ()


def message(cls):
    """A message class: a frozen dataclass with slots, pickled as its class and its field
    values (half the cost of a dataclass's default state)."""
    cls = dataclass(frozen=True, slots=True)(cls)
    get = operator.attrgetter(*(f.name for f in fields(cls)))
    if len(fields(cls)) == 1:
        cls.__reduce__ = lambda self: (type(self), (get(self),))
    else:
        cls.__reduce__ = lambda self: (type(self), get(self))
    return cls


class ActsForClient(Message):
    """A request acting for one client: only that client's own connection may send it."""

    __slots__ = ()

    @property
    def owner(self):
        return self.client


class ActsForProgram(ActsForClient):
    """A message acting for the client that owns program ``pid`` (its first element)."""
    __slots__ = ()

    @property
    def owner(self):
        pid = self.pid
        return pid[0] if isinstance(pid, tuple) and pid else None


# ---- client -> coordinator -----------------------------------------------------------------------

@message
class Info(Message):
    """Where the coordinator's Plaque cluster and client socket listen (hosts ask first)."""
    req: object


@message
class Hello(Message):
    """A client joins; ``info`` holds its weight and priority. Answered with its id."""
    req: object
    info: dict


@message
class Ping(Message):
    """Client ``client`` lives (every second)."""
    client: int


@message
class ListDevices(Message):
    """Every device of the cluster: id, island, host, kind, HBM, its host's data address."""
    req: object


@message
class AllocateMesh(ActsForClient):
    """A virtual slice of ``shape`` devices (on ``island``, or where the manager chooses)."""
    req: object
    client: int
    shape: tuple
    island: object
    preempt: bool = False  # suspend lower-priority clients' slices on the devices it takes
    hosts: int | None = None  # on exactly this many hosts, an equal share on each


@message
class Remap(ActsForClient):
    """Slice ``slice_id`` with its lost devices replaced."""
    req: object
    client: int
    slice_id: int


@message
class Suspend(ActsForClient):
    """Slice ``slice_id`` no longer holds arrays: free its devices, keep its id for resume."""
    req: object
    client: int
    slice_id: int


@message
class CancelSuspend(ActsForClient):
    """Undo the ``Suspend`` of ``slice_id`` whose answer the client did not get in time (sent
    after it, so handled after it). Answer: the slice, live on the devices it had; or None
    when the suspension stands (its devices went to a preempting client, or were lost)."""
    req: object
    client: int
    slice_id: int


@message
class Resume(ActsForClient):
    """Map suspended slice ``slice_id`` onto devices again (its version goes up). While a
    slice that preempted it holds the devices, the answer waits up to ``wait`` seconds."""
    req: object
    client: int
    slice_id: int
    wait: float = 0.0


@message
class Status(Message):
    """The coordinator's view of the cluster, or a host's own status."""
    req: object


@message
class InstallProgram(ActsForProgram):
    """Install program ``pid``: a graph skeleton, its code (``blob``), each equation's gang
    of devices and island."""
    pid: tuple
    nodes: list
    edges: list
    blob: bytes
    gangs: list
    islands: list


@message
class RunProgram(ActsForProgram):
    """Run installed program ``pid`` as run ``run_id`` with ``arg`` (a ``RunArg``)."""
    pid: tuple
    run_id: int
    arg: object


@message
class Bye(ActsForClient):
    """Client ``client`` leaves: free everything it holds."""
    client: int


# ---- coordinator or host -> client ---------------------------------------------------------------

@message
class Answer(Message):
    """The answer to request ``req``."""
    req: object
    value: object


@message
class Refused(Message):
    """Request ``req`` failed with ``error``."""
    req: object
    error: object


@message
class RunDone(Message):
    """Run ``run_id`` of this client finished on every host. ``results``: its small results,
    ``(array id, mesh position, value)`` for one holder of each distinct part (values as
    ``dtypes.shippable`` made them), so the client fetches none of them."""
    run_id: int
    results: tuple = ()


@message
class RunFailed(Message):
    """Run ``run_id`` of this client failed with ``error`` (its outputs fail with it)."""
    run_id: int
    error: object


@message
class InstallFailed(Message):
    """Program ``pid`` could not be installed on the hosts: ``error`` says why."""
    pid: tuple
    error: object


@message
class HostLostNotice(Message):
    """Host ``host`` (data socket ``data``, ``devices``) was lost: reads from it fail."""
    host: int
    data: str
    devices: list
    error: object


@message
class SuspendNotice(Message):
    """The coordinator asks this client to suspend slice ``slice_id`` (``reason``: for whom)."""
    slice_id: int
    reason: str


# ---- coordinator -> hosts, and host -> host (Plaque user messages) -----------------------------

@message
class AssignDevices(Message):
    """To a host that joined: the ids of the devices it emulates."""
    devices: list


@message
class Topology(Message):
    """Which host holds each device (``worker_of``), and each host's ICI address."""
    worker_of: dict
    links: dict


@message
class ClientLeft(Message):
    """Client ``client`` left or was lost: free its buffers."""
    client: int
    reason: str


@message
class SkipSeqs(Message):
    """Sequence numbers, per device, of gangs that will never run, and why (what a kernel
    dropped by the skip fails with)."""
    seqs: dict
    reason: str = ""


@message
class AbortGangs(Message):
    """Fail these gangs' collectives and waiting kernels (their runs failed), and the
    readers of those runs' ``outputs`` (array ids) not made yet: nobody will make them."""
    gangs: list
    reason: str
    outputs: list
    root: object = None  # the run's error (a RemoteError, a HostLost): what they fail with


@message
class AbortGang(Message):
    """From a host whose kernel failed: stop that gang's collectives here too. ``root``: the
    failure's own error (a RemoteError), which the gang's other kernels fail with."""
    gang: tuple
    reason: str
    root: object = None


# ---- client -> host data service -----------------------------------------------------------------

@message
class PutShard(Message):
    """A client's shard of ``array_id`` for ``device``, stored as ``owner``'s; it waits at
    most ``timeout`` seconds for room in the device's HBM (None: without bound), then fails
    with ``DeviceOutOfMemory``."""
    array_id: object
    device: int
    value: object
    owner: object
    timeout: float | None = None


@message
class GetShard(Message):
    """The shard, answered once it is ready."""
    req: object
    array_id: object
    device: int


@message
class SaveShard(Message):
    """Write the shard, once it is ready, as chunk ``chunk`` of the Zarr array at ``path``
    (``pathways.checkpoint_format``); answered when it is on disk."""
    req: object
    array_id: object
    device: int
    path: str
    chunk: tuple


@message
class DeleteShards(Message):
    """Free these buffers (``(array id, device)`` keys), now or once their readers are done."""
    keys: list


@message
class DeleteOwner(Message):
    """Free every buffer ``owner`` (a client, or a client's program) holds on this host."""
    owner: object


@message
class Generate(Message):
    """Compute a shard on the host with a shipped function of its slices (input
    processing on the hosts); it waits at most ``timeout`` seconds for room in the device's
    HBM (None: without bound)."""
    req: object
    array_id: object
    device: int
    blob: bytes
    slices: tuple
    shape: tuple
    dtype: str
    owner: object
    timeout: float | None = None


@message
class Timeline(Message):
    """The host's kernels and transfers that ended after ``since``."""
    req: object
    since: object


@message
class Batch(Message):
    """Several messages sent back to back, as one."""
    messages: list


# ---- framing -------------------------------------------------------------------------------------

def pack(msg, sender: int = CLIENT) -> list:
    return wire.encode(wire.Kind.USER, sender, msg)


def unpack(frames) -> Message:
    """The message; raises plaque.ProtocolError for anything malformed or not a message."""
    kind, _sender, payload = wire.decode(frames)
    if kind is not wire.Kind.USER or not isinstance(payload, Message):
        raise wire.ProtocolError(f"unexpected {kind.name} message")
    return payload


def batch(messages: list) -> Message:
    """One message for several sent back to back (``unbatch`` undoes it); deletes that follow
    each other become one (a host frees them together: a step that drops its old parameters
    sends one)."""
    if len(messages) == 1:
        return messages[0]
    merged: list = []
    for msg in messages:
        if type(msg) is DeleteShards and merged and type(merged[-1]) is DeleteShards:
            merged[-1] = DeleteShards([*merged[-1].keys, *msg.keys])
        else:
            merged.append(msg)
    return merged[0] if len(merged) == 1 else Batch(merged)


def unbatch(msg: Message) -> list:
    """The messages a received one stands for (anything in a batch that is none dropped)."""
    if isinstance(msg, Batch):
        if not isinstance(msg.messages, list):
            raise wire.ProtocolError("a batch carries one list of messages")
        return [m for m in msg.messages if isinstance(m, Message) and not isinstance(m, Batch)]
    return [msg]


@dataclass(frozen=True)
class RunArg:
    """What every host of a program gets with a run (one START message per host)."""

    client: int
    run_id: int
    mode: str  # "parallel" or "sequential"
    inputs: dict  # program input var id -> array id
    outputs: dict  # program output var id -> array id
    seqs: dict  # eqn index -> {device: sequence number on that device}
    ship: frozenset = frozenset()  # output var ids whose small results ride on RunDone

    def array_id(self, var_id: int):
        if var_id in self.inputs:
            return self.inputs[var_id]
        if var_id in self.outputs:
            return self.outputs[var_id]
        return TempId(self.client, self.run_id, var_id)  # freed after its last use


# ---- buffer keys ---------------------------------------------------------------------------------
# A buffer is keyed by (array id, device). An array a client names is ``(client, n)``, made by
# the client; the two kinds of ids hosts make for a run are typed, so that what a key belongs
# to is read from its fields, not decoded from its shape.

class TempId(NamedTuple):
    """A run's intermediate value ``var``, freed after its last use."""
    client: int
    run: int
    var: int


class TransferId(NamedTuple):
    """Where input ``port`` of equation ``eqn`` is assembled when it arrives by transfer."""
    client: int
    run: int
    eqn: int
    port: int


def transfer_key(arg: RunArg, consumer: int, port: int, device: int):
    """Where a consumer shard assembles an input that arrives by transfer."""
    return (TransferId(arg.client, arg.run_id, consumer, port), device)


def key_client(key):
    """The client a buffer key belongs to, or None for a key of no known form."""
    aid = key[0]
    if isinstance(aid, (TempId, TransferId)):
        return aid.client
    return aid[0] if isinstance(aid, tuple) and aid else None


def key_run(key):
    """``(client, run)`` of a run's own buffer (an intermediate or a transfer), else None."""
    aid = key[0]
    return (aid.client, aid.run) if isinstance(aid, (TempId, TransferId)) else None
