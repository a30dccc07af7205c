"""Small operators for tests of graphs (the engine's own tests use them): a source of
``(shard, i)`` tuples, a forwarder, a keyed router and a collector of sorted results.

>>> from plaque import BROADCAST, Graph
>>> g = Graph("sparse")
>>> src = g.node("src", Source, 4)
>>> _ = g.edge(src, g.node("collect", Collect, 1), BROADCAST)
"""

from __future__ import annotations

from ..operator import Operator

__all__ = ["Collect", "Forward", "Route", "Source"]


class Source(Operator):
    """Emits ``arg`` tuples ``(shard, i)`` when the run starts."""

    def on_complete(self, ctx, t):
        for i in range(ctx.arg):
            ctx.emit((ctx.shard, i))


class Forward(Operator):
    """Passes every value on."""

    def on_input(self, ctx, t, port, value):
        ctx.emit(value)


class Route(Operator):
    """Keyed exchange: ``(s, i)`` goes to shard ``i % 3``; values with ``i % 5 == 4`` go
    nowhere (a sparse exchange: some shards may get nothing)."""

    def on_input(self, ctx, t, port, value):
        if value[1] % 5 != 4:
            ctx.emit(value, shard=value[1] % 3)


class Collect(Operator):
    """Outputs the sorted list of what it received, once its input is complete."""

    def __init__(self):
        self.got = {}

    def on_input(self, ctx, t, port, value):
        self.got.setdefault(t, []).append(value)

    def on_complete(self, ctx, t):
        ctx.output(sorted(self.got.pop(t, [])))
