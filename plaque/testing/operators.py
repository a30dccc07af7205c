"""Small operators for tests of graphs (the engine's own tests use them): a source of
``(shard, i)`` tuples, a forwarder, a keyed router and a collector of sorted results; and two
graphs built from them, a chain across workers and a sparse keyed exchange (with its
expected outputs).

>>> from plaque import BROADCAST, Graph
>>> g = Graph("sparse")
>>> src = g.node("src", Source, 4)
>>> _ = g.edge(src, g.node("collect", Collect, 1), BROADCAST)
"""

from __future__ import annotations

from ..graph import KEYED, ONE_TO_ONE, Graph
from ..operator import Operator

__all__ = ["Collect", "Forward", "Route", "Source", "chain", "expected_sparse", "sparse_graph"]


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


def chain(crossings: int, workers: int = 2, middle=Forward) -> Graph:
    """``src -> f0 -> ... -> collect``, one shard each, every ``middle`` operator on the next
    worker: the tuples cross workers ``crossings`` times (collect sits with the last one)."""
    g = Graph("chain")
    prev = g.node("src", Source, 1, placement=[0])
    for i in range(crossings):
        node = g.node(f"f{i}", middle, 1, placement=[(i + 1) % workers])
        g.edge(prev, node)
        prev = node
    g.edge(prev, g.node("collect", Collect, 1, placement=[crossings % workers]))
    return g


def sparse_graph(src_shards: int = 4, dst_shards: int = 6) -> Graph:
    """``src -> router -> collect`` with a keyed (sparse) exchange through ``Route``."""
    g = Graph("sparse")
    s = g.node("src", Source, src_shards)
    r = g.node("router", Route, src_shards)
    c = g.node("collect", Collect, dst_shards)
    g.edge(s, r, ONE_TO_ONE)
    g.edge(r, c, KEYED)
    return g


def expected_sparse(n: int, src_shards: int = 4, dst_shards: int = 6) -> dict:
    """What ``sparse_graph``'s collect shards output for a run with argument ``n``."""
    want = {d: [] for d in range(dst_shards)}
    for s in range(src_shards):
        for i in range(n):
            if i % 5 != 4:
                want[i % 3].append((s, i))
    return {d: [sorted(v)] for d, v in want.items()}
