"""Streams: one long-lived computation the driver feeds, epoch after epoch.

``stream = installed.stream()`` opens epoch 0 of a graph with input nodes (``g.input(name,
shards)``); ``stream.send(values)`` hands values to an input shard, which emits them
downstream; ``stream.advance()`` closes the epoch (the future it returns gives the epoch's
``RunResult``) and opens the next; ``stream.close()`` closes the last one. Each epoch is a
run: progress tracking tells every operator when an epoch's input is complete
(``on_complete``), per shard in epoch order, while later epochs already flow. State that lives
across epochs goes in ``ctx.keyed_state`` (per shard, dropped once the stream's last epoch is
over); what belongs to one epoch stays in ``ctx.state``.

An input shard holds its capability for an epoch from its start until the driver advances
it (``Kind.ADVANCE``); the driver's values reach it as ``Kind.FEED`` on the coordinator's
control channel, after the epoch's START and before its ADVANCE, so none is lost or late.

Back-pressure: at most ``max_in_flight`` closed epochs are unfinished at a time; ``advance``
waits for the oldest to finish before it opens one more, so a driver faster than its graph
waits instead of piling epochs (and what was sent into them) up in the workers' queues.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import threading
from collections import deque

from .errors import GraphError, PlaqueError
from .operator import Operator

__all__ = ["Stream", "StreamInput"]


class StreamInput(Operator):
    """The operator of an input node: in an epoch of a stream it holds its capability until
    the driver advances the epoch, emitting what the driver sends meanwhile; in a plain run
    it has nothing to emit and is done at once."""

    def on_start(self, ctx, t):
        if ctx.stream is not None:
            ctx.local_graph.inputs[(ctx.node_index, ctx.shard, t)] = ctx.hold()


def input_nodes(graph) -> dict:
    """Input node name -> node, for a graph's ``g.input`` nodes."""
    return {n.name: n for n in graph.nodes if n.factory is StreamInput}


class StreamClosed(PlaqueError):
    """A value was sent to, or an epoch advanced on, a stream already closed."""


MAX_IN_FLIGHT = 16  # closed epochs not finished yet before advance() waits for the oldest


class Stream:
    """The driver's handle on a stream of a graph installed on a cluster (see the module).

    Thread-safe; calls take effect in the order they are made. ``epoch`` is the number of
    the open epoch, counted from 0 (not its run's timestamp, which ``RunResult`` gives).
    ``max_in_flight``: closed epochs that may be unfinished before ``advance`` waits."""

    _ids = itertools.count()

    def __init__(self, installed, arg=None, max_in_flight: int = MAX_IN_FLIGHT):
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) \
                or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        self._in_flight: deque = deque()  # closed epochs' futures, oldest first
        self.installed, self.arg = installed, arg
        self.inputs = input_nodes(installed.graph)
        if not self.inputs:
            raise GraphError(f"graph {installed.graph.name!r} has no input node to stream"
                             " into: add one with g.input(name, shards)")
        self.id = next(Stream._ids)
        self.loop_t = None  # the open epoch's timestamp, kept on the cluster's loop thread
        self.epoch = 0
        self.closed = False
        self._lock = threading.Lock()
        self._rr = itertools.count()  # round robin over the shards of an input node
        self._current = installed.cluster.open_epoch(self, None)

    def send(self, values, node: str | None = None, shard: int | None = None,
             keys=None) -> None:
        """Send a batch of ``values`` (a list, or numpy rows) into the open epoch, through
        input node ``node`` (may be left out when there is one), shard ``shard`` (default:
        round robin); ``keys``, one per value, route them on the input's KEYED edges."""
        target = self._input(node)
        if shard is None:
            shard = next(self._rr) % target.shards
        elif isinstance(shard, bool) or not isinstance(shard, int) \
                or not 0 <= shard < target.shards:
            raise ValueError(f"input {target.name!r} has shards 0..{target.shards - 1}, got"
                             f" shard={shard!r}")
        if not isinstance(values, (list, tuple)) and not hasattr(values, "dtype"):
            values = list(values)
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"send: {len(values)} values but {len(keys)} keys")
        with self._lock:
            self._check_open()
            self.installed.cluster.feed(self, target, shard, values, keys)

    def advance(self, timeout: float | None = None) -> cf.Future:
        """Close the open epoch and open the next; the future gives the closed epoch's
        ``RunResult`` once every operator is done with it. With ``max_in_flight`` closed
        epochs unfinished, first waits (at most ``timeout`` seconds: ``TimeoutError``, the
        epoch still open) for the oldest to finish, failed or not."""
        with self._lock:
            self._check_open()
            while self._in_flight and self._in_flight[0].done():
                self._in_flight.popleft()
            if len(self._in_flight) >= self.max_in_flight:
                try:  # exception(): waits (a simulated cluster's future runs it meanwhile)
                    self._in_flight[0].exception(timeout)
                except cf.TimeoutError:
                    raise TimeoutError(f"stream {self.id}: {len(self._in_flight)} epochs"
                                       f" still running after {timeout} s; epoch"
                                       f" {self.epoch} stays open") from None
                except cf.CancelledError:
                    pass  # the caller cancelled its future: nothing to wait for
                self._in_flight.popleft()
            closing = self._current
            self._current = self.installed.cluster.open_epoch(self, closing)
            self._in_flight.append(closing)
            self.epoch += 1
        return closing

    def close(self) -> cf.Future:
        """Close the last epoch and end the stream; its keyed state goes once that epoch is
        over on each worker. The future gives the last epoch's ``RunResult``."""
        with self._lock:
            self._check_open()
            self.closed = True
            self.installed.cluster.close_epoch(self, self._current)
        return self._current

    def _input(self, node):
        if node is None:
            if len(self.inputs) > 1:
                raise ValueError(f"send: name the input node, one of {sorted(self.inputs)}")
            return next(iter(self.inputs.values()))
        try:
            return self.inputs[node]
        except KeyError:
            raise ValueError(f"send: {node!r} is not an input node (inputs:"
                             f" {sorted(self.inputs)})") from None

    def _check_open(self):
        if self.closed:
            raise StreamClosed(f"stream {self.id} of graph {self.installed.graph.name!r} is"
                               " closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.closed:
            self.close()
