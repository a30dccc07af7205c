"""The inter-chip links between hosts: collective values go host to host, executor to executor.

Each host binds one PULL socket and keeps one PUSH socket per peer host, all used only by the
host's executor thread, which reads the PULL socket itself (no receiver thread, no hand-off).
What the executor's devices send to one peer host during one executor turn leaves as one
message: a fixed binary header describing every value, then each value's raw bytes as its own
frame (no pickle). A value sent to several devices of the same host (psum, all_gather) travels
once, with the list of its destinations.

Header layout (little-endian): ``u32`` item count, then per item ``u8`` gang-key length,
``u8`` dtype-string length, ``u16`` destination count, ``u8`` ndim, then that many ``i64``:
gang key, exchange seq, source device, destinations, shape; an ``f64`` lag; then the dtype's
wire name (``pathways.dtypes.wire_name``: "<f4", "bfloat16"). Exchange keys are ``(gang key,
seq)`` with a gang key of ints. A value's frame is its raw bytes in C order
(``pathways.dtypes.raw_bytes``), so ml_dtypes' types travel like numpy's own.

The lag is how far the sender's virtual time at the collective was behind its real time when
it sent (<= 0). The receiver takes the value as available at its real arrival plus that lag:
the sender's virtual time plus the real transit, never earlier than the data could have come,
and with no clock shared between hosts. The sender's own lateness (a late publication, a busy
executor) is then not booked on the receiver's device.
"""

from __future__ import annotations

import logging
import struct

import numpy as np
import zmq

from plaque import security
from plaque.logutil import dropped
from plaque.wire import ProtocolError
from plaque.zmq_transport import bind_socket, readable, recv_frames, send_frames

from ..dtypes import from_bytes, raw_bytes, wire_dtype, wire_name
from ..errors import ProgramError

log = logging.getLogger("pathways.host.ici")

_COUNT = struct.Struct("<I")
_ITEM = struct.Struct("<BBHB")
_LAG = struct.Struct("<d")
RECEIVE_BATCH = 256  # messages read per executor turn, so sending is never starved


def encode(items) -> list:
    """Frames for ``[(key, src, dsts, value[, lag]), ...]``: the header, then one frame per
    value."""
    head = [_COUNT.pack(len(items))]
    frames: list = []
    for key, src, dsts, value, *lag in items:
        a = np.asarray(value)
        dt = _wire_name(a.dtype).encode()
        try:
            gang, seq = key
            ints = (*gang, seq, src, *dsts, *a.shape)
            head.append(_ITEM.pack(len(gang), len(dt), len(dsts), a.ndim))
            head.append(struct.pack(f"<{len(ints)}q", *ints))
            head.append(_LAG.pack(lag[0] if lag else 0.0))
        except (struct.error, TypeError, ValueError) as exc:
            raise ProgramError(f"exchange {key!r} from {src!r} to {dsts!r} cannot travel "
                               f"between hosts: its gang key, seq, devices and shape must be "
                               f"64-bit ints, at most 255 and 65535 of them ({exc})") from None
        head.append(dt)
        frames.append(raw_bytes(a))
    return [b"".join(head), *frames]


def decode(frames) -> list:
    """``[(key, src, dsts, value, lag), ...]`` from ``encode``'s frames; ProtocolError if
    malformed.
    Values are fresh writable arrays (a receiver never shares memory with the network)."""
    try:
        meta = bytes(frames[0])
        (count,) = _COUNT.unpack_from(meta, 0)
        if len(frames) != count + 1:
            raise ProtocolError(f"ICI message with {count} items has {len(frames)} frames")
        off, items = _COUNT.size, []
        for i in range(count):
            ngang, ndt, ndst, ndim = _ITEM.unpack_from(meta, off)
            off += _ITEM.size
            n = ngang + 2 + ndst + ndim
            ints = struct.unpack_from(f"<{n}q", meta, off)
            off += 8 * n
            (lag,) = _LAG.unpack_from(meta, off)
            off += _LAG.size
            dtype = wire_dtype(meta[off:off + ndt].decode())
            off += ndt
            gang, seq, src = ints[:ngang], ints[ngang], ints[ngang + 1]
            dsts, shape = ints[ngang + 2:ngang + 2 + ndst], ints[ngang + 2 + ndst:]
            if any(n < 0 for n in shape):
                raise ProtocolError(f"ICI item with a negative dimension: {shape}")
            value = from_bytes(frames[1 + i], dtype, shape).copy()
            items.append(((gang, seq), src, dsts, value, lag))
        if off != len(meta):
            raise ProtocolError(f"ICI header has {len(meta) - off} bytes left over")
        return items
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"malformed ICI message: {exc!r}") from None


def _wire_name(dtype) -> str:
    """The wire name of an exchanged value's dtype; ProgramError if it cannot travel."""
    try:
        if dtype.hasobject:
            raise ProgramError(f"an array of {dtype} holds pointers, not values")
        return wire_name(dtype)
    except ProgramError as exc:
        raise ProgramError(f"a collective can only carry numeric arrays (and bools, strings,"
                           f" times) between hosts: {exc}") from None


class IciOutbox:
    """What a host's ICI link sends: values queued during a turn, one message per peer host
    at ``flush``. ``worker_of`` (device -> host worker id) and ``peers`` (worker id -> ICI
    address) are filled in by the host as the topology arrives; ``transmit(worker, frames)``
    is the link's own (a ZeroMQ socket here, a simulated one in ``pathways.simulated``)."""

    def __init__(self, worker_of: dict):
        self.worker_of = worker_of
        self.peers: dict[int, str] = {}
        self._out: dict[int, list] = {}
        self.sent = {"messages": 0, "bytes": 0}  # what left for other hosts

    def queue(self, key, src, dsts, value, lag: float = 0.0) -> None:
        """Send ``value`` from device ``src`` to devices ``dsts`` at the next ``flush``;
        ``lag``: the sender's virtual time minus its real time (see the module docstring).
        ProgramError, here in the sender's collective, for a value that cannot travel."""
        _wire_name(np.asarray(value).dtype)
        by_worker: dict[int, list] = {}
        for d in dsts:
            by_worker.setdefault(self.worker_of[d], []).append(d)
        for worker, ds in by_worker.items():
            self._out.setdefault(worker, []).append((key, src, ds, value, lag))

    def flush(self, failed=None) -> None:
        """One message per peer host with everything queued for it. A message that cannot
        be made or sent: ``failed(key, exc)`` for each of its exchanges (the executor fails
        their gangs at once, instead of leaving peers to wait for values that never come);
        raised if no ``failed`` is given."""
        if not self._out:
            return
        out, self._out = self._out, {}
        for worker, items in out.items():
            try:
                frames = encode(items)
                self.transmit(worker, frames)
            except Exception as exc:
                if failed is None:
                    raise
                for key in dict.fromkeys(item[0] for item in items):
                    failed(key, exc)
                continue
            self.sent["messages"] += 1
            self.sent["bytes"] += sum(memoryview(f).nbytes for f in frames)

    def transmit(self, worker: int, frames: list) -> None:
        raise NotImplementedError


class IciLink(IciOutbox):
    """The host's end of the ICI network over ZeroMQ: a PULL socket it reads, a PUSH socket
    per peer host."""

    def __init__(self, ctx: zmq.Context, bind: str, worker_of: dict):
        super().__init__(worker_of)
        self.ctx = ctx
        self._pull = ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self.address = bind_socket(self._pull, bind)
        self.fd = self._pull.getsockopt(zmq.FD)
        self._push: dict[int, zmq.Socket] = {}

    def transmit(self, worker: int, frames: list) -> None:
        send_frames(self._socket(worker), frames)

    def readable(self) -> bool:
        return readable(self._pull)

    def receive(self) -> list:
        """What has arrived, without waiting: ``[(key, src, dsts, value, lag), ...]``."""
        items: list = []
        for _ in range(RECEIVE_BATCH):
            frames = recv_frames(self._pull)
            if frames is None:
                break
            try:
                items.extend(decode([f.buffer for f in frames]))
            except ProtocolError as exc:  # a bad message must not stop the link
                dropped(log, "an ICI message", str(exc))
        return items

    def _socket(self, worker: int) -> zmq.Socket:
        s = self._push.get(worker)
        if s is None:
            s = self._push[worker] = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            security.connect(s, self.peers[worker])
        return s

    def close(self) -> None:
        for s in self._push.values():
            s.close(0)
        self._pull.close(0)
