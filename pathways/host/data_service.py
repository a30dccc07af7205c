"""A host's data service: the client-facing socket through which array data moves.

Clients put, get, save and delete their arrays' shards here directly, so array data never
passes through the coordinator; they also ask for the host's status and timeline, and have
input functions run on the host (``Generate``). Each request class has its handler
(``DataService._REQUESTS``); a request someone waits for is always answered, with the value or
with the error that stopped it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from plaque.logutil import dropped

from .. import checkpoint_format, protocol
from ..dtypes import shippable, wire_dtype
from ..errors import PathwaysError, ProgramError, RemoteError
from ..service import RouterService
from .host import Host

__all__ = ["DataService"]

log = logging.getLogger("pathways.host.data_service")


def _refusal(exc: Exception) -> PathwaysError:
    """What a refused data-service request says: a missing or deleted array by name."""
    if isinstance(exc, PathwaysError):
        return exc
    if isinstance(exc, KeyError):
        return PathwaysError(f"no such array on this host: {exc.args[0] if exc.args else exc}")
    return PathwaysError(f"the host could not serve the request: {exc!r}")


class DataService:
    """The host's client-facing socket: put, get (answered when ready), delete.

    ``serve(handle)`` makes the socket that hands it requests: ``router(ctx, bind)`` gives
    a ZeroMQ ROUTER (``pathways.service.RouterService``); a simulated host gives its own, with
    the same members (``start``, ``reply``, ``close``, ``address``)."""

    def __init__(self, host: Host, serve: Callable[[Callable], RouterService]):
        self.host = host
        self.service = serve(self._handle)
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
        self.host.put((msg.array_id, msg.device), np.asarray(msg.value), msg.owner,
                      timeout=msg.timeout)

    def _delete(self, ident, msg) -> None:
        self.host.delete(msg.keys)

    def _delete_owner(self, ident, msg) -> None:
        self.host.drop_waits(msg.owner, PathwaysError(f"client {msg.owner} freed its arrays"))
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
            msg.req, shippable(value))))

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

    shape, dtype = tuple(msg.shape), wire_dtype(msg.dtype)
    value = np.asarray(cloudpickle.loads(msg.blob)(msg.slices))
    if value.shape != shape or value.dtype != dtype:
        raise ProgramError(f"the input function returned {value.dtype}{list(value.shape)}"
                           f" for the part {msg.slices} of device {msg.device}; expected"
                           f" {dtype}{list(shape)}")
    return value
