"""The bodies of Plaque's structured wire messages, as typed objects.

On the wire a body stays the plain tuple it always was (``wire.encode`` pickles it): a tuple
pickles smaller and faster than any class, and every build of Plaque reads it. Code on either
side handles the typed form: a sender builds, say, ``Start(gid, t, arg)`` and sends
``.wire()``; a receiver reads ``Start.of(body)``, which raises (and the message is dropped as
malformed) when the body does not have the fields. Which class a body is follows from the
message's ``wire.Kind``, noted on each class.

The bulk bodies (DATA tuples, PROGRESS changes, OUTPUT values) stay lists of plain tuples: they
are the hot path, built and read per tuple.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields

__all__ = [
    "CountersReply", "ErrorReport", "Hello", "Install", "InstallReply", "Report", "Start",
    "Welcome",
]


def payload(cls):
    """A frozen, slotted dataclass with ``wire()`` (its fields as a tuple, in order) and
    ``of(body)`` (the object from such a tuple)."""
    cls = dataclass(frozen=True, slots=True)(cls)
    names = [f.name for f in fields(cls)]
    get = operator.attrgetter(*names)  # a tuple: every payload has two fields or more
    cls.wire = lambda self: get(self)
    if "of" not in cls.__dict__:
        cls.of = classmethod(lambda c, body: c(*body))
    return cls


@payload
class Hello:
    """``Kind.HELLO``, worker -> coordinator: where it listens, what it says about itself, and
    its string-hash probe (``worker.str_hash_probe``; None from a sender that has none)."""

    address: str
    info: dict
    hash_probe: int | None = None

    @classmethod
    def of(cls, body) -> Hello:
        address, info, *probe = body
        return cls(address, info, probe[0] if probe else None)


@payload
class Welcome:
    """``Kind.WELCOME``, coordinator -> worker: its id, and the coordinator's full address
    (empty: keep the one it joined with)."""

    worker: int
    coordinator_address: str


@payload
class Install:
    """``Kind.INSTALL``, coordinator -> worker: graph ``gid`` and ``blob``, the shipped
    (graph, placement)."""

    gid: int
    blob: bytes


@payload
class InstallReply:
    """``Kind.INSTALLED``, worker -> coordinator: graph ``gid`` is installed there, or the
    traceback text of why not."""

    gid: int
    error: str | None


@payload
class Start:
    """``Kind.START``, coordinator -> worker: begin run ``t`` of graph ``gid`` with ``arg``;
    ``parts``: ``{(node index, shard): part}`` of the run's partitioned input, for the shards
    this worker hosts (None: none)."""

    gid: int
    t: object
    arg: object
    parts: dict | None = None
    stream: int | None = None  # the stream this run is an epoch of (None: a plain run)


@payload
class Feed:
    """``Kind.FEED``, coordinator -> worker: ``values`` the driver sends into epoch ``t`` of
    a stream, emitted by shard ``shard`` of input node ``node`` (``keys``: one per value, for
    its KEYED edges; None: none). Sent on the channel of START and ADVANCE, so in order."""

    gid: int
    t: object
    node: int
    shard: int
    values: object
    keys: object = None


@payload
class Advance:
    """``Kind.ADVANCE``, coordinator -> worker: epoch ``t`` of stream ``stream`` takes no more
    input (its input shards let their capabilities go); ``last``: the stream ends with it."""

    gid: int
    t: object
    stream: int
    last: bool = False


@payload
class ErrorReport:
    """``Kind.ERROR``, worker -> coordinator: operator ``node`` (its name), shard ``shard``
    on ``worker`` raised in run ``t`` of graph ``gid``; ``message`` is the exception's repr,
    ``traceback`` its text, ``origin`` where it says it comes from (or None)."""

    gid: int
    t: object
    node: str
    shard: int
    worker: int
    message: str
    traceback: str
    origin: object


@payload
class CountersReply:
    """``Kind.COUNTERS`` worker -> coordinator: the answer to request ``request`` (the
    request itself is just its id)."""

    request: int
    snapshot: dict


@payload
class Report:
    """``Kind.REPORT``, worker -> coordinator: a PROGRESS body and an OUTPUT list together
    (a turn's few small outputs ride on its progress report)."""

    progress: dict
    outputs: list
