"""A graph as one worker holds it: its operator shards, routes, progress copy and per-run
bookkeeping (timestamps pending completion, held capabilities, arguments of recent runs).
Plain data owned by ``WorkerCore``; the worker's logic lives there.
"""

from __future__ import annotations

from collections import OrderedDict

from .graph import Topology
from .operator import Context
from .progress import ChangeBatch, ProgressTracker, interested_workers


class LocalGraph:
    """A graph installed on this worker: its shards here, routes and progress copy."""

    RETIRED_KEPT = 4096  # finished runs whose argument a worker keeps for late input

    def __init__(self, gid, graph, placement, worker_id, core, services):
        self.gid = gid
        self.graph = graph
        self.placement = placement
        topology = Topology.of([n.shards for n in graph.nodes], graph.edges)
        self.tracker = ProgressTracker(topology, track_drops=True)
        self.staged = ChangeBatch()  # this turn's changes, not yet in the tracker
        self.outgoing = ChangeBatch()  # applied here, to be sent to every peer
        self.for_coordinator: dict[object, ChangeBatch] = {}  # t -> changes at t
        self.finished: list = []  # timestamps this worker is done with, to report
        self.interested = interested_workers(topology, placement,
                                             [n.notify for n in graph.nodes])
        self.tracked = {loc for loc, ws in self.interested.items() if worker_id in ws}
        self.routes: dict[tuple[int, int], list] = {}
        for e in graph.edges:
            self.routes.setdefault((e.src, e.src_port), []).append(e)
        self.ops: dict[tuple[int, int], tuple[object, Context]] = {}
        for node in graph.nodes:
            for shard, w in enumerate(placement[node.index]):
                if w == worker_id:
                    ctx = Context(node.name, shard, node.shards, worker_id, core, self,
                                  node.index, node.notify, services)
                    self.ops[(node.index, shard)] = (node.factory(), ctx)
        # what START calls, by node: (node, [(shard, op, ctx)], [(op, ctx)] if its
        # operator starts its shards together (``on_start_shards``) else None)
        by_node: dict[int, list] = {}
        for (node, shard), (op, ctx) in self.ops.items():
            by_node.setdefault(node, []).append((shard, op, ctx))
        self.starts = [(node, shards, [(op, ctx) for _, op, ctx in shards]
                        if hasattr(shards[0][1], "on_start_shards") else None)
                       for node, shards in by_node.items()]
        self.pending: dict[tuple[int, int], list] = {}  # shard -> timestamps awaiting completion
        # completion tests: a shard that is not complete waits on a witness (a positive
        # pointstamp that can reach it) and is tested again only when that one goes
        self.waiting_on: dict[tuple, set] = {}  # witness -> shards
        self.unchecked: set = set()  # shards with a new timestamp to test
        self.args: dict[object, object] = {}
        self.parts: dict[object, dict] = {}  # t -> {(node, shard): its part of the input}
        self.stream_of: dict[object, int] = {}  # t -> the stream it is an epoch of
        self.stream_last: dict[int, object] = {}  # stream -> its last epoch, once closed
        self.stream_states: dict[tuple, dict] = {}  # (stream, node, shard) -> keyed state
        self.inputs: dict[tuple, object] = {}  # (node, shard, t) -> held input capability
        self.early: dict[object, list] = {}  # tuples that overtook their run's START
        self.failed: set = set()  # timestamps whose operators already raised here
        self.eager = not all(n.notify for n in graph.nodes)  # has never-notified nodes
        self.retired: OrderedDict = OrderedDict()  # finished timestamps still accepting input
        self.holds: dict[tuple, int] = {}  # (node, shard, t) -> capabilities held
        self.held_complete: set = set()  # (node, shard, t) completed but still held
        self.live: dict[object, set] = {}  # t -> local shards whose capability is not dropped
        self.unnotified_states: dict[object, list] = {}  # t -> contexts of never-notified
        # shards holding ctx.state at t, dropped when t retires

    def drop_stream(self, stream) -> None:
        """Forget a closed stream's keyed state on this worker."""
        self.stream_last.pop(stream, None)
        for key in [k for k in self.stream_states if k[0] == stream]:
            del self.stream_states[key]

    def apply(self, changes) -> None:
        """Apply progress changes to this worker's copy, only at the locations it tracks."""
        tracked = self.tracked
        self.tracker.update(ch for ch in changes if (ch[0][1], ch[0][2]) in tracked)
