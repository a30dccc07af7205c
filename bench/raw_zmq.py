"""Raw pyzmq baselines, measured between two OS processes on this machine.

The plaque engine benchmark reports engine/raw ratios; these are the "raw"
side: what plain pyzmq achieves with no engine on top, for the same kinds of
traffic the engine produces:

* ``push_pull_throughput``: small single-frame messages, PUSH -> PULL (msg/s);
* ``batched_push_pull_throughput``: many small items packed per frame (items/s),
  to compare with an engine that batches tuples per message;
* ``dealer_router_rtt``: mean round trip of a small message through an echo
  ROUTER in the other process (s);
* ``zero_copy_throughput``: large numpy buffers sent with copy=False and
  received without copying (bytes/s).

With ``$PLAQUE_KEYS`` set every socket uses CURVE with those keys, as the engine's do, so a
secured engine is compared with a secured baseline.

Each test runs over ``tcp`` (127.0.0.1, random port) or ``ipc`` (a unique
socket file in the temp dir, removed afterwards). The peer is a 'spawn'ed
process, stopped in a ``finally``; every wait has a timeout.

Run: ``python -m bench.raw_zmq`` (or import as ``bench.raw_zmq``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import tempfile
import time
import uuid

import numpy as np
import zmq

from plaque import security

_TIMEOUT_MS = 20_000  # any single socket wait; a dead peer must not hang us
_RESULT_TIMEOUT_S = 60.0  # waiting for the peer's report
_JOIN_TIMEOUT_S = 5.0


def _bind(sock: zmq.Socket, transport: str) -> tuple[str, str | None]:
    """Bind sock; return (endpoint for the peer, ipc file to remove or None). With
    ``$PLAQUE_KEYS`` set, a CURVE server, as the engine's sockets are then."""
    security.server(sock)
    if transport == "tcp":
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        return f"tcp://127.0.0.1:{port}", None
    if transport == "ipc":
        path = os.path.join(tempfile.gettempdir(), f"rawzmq-{uuid.uuid4().hex}.sock")
        sock.bind(f"ipc://{path}")
        return f"ipc://{path}", path
    raise ValueError(f"transport must be 'tcp' or 'ipc', not {transport!r}")


def _socket(ctx: zmq.Context, kind: int, hwm: int | None = None) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.linger = 0  # never block close/term on unsent data
    sock.rcvtimeo = sock.sndtimeo = _TIMEOUT_MS
    if hwm is not None:
        sock.sndhwm = sock.rcvhwm = hwm
    return sock


@contextlib.contextmanager
def _peer(target, *args):
    """Run target(conn, *args) in a spawned process; yield our Pipe end.

    The process is always joined (then terminated if still alive) on exit."""
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child_conn, *args), daemon=True)
    proc.start()
    child_conn.close()
    try:
        yield parent_conn
    finally:
        proc.join(_JOIN_TIMEOUT_S)
        if proc.is_alive():
            proc.terminate()
            proc.join(_JOIN_TIMEOUT_S)
        parent_conn.close()


def _result(conn) -> float:
    if not conn.poll(_RESULT_TIMEOUT_S):
        raise TimeoutError("peer did not report a result in time")
    value = conn.recv()
    if isinstance(value, BaseException):
        raise RuntimeError("peer failed") from value
    return value


# --- peers (module level so 'spawn' can import them) ------------------------

def _pull_peer(conn, endpoint: str, n: int, zero_copy: bool, hwm: int | None) -> None:
    """Receive n messages; report seconds from first to last arrival."""
    ctx = zmq.Context()
    sock = _socket(ctx, zmq.PULL, hwm)
    try:
        security.client(sock)  # CURVE when $PLAQUE_KEYS is set, like the engine
        sock.connect(endpoint)
        sock.recv(copy=not zero_copy)  # the clock starts at the first arrival
        start = time.perf_counter()
        if zero_copy:
            for _ in range(n - 1):
                # Wrap the frame's memory as an array: no copy of the payload.
                arr = np.frombuffer(sock.recv(copy=False).buffer, dtype=np.uint8)
                arr[-1]  # touch it, as a consumer would
        else:
            recv = sock.recv
            for _ in range(n - 1):
                recv()
        conn.send(time.perf_counter() - start)
    except BaseException as exc:  # report rather than leave the parent waiting
        conn.send(exc)
    finally:
        sock.close()
        security.release(ctx)
        ctx.term()


def _echo_peer(conn, endpoint: str) -> None:
    """ROUTER echo server; an empty payload means stop."""
    ctx = zmq.Context()
    sock = _socket(ctx, zmq.ROUTER)
    try:
        security.client(sock)  # CURVE when $PLAQUE_KEYS is set, like the engine
        sock.connect(endpoint)
        conn.send(0.0)  # connected; the parent may start
        while True:
            ident, payload = sock.recv_multipart()
            if not payload:
                break
            sock.send_multipart([ident, payload])
    except zmq.Again:
        pass  # parent gone: just exit
    finally:
        sock.close()
        security.release(ctx)
        ctx.term()


# --- benchmarks -------------------------------------------------------------

def _push_messages(payload, n: int, transport: str, zero_copy: bool = False,
                   hwm: int | None = None) -> float:
    """Send payload n times PUSH->PULL; return the receiver's elapsed seconds
    over the last n-1 messages (first to last arrival)."""
    if n < 2:
        raise ValueError("need at least 2 messages to time first-to-last")
    ctx = zmq.Context()
    sock = _socket(ctx, zmq.PUSH, hwm)
    path = None
    try:
        endpoint, path = _bind(sock, transport)
        with _peer(_pull_peer, endpoint, n, zero_copy, hwm) as conn:
            send = sock.send
            copy = not zero_copy
            for _ in range(n):
                send(payload, copy=copy)  # blocks (bounded by sndtimeo) at HWM
            return _result(conn)
    finally:
        sock.close()
        security.release(ctx)
        ctx.term()
        if path and os.path.exists(path):
            os.remove(path)


def push_pull_throughput(n_messages: int = 200_000, size: int = 64,
                         transport: str = "tcp") -> float:
    """Messages/s of size-byte single-frame messages, PUSH -> PULL.

    copy=True: for small messages copying is cheaper than zero-copy tracking."""
    elapsed = _push_messages(b"x" * size, n_messages, transport)
    return (n_messages - 1) / elapsed


def batched_push_pull_throughput(n_items: int = 1_000_000, items_per_message: int = 256,
                                 item_size: int = 16, transport: str = "tcp") -> float:
    """Items/s when items_per_message items are packed into each frame."""
    n_messages = max(2, n_items // items_per_message)
    payload = b"".join(i.to_bytes(item_size, "little") for i in range(items_per_message))
    elapsed = _push_messages(payload, n_messages, transport)
    return (n_messages - 1) * items_per_message / elapsed


def zero_copy_throughput(size: int = 1 << 20, n: int = 500, transport: str = "tcp") -> float:
    """Bytes/s of size-byte numpy arrays, copy=False at both ends.

    A small HWM bounds memory (n * size could be large) without stalling."""
    arr = np.ones(size, dtype=np.uint8)
    elapsed = _push_messages(arr, n, transport, zero_copy=True, hwm=16)
    return (n - 1) * size / elapsed


def dealer_router_rtt(n: int = 5000, transport: str = "tcp") -> float:
    """Mean round-trip seconds of a small message DEALER -> ROUTER echo -> back."""
    ctx = zmq.Context()
    sock = _socket(ctx, zmq.DEALER)
    path = None
    try:
        endpoint, path = _bind(sock, transport)
        with _peer(_echo_peer, endpoint) as conn:
            _result(conn)  # wait until the echo server has connected
            msg = b"x" * 64
            for _ in range(200):  # warm-up: connection, caches, allocator
                sock.send(msg)
                sock.recv()
            start = time.perf_counter()
            for _ in range(n):
                sock.send(msg)
                sock.recv()
            elapsed = time.perf_counter() - start
            sock.send(b"")  # ask the echo server to stop
            return elapsed / n
    finally:
        sock.close()
        security.release(ctx)
        ctx.term()
        if path and os.path.exists(path):
            os.remove(path)


def main() -> None:
    tests = [
        ("push/pull 64 B", push_pull_throughput, 1, "msg/s"),
        ("batched 256x16 B", batched_push_pull_throughput, 1, "items/s"),
        ("dealer/router RTT", dealer_router_rtt, 1e6, "us"),
        ("zero-copy 1 MiB", zero_copy_throughput, 1e-9, "GB/s"),
    ]
    rows = [(transport, name, fn(transport=transport) * scale, unit)
            for transport in ("tcp", "ipc") for name, fn, scale, unit in tests]
    print(f"raw pyzmq {zmq.pyzmq_version()} / libzmq {zmq.zmq_version()}, nproc={os.cpu_count()}")
    print(f"{'transport':<10}{'test':<20}{'value':>14}  unit")
    for transport, name, value, unit in rows:
        print(f"{transport:<10}{name:<20}{value:>14,.2f}  {unit}")


if __name__ == "__main__":
    main()
