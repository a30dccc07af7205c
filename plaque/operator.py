"""What a user writes: an operator class, instantiated once per shard, and its context."""

from __future__ import annotations


class Operator:
    """Base class of operators. Override what you need; every method is optional.

    ``on_start(ctx, t)`` is called when run t starts on this shard's worker, before any input;
    ``on_input(ctx, t, port, value)`` is called for each tuple that reaches this shard;
    ``on_complete(ctx, t)`` once no tuple with timestamp <= t can reach it any more (also when
    it received nothing). A source is a node without inputs: it gets ``on_complete`` as soon as
    run t starts and emits from there, usually from ``ctx.arg``.

    >>> class Double(Operator):
    ...     def on_input(self, ctx, t, port, value):
    ...         ctx.emit(2 * value)
    """

    def on_start(self, ctx: Context, t) -> None:
        pass

    def on_input(self, ctx: Context, t, port: int, value) -> None:
        pass

    def on_complete(self, ctx: Context, t) -> None:
        pass


class Context:
    """Handed to every operator call; says which shard this is and lets it emit.

    Attributes: ``node`` (name), ``shard``, ``num_shards``, ``worker`` (id), ``arg`` (the
    argument given to this run), ``services`` (whatever the worker process was started with).
    """

    __slots__ = ("node", "shard", "num_shards", "worker", "arg", "services", "_emit",
                 "_output", "_hold", "_t")

    def __init__(self, node, shard, num_shards, worker, emit, output, hold=None, services=None):
        self.node, self.shard, self.num_shards, self.worker = node, shard, num_shards, worker
        self._emit, self._output, self._hold = emit, output, hold
        self.services = services if services is not None else {}
        self.arg = None
        self._t = None

    def hold(self) -> Capability:
        """Keep this shard's capability for the current run after the handler returns.

        Downstream shards are not told "complete" until it is released, so the shard can
        finish its work later (on another thread) and still emit. See ``Capability``.
        """
        return self._hold(self._t)

    def emit(self, value, port: int = 0, shard: int | None = None) -> None:
        """Send ``value`` on output ``port``; ``shard`` picks the destination on KEYED edges."""
        self._emit(self._t, value, port, shard)

    def output(self, value) -> None:
        """Hand ``value`` to the driver: it appears in the run's result under this node/shard."""
        self._output(self._t, value)


class Capability:
    """The right to emit at timestamp ``t`` from one shard, held until ``release()``.

    ``emit``, ``output`` and ``release`` must be called on the worker's event loop; from any
    other thread use ``post(fn)``, which runs ``fn(capability)`` there. An exception in ``fn``
    fails the run like an exception in a handler, and releases the capability.
    """

    __slots__ = ("t", "_core", "_graph", "_node", "_shard", "released")

    def __init__(self, core, graph, node, shard, t):
        self._core, self._graph, self._node, self._shard, self.t = core, graph, node, shard, t
        self.released = False

    def emit(self, value, port: int = 0, shard: int | None = None) -> None:
        self._check()
        self._core._emit(self._graph.gid, self._node, self._shard, self.t, value, port, shard)

    def output(self, value) -> None:
        self._check()
        self._core._output(self._graph.gid, self._node, self._shard, self.t, value)

    def release(self) -> None:
        self._check()
        self.released = True
        self._core._release(self._graph, self._node, self._shard, self.t)

    def post(self, fn) -> None:
        """Thread-safe: run ``fn(self)`` on the worker's event loop."""
        self._core.post(self, fn)

    def _check(self):
        if self.released:
            raise RuntimeError(f"capability for t={self.t} was already released")
