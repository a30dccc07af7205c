"""Sharded dataflow graphs: one node per sharded operator, edges with a routing kind.

A node is one operator with N shards; it is never expanded into N graph nodes, so a chain of
two N-shard operators is two nodes and one edge whatever N is. An edge joins an output port of
one node to an input port of another and says how tuples find their destination shard:

- ``ONE_TO_ONE``: shard i sends to shard i (both nodes must have the same shard count);
- ``BROADCAST``: every tuple goes to every destination shard;
- ``KEYED``: the sender names the destination shard of each tuple (any subset, or none).

A KEYED edge may combine (``combine=operator.add``, or a ``Combiner``): a sender folds the values
it emits under one key into one accumulator per turn, and the receiver gets ``(key,
accumulator)`` pairs, as a Flink or Beam combiner, or Bytewax's ``reduce_final``, pre-aggregates.

Graphs are acyclic: timestamps are run numbers and do not change along edges.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import GraphError
from .operator import Operator


class Routing(enum.Enum):
    """How an edge routes a tuple: to the same shard index (ONE_TO_ONE, equal shard counts),
    to every shard (BROADCAST), or to the shard its key or ``shard=`` picks (KEYED)."""

    ONE_TO_ONE = "one_to_one"
    BROADCAST = "broadcast"
    KEYED = "keyed"


ONE_TO_ONE = Routing.ONE_TO_ONE
BROADCAST = Routing.BROADCAST
KEYED = Routing.KEYED


@dataclass(frozen=True)
class Node:
    """A sharded operator: ``factory()`` is called once per shard on the shard's worker."""

    index: int
    name: str
    factory: Callable[[], Any]
    shards: int
    placement: tuple[int, ...] | None = None  # worker index per shard; None = round robin
    notify: bool = True  # False: on_complete is never called, the shard never waits for it


@dataclass(frozen=True)
class Combiner:
    """How a combining KEYED edge folds the values emitted under one key before they leave.

    ``add(acc, value)`` folds a value into an accumulator; ``create(value)`` makes the first
    accumulator of a key (default: the value itself); ``merge(acc, acc)`` joins two
    accumulators of one key (default: ``add``, right when accumulators and values are alike,
    as for ``operator.add`` or ``max``). The receiver gets ``(key, accumulator)`` pairs and
    merges them itself (``Combiner.merge`` is there for it to call).

    >>> mean = Combiner(add=lambda a, v: (a[0] + v, a[1] + 1), create=lambda v: (v, 1),
    ...                 merge=lambda a, b: (a[0] + b[0], a[1] + b[1]))
    """

    add: Callable[[Any, Any], Any]
    create: Callable[[Any], Any] | None = None
    merge: Callable[[Any, Any], Any] | None = None

    def __post_init__(self):
        for name in ("add", "create", "merge"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise GraphError(f"Combiner {name}= must be callable, got {fn!r}")
        if self.merge is None:
            object.__setattr__(self, "merge", self.add)


@dataclass(frozen=True)
class Edge:
    """Output ``src_port`` of node ``src`` to input ``dst_port`` of node ``dst``."""

    src: int
    dst: int
    routing: Routing
    src_port: int = 0
    dst_port: int = 0
    combine: Combiner | None = None  # KEYED only: fold values per key before they leave


@dataclass
class Graph:
    """A dataflow graph under construction. Install it on a cluster to run it.

    >>> g = Graph("demo")
    >>> a = g.node("a", MyOp, shards=4)
    >>> b = g.node("b", MyOp, shards=4)
    >>> g.edge(a, b, ONE_TO_ONE)
    """

    name: str = "graph"
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    def node(self, name, factory, shards=1, placement=None, notify=None) -> Node:
        """Add a sharded operator; ``placement`` optionally gives the worker of each shard.

        ``notify=False`` says the operator needs no "complete for t" notifications: its
        capability is dropped as soon as ``on_start`` returns (or a held capability is
        released), and no worker needs progress updates on its behalf, so completion news
        skips it (a chain of such nodes costs no progress hops). By default (None) an
        ``Operator`` class that does not override ``on_complete`` is not notified, as in Naiad,
        where operators ask for notifications; any other factory is.
        """
        if not callable(factory):
            raise GraphError(f"node {name!r}: operator factory {factory!r} is not callable")
        if not isinstance(shards, int) or shards < 1:
            raise GraphError(f"node {name!r}: shards must be a positive int, got {shards!r}")
        if any(n.name == name for n in self.nodes):
            raise GraphError(f"node name {name!r} is already used in graph {self.name!r}")
        if placement is not None:
            placement = tuple(int(w) for w in placement)
            if len(placement) != shards or min(placement) < 0:
                raise GraphError(
                    f"node {name!r}: placement needs {shards} non-negative worker indices,"
                    f" got {placement!r}"
                )
        if notify is None:
            notify = wants_notifications(factory)
        node = Node(len(self.nodes), name, factory, shards, placement, bool(notify))
        self.nodes.append(node)
        return node

    def input(self, name, shards=1, placement=None) -> Node:
        """Add an input node: in a stream (``installed.stream()``) each of its shards emits
        what the driver sends it (``stream.send``) into the open epoch, on port 0; in a
        plain run it emits nothing."""
        from .streams import StreamInput  # streams needs operator only; no cycle at run time
        return self.node(name, StreamInput, shards, placement, notify=False)

    def edge(self, src: Node, dst: Node, routing=ONE_TO_ONE, src_port=0, dst_port=0,
             combine=None) -> Edge:
        """Connect output ``src_port`` of ``src`` to input ``dst_port`` of ``dst``.

        ``combine`` (KEYED edges only): a function ``f(acc, value)`` such as ``operator.add``,
        or a ``Combiner``; the sender then folds what it emits under each key (``key=`` or
        ``keys=``) into one accumulator per turn and ``dst`` receives ``(key, accumulator)``
        pairs instead of the values, each key's hash computed once per turn."""
        for n in (src, dst):
            if not isinstance(n, Node) or n.index >= len(self.nodes) or self.nodes[n.index] != n:
                raise GraphError(f"edge endpoint {n!r} is not a node of graph {self.name!r}")
        routing = Routing(routing)
        if routing is ONE_TO_ONE and src.shards != dst.shards:
            raise GraphError(
                f"one-to-one edge {src.name!r} -> {dst.name!r} joins {src.shards} shards"
                f" to {dst.shards}; use BROADCAST or KEYED"
            )
        if src.index == dst.index:
            raise GraphError(f"edge {src.name!r} -> itself would make a cycle")
        if combine is not None:
            if routing is not KEYED:
                raise GraphError(f"edge {src.name!r} -> {dst.name!r}: combine= needs a KEYED"
                                 f" edge (values are folded per key), not {routing.name}")
            if not isinstance(combine, Combiner):
                if not callable(combine):
                    raise GraphError(f"edge {src.name!r} -> {dst.name!r}: combine= must be a"
                                     f" function f(acc, value) or a Combiner, got {combine!r}")
                combine = Combiner(add=combine)
        edge = Edge(src.index, dst.index, routing, int(src_port), int(dst_port), combine)
        self.edges.append(edge)
        if self._has_cycle():
            self.edges.pop()
            raise GraphError(f"edge {src.name!r} -> {dst.name!r} would make a cycle")
        return edge

    def _has_cycle(self) -> bool:
        return topological_order(len(self.nodes), self.edges) is None

    def placement(self, num_workers: int) -> list[tuple[int, ...]]:
        """Worker index of every shard of every node (round robin where not given)."""
        if num_workers < 1:
            raise GraphError("cannot place a graph on a cluster with no workers")
        out = []
        for n in self.nodes:
            if n.placement is None:
                out.append(tuple(s % num_workers for s in range(n.shards)))
            elif max(n.placement) >= num_workers:
                raise GraphError(
                    f"node {n.name!r} is placed on worker {max(n.placement)} but the cluster"
                    f" has {num_workers} workers"
                )
            else:
                out.append(n.placement)
        return out


def wants_notifications(factory) -> bool:
    """False only for an ``Operator`` subclass that keeps the no-op ``on_complete``."""
    return not (isinstance(factory, type) and issubclass(factory, Operator)
                and factory.on_complete is Operator.on_complete)


def topological_order(num_nodes: int, edges) -> list[int] | None:
    """Nodes in an order where every edge goes forward, or None if there is a cycle."""
    indeg = [0] * num_nodes
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for e in edges:
        indeg[e.dst] += 1
        succ[e.src].append(e.dst)
    ready = [n for n in range(num_nodes) if indeg[n] == 0]
    order = []
    while ready:
        n = ready.pop()
        order.append(n)
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return order if len(order) == num_nodes else None


@dataclass(frozen=True)
class Topology:
    """What progress tracking needs to know of a graph: shard counts and reachability.

    ``any_path[n][m]``: some path n -> m crosses a BROADCAST or KEYED edge, so any shard of n
    can reach any shard of m. ``aligned_path[n][m]``: a path of ONE_TO_ONE edges only joins n to
    m, so shard s of n reaches shard s of m.
    """

    shards: tuple[int, ...]
    any_path: tuple[tuple[bool, ...], ...]
    aligned_path: tuple[tuple[bool, ...], ...]
    order: tuple[int, ...] = ()  # position of each node in a topological order

    @classmethod
    def of(cls, shards, edges) -> Topology:
        n = len(shards)
        order = topological_order(n, edges)
        if order is None:
            raise GraphError("graph has a cycle")
        anyp = [[False] * n for _ in range(n)]
        aligned = [[False] * n for _ in range(n)]
        out: list[list[Edge]] = [[] for _ in range(n)]
        for e in edges:
            out[e.src].append(e)
        for src in reversed(order):  # successors are final before their predecessors
            for e in out[src]:
                d = e.dst
                if e.routing is ONE_TO_ONE:
                    aligned[src][d] = True
                else:
                    anyp[src][d] = True
                for m in range(n):
                    if anyp[d][m] or (e.routing is not ONE_TO_ONE and aligned[d][m]):
                        anyp[src][m] = True
                    if e.routing is ONE_TO_ONE and aligned[d][m]:
                        aligned[src][m] = True
        position = [0] * n
        for i, node in enumerate(order):
            position[node] = i
        return cls(tuple(shards), tuple(map(tuple, anyp)), tuple(map(tuple, aligned)),
                   tuple(position))

    def upstream(self, node: int) -> list[tuple[int, bool]]:
        """Nodes that can reach ``node``: (upstream node, reaches every shard)."""
        return [
            (n, self.any_path[n][node])
            for n in range(len(self.shards))
            if self.any_path[n][node] or self.aligned_path[n][node]
        ]
