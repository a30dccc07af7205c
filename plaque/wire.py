"""The wire format: every message is a list of frames ``[header, body, *buffers]``.

``header`` is 8 bytes: magic ``PQ``, format version, message kind, and the sender's id. ``body``
is a pickle (protocol 5) of the payload; large buffers inside it (numpy arrays, bytes views)
travel as their own frames after the body, so they are neither copied into the pickle nor out
of it. Decoding checks everything it can and turns any failure into ``ProtocolError``.

A socket that encrypts (CURVE) sends a message through ``chunked``: its buffers over ``CHUNK``
bytes travel as several frames of ``CHUNK`` bytes (views, not copies), since CURVE encrypts a
frame whole before any of it moves and decrypts it whole after, so one huge frame crosses
several times slower than the same bytes in frames of a MiB (raw pyzmq between two processes
here, 64 MiB: 0.16 against 0.49 GB/s). Such a message sets ``CHUNKED`` in its kind and carries,
after the body, a frame of the number of frames of each buffer (uint32, little-endian); the
receiver joins a buffer's frames into one. Plain sockets do not chunk: there the join's copy
costs more than it saves (a Unix socket moves big frames well).

The payload is trusted pickle: peers must be authenticated before their frames reach decode.
"""

from __future__ import annotations

import enum
import pickle
import struct

import numpy as np

from .errors import ProtocolError

MAGIC = b"PQ"
VERSION = 2  # 2: a CHUNKED message's buffers may travel in several frames
_HEADER = struct.Struct("!2sBBi")
INBAND_LIMIT = 4096  # buffers smaller than this are cheaper inside the pickle
CHUNK = 1 << 20  # on an encrypting socket, larger buffers travel as frames of this size
CHUNKED = 0x80  # in the kind byte: a frame of frames-per-buffer follows the body

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
    FEED = 17  # coordinator -> worker: values the driver sends into an epoch of a stream
    ADVANCE = 18  # coordinator -> worker: a stream's epoch takes no more input


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


def chunked(frames: list) -> list:
    """The frames of one message from ``encode``, its buffers over ``CHUNK`` bytes split into
    frames of ``CHUNK`` bytes (views of them), for a socket that encrypts; the same list if
    none is that large."""
    buffers = frames[2:]
    if not any(memoryview(b).nbytes > CHUNK for b in buffers):
        return frames
    header = bytearray(frames[0])
    header[3] |= CHUNKED  # the kind byte
    counts, out = [], []
    for b in buffers:
        view = memoryview(b).cast("B")
        if view.nbytes > CHUNK:
            out.extend(view[i:i + CHUNK] for i in range(0, view.nbytes, CHUNK))
            counts.append(-(-view.nbytes // CHUNK))
        else:
            out.append(b)
            counts.append(1)
    return [bytes(header), frames[1], struct.pack(f"<{len(counts)}I", *counts), *out]


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
    kind_ = _KINDS.get(kind & ~CHUNKED)
    if kind_ is None:
        raise ProtocolError(f"unknown message kind {kind}")
    buffers = _joined(frames) if kind & CHUNKED else frames[2:]
    try:
        payload = pickle.loads(frames[1], buffers=buffers)
    except Exception as exc:  # any unpickling failure means a bad message
        raise ProtocolError(f"undecodable {kind_.name} body: {exc!r}") from None
    return kind_, sender, payload


def _joined(frames) -> list:
    """The out-of-band buffers of a ``CHUNKED`` message: each buffer's frames joined."""
    if len(frames) < 3:
        raise ProtocolError("a chunked message has no frame counts")
    layout = memoryview(frames[2])
    if layout.nbytes % 4:
        raise ProtocolError(f"frame counts of {layout.nbytes} bytes, not a multiple of 4")
    counts = struct.unpack(f"<{layout.nbytes // 4}I", layout)
    if not counts or 0 in counts or sum(counts) != len(frames) - 3:
        raise ProtocolError(f"frame counts {list(counts)[:8]} do not match the"
                            f" {len(frames) - 3} frames that follow")
    buffers, i = [], 3
    for k in counts:
        if k == 1:
            buffers.append(frames[i])
        else:
            parts = [memoryview(f).cast("B") for f in frames[i:i + k]]
            joined = np.empty(sum(p.nbytes for p in parts), np.uint8)  # not zeroed first
            at = 0
            for p in parts:
                joined[at:at + p.nbytes] = p
                at += p.nbytes
            buffers.append(joined.data)
        i += k
    return buffers


def frame_bytes(frames) -> int:
    return sum(memoryview(f).nbytes for f in frames)
