"""What a user writes: an operator class, instantiated once per shard, and its context."""

from __future__ import annotations


class Operator:
    """Base class of operators. Override what you need; every method is optional.

    ``on_input(ctx, t, port, value)`` is called for each tuple that reaches this shard;
    ``on_complete(ctx, t)`` once no tuple with timestamp <= t can reach it any more (also when
    it received nothing). A source is a node without inputs: it gets ``on_complete`` as soon as
    run t starts and emits from there, usually from ``ctx.arg``.

    >>> class Double(Operator):
    ...     def on_input(self, ctx, t, port, value):
    ...         ctx.emit(2 * value)
    """

    def on_input(self, ctx: Context, t, port: int, value) -> None:
        pass

    def on_complete(self, ctx: Context, t) -> None:
        pass


class Context:
    """Handed to every operator call; says which shard this is and lets it emit.

    Attributes: ``node`` (name), ``shard``, ``num_shards``, ``worker`` (id), ``arg`` (the
    argument given to this run).
    """

    __slots__ = ("node", "shard", "num_shards", "worker", "arg", "_emit", "_output", "_t")

    def __init__(self, node, shard, num_shards, worker, emit, output):
        self.node, self.shard, self.num_shards, self.worker = node, shard, num_shards, worker
        self._emit, self._output = emit, output
        self.arg = None
        self._t = None

    def emit(self, value, port: int = 0, shard: int | None = None) -> None:
        """Send ``value`` on output ``port``; ``shard`` picks the destination on KEYED edges."""
        self._emit(self._t, value, port, shard)

    def output(self, value) -> None:
        """Hand ``value`` to the driver: it appears in the run's result under this node/shard."""
        self._output(self._t, value)
