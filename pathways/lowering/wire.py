"""A lowered graph's wire form: what a client sends to have it installed, and the Plaque graph
the coordinator rebuilds from it without running user code.

A graph travels as its skeleton, ``WireNode``s (name, shards, the host of every shard, whether
it waits for "complete" notifications) and ``WireEdge``s (endpoints, routing, ports), plus one
cloudpickle blob holding every node's operator factory and the kernel bodies. The coordinator
rebuilds the graph with a ``LazyFactory`` per node, so it never unpickles user code, JAX or
host operators; each host unpickles the blob once per program, when it builds its first shard.

This module imports only Plaque and the standard library (cloudpickle on the hosts): the
coordinator imports it and nothing else of the lowering.
"""

from __future__ import annotations

from typing import NamedTuple

import plaque
from plaque.shipping import ship

from ..errors import ProgramError


class WireNode(NamedTuple):
    """A node without its code: ``placement`` names the host (Plaque worker id) of each shard."""

    name: str
    shards: int
    placement: tuple[int, ...]
    notify: bool


class WireEdge(NamedTuple):
    """An edge between nodes ``src`` and ``dst`` (indices), ``routing`` a ``plaque.Routing``
    value."""

    src: int
    dst: int
    routing: str
    src_port: int
    dst_port: int


class LazyFactory:
    """A node's operator factory kept as cloudpickle bytes until a host builds it.

    The coordinator installs graphs without ever unpickling user code: it only sees the
    graph's shape; the hosts unpickle the factories (once per program per process).
    """

    _cache: dict[bytes, list] = {}

    def __init__(self, blob: bytes, index: int):
        self.blob, self.index = blob, index

    def __call__(self):
        import cloudpickle

        factories = self._cache.get(self.blob)
        if factories is None:
            factories = self._cache[self.blob] = cloudpickle.loads(self.blob)
        return factories[self.index]()


def skeleton(graph: plaque.Graph) -> tuple[list[WireNode], list[WireEdge]]:
    """The graph's shape without its code: nodes (name, shards, worker ids) and edges."""
    nodes = [WireNode(n.name, n.shards, n.placement, n.notify) for n in graph.nodes]
    edges = [WireEdge(e.src, e.dst, e.routing.value, e.src_port, e.dst_port)
             for e in graph.edges]
    return nodes, edges


def pack(graph: plaque.Graph, bodies) -> tuple[list[WireNode], list[WireEdge], bytes]:
    """``graph`` for the wire: its skeleton, and its operator factories shipped as one blob
    (code from scripts by value, found through ``bodies``, the kernel bodies)."""
    nodes, edges = skeleton(graph)
    return nodes, edges, ship([n.factory for n in graph.nodes], bodies)


def rebuild(nodes, edges, blob: bytes, live_workers: list[int]) -> plaque.Graph:
    """The Plaque graph from a skeleton; placement becomes indices into the live workers.
    ``ProgramError`` if a shard's host is not live."""
    index = {w: i for i, w in enumerate(live_workers)}
    g = plaque.Graph()
    made = []
    for i, (name, shards, placement, notify) in enumerate(nodes):
        try:
            where = [index[w] for w in placement]
        except KeyError as exc:
            raise ProgramError(f"host {exc.args[0]} is not live") from None
        made.append(g.node(name, LazyFactory(blob, i), shards, placement=where, notify=notify))
    for src, dst, routing, src_port, dst_port in edges:
        g.edge(made[src], made[dst], plaque.Routing(routing), src_port, dst_port)
    return g
