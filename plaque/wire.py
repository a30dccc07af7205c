"""The wire format: every message is a list of frames ``[header, body, *buffers]``.

``header`` is 8 bytes: magic ``PQ``, format version, message kind, and the sender's id. ``body``
is a pickle (protocol 5) of the payload; large buffers inside it (numpy arrays, bytes views)
travel as their own frames after the body, so they are neither copied into the pickle nor out
of it. Decoding checks everything it can and turns any failure into ``ProtocolError``.

The payload is trusted pickle: peers must be authenticated before their frames reach decode.
"""

from __future__ import annotations

import enum
import pickle
import struct

from .errors import ProtocolError

MAGIC = b"PQ"
VERSION = 1
_HEADER = struct.Struct("!2sBBi")
INBAND_LIMIT = 4096  # buffers smaller than this are cheaper inside the pickle

DATA = 0  # channel for tuples and outputs (bulk)
CONTROL = 1  # channel for progress, heartbeats, errors, housekeeping (never behind bulk)


class Kind(enum.IntEnum):
    """What a message is, in its header; each says who sends it and its body
    (``plaque.payloads`` for the structured ones)."""

    HELLO = 1  # worker -> coordinator: (data address, control address, info)
    WELCOME = 2  # coordinator -> worker: assigned id
    PEERS = 3  # coordinator -> worker: {worker id: address}
    INSTALL = 4  # coordinator -> worker: (graph id, cloudpickled graph, placement)
    INSTALLED = 5  # worker -> coordinator: (graph id, error text or None)
    UNINSTALL = 6
    START = 7  # coordinator -> worker: (graph id, timestamp, argument)
    DATA = 8  # worker -> worker: [((graph, node, shard, port, t), [values])]
    PROGRESS = 9  # anyone -> anyone: {graph id: [(pointstamp, delta)]}
    OUTPUT = 10  # worker -> coordinator: [(graph, node, shard, t, value)]
    ERROR = 11  # worker -> coordinator: operator failure report
    HEARTBEAT = 12  # both ways
    COUNTERS = 13  # request (coordinator -> worker) and reply (worker -> coordinator)
    STOP = 14  # coordinator -> worker: exit
    USER = 15  # anyone -> anyone: a payload for the embedding runtime (not for graphs)
    REPORT = 16  # worker -> coordinator: (PROGRESS body, OUTPUT list), small ones in one


COORDINATOR = -1  # the sender id of the coordinator
UNKNOWN_SENDER = -2  # a worker not yet welcomed; also where undecodable messages are counted

_KINDS = {k.value: k for k in Kind}  # a dict lookup is far cheaper than Kind(value)


def encode(kind: Kind, sender: int, payload) -> list:
    """Frames for one message; large buffers are appended as out-of-band frames."""
    buffers: list = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < INBAND_LIMIT:
            return True  # in band
        buffers.append(view)
        return False

    body = pickle.dumps(payload, protocol=5, buffer_callback=out_of_band)
    return [_HEADER.pack(MAGIC, VERSION, int(kind), sender), body, *buffers]


def decode(frames) -> tuple[Kind, int, object]:
    """(kind, sender, payload) of a received message, or ProtocolError."""
    if len(frames) < 2:
        raise ProtocolError(f"message has {len(frames)} frame(s), expected at least 2")
    header = memoryview(frames[0])
    if header.nbytes != _HEADER.size:
        raise ProtocolError(f"header is {header.nbytes} bytes, expected {_HEADER.size}")
    magic, version, kind, sender = _HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != VERSION:
        raise ProtocolError(f"wire version {version}, this build speaks {VERSION}")
    kind_ = _KINDS.get(kind)
    if kind_ is None:
        raise ProtocolError(f"unknown message kind {kind}")
    kind = kind_
    try:
        payload = pickle.loads(frames[1], buffers=frames[2:])
    except Exception as exc:  # any unpickling failure means a bad message
        raise ProtocolError(f"undecodable {kind.name} body: {exc!r}") from None
    return kind, sender, payload


def frame_bytes(frames) -> int:
    return sum(memoryview(f).nbytes for f in frames)
