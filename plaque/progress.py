"""Progress tracking: pointstamp counts and the "complete for t" test. No I/O.

Each worker (and the coordinator) keeps a full copy of the pointstamp counts of every installed
graph, as in Naiad. A pointstamp is a location and a timestamp; there are two kinds of location
per operator shard:

- ``INPUT`` (node, shard): tuples on their way to that shard and not yet consumed;
- ``CAP``   (node, shard): the shard's capability to emit at t, held from the start of run t
  until the shard has handled "complete for t".

A run t starts by adding one ``CAP`` at every shard of every node. Every change made by one
worker is applied, in one atomic batch, to every copy; a batch always adds the new pointstamps
it causes (tuples sent) no later than it removes their cause (tuple consumed, capability
dropped). So every copy's positive counts over-approximate what can still happen, and a shard
is complete for t when no positive pointstamp at t' <= t sits at its own INPUT or at a location
that can reach it. Reachability is per node, refined per shard along ONE_TO_ONE paths, so a
shard that nobody sent anything still learns its input is complete.

Worked example: A(2 shards) -KEYED-> B(2 shards). Run 1 adds CAP(A,0) CAP(A,1) CAP(B,0) CAP(B,1).
A0 emits one tuple to B1 and drops its capability: {+INPUT(B,1), -CAP(A,0)}. B0 waits for CAP(A,1)
to go; when A1 drops it having sent nothing, B0 is complete although it received nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from .graph import Topology

INPUT = 0
CAP = 1
SINK = -1  # node index of the driver's output sink: reachable from everything, upstream of nothing

Key = tuple[int, int, int, object]  # (kind, node, shard, timestamp)


class ChangeBatch:
    """Accumulated pointstamp deltas; cancelling deltas vanish (compaction)."""

    __slots__ = ("_deltas",)

    def __init__(self):
        self._deltas: dict[Key, int] = {}

    def add(self, key: Key, delta: int) -> None:
        v = self._deltas.get(key, 0) + delta
        if v:
            self._deltas[key] = v
        else:
            self._deltas.pop(key, None)

    def __bool__(self) -> bool:
        return bool(self._deltas)

    def __len__(self) -> int:
        return len(self._deltas)

    def drain(self) -> list[tuple[Key, int]]:
        """Return the nonzero deltas and empty the batch."""
        items = list(self._deltas.items())
        self._deltas.clear()
        return items


class ProgressTracker:
    """One copy of a graph's pointstamp counts, with the completion test."""

    def __init__(self, topology: Topology, track_drops: bool = False):
        self.topology = topology
        # witnesses (see ``blocker``) that stopped holding since the owner last looked
        self.dropped: set | None = set() if track_drops else None
        # nearest upstream node first (reverse topological order): see ``blocker``
        self._upstream = [sorted(topology.upstream(n), key=lambda u: -topology.order[u[0]])
                          for n in range(len(topology.shards))]
        self._counts: dict[Key, int] = {}
        # t -> node -> shard -> number of positive keys there (INPUT and/or CAP)
        self._positive: dict[object, dict[int, dict[int, int]]] = {}
        self._nonzero: dict[object, int] = defaultdict(int)

    def start_changes(self, t) -> list[tuple[Key, int]]:
        """The deltas that begin run t: a capability at every shard of every node."""
        return [
            ((CAP, node, shard, t), 1)
            for node, n in enumerate(self.topology.shards)
            for shard in range(n)
        ]

    def update(self, changes: Iterable[tuple[Key, int]]) -> None:
        for key, delta in changes:
            if not delta:
                continue
            old = self._counts.get(key, 0)
            new = old + delta
            if new:
                self._counts[key] = new
            else:
                del self._counts[key]
            t = key[3]
            if old == 0:
                self._nonzero[t] += 1
            if new == 0:
                self._nonzero[t] -= 1
                if not self._nonzero[t]:
                    del self._nonzero[t]
            if (old > 0) != (new > 0):
                self._flip(key, new > 0)

    def _flip(self, key: Key, positive: bool) -> None:
        _, node, shard, t = key
        if positive:
            shards = self._positive.setdefault(t, {}).setdefault(node, {})
            shards[shard] = shards.get(shard, 0) + 1
            return
        nodes = self._positive[t]
        shards = nodes[node]
        shards[shard] -= 1
        if self.dropped is not None and key[0] == INPUT:  # witnesses are INPUT or (None, ...)
            self.dropped.add(key)
        if not shards[shard]:
            if self.dropped is not None:
                self.dropped.add((None, node, shard, t))
            del shards[shard]
            if not shards:
                del nodes[node]
                if not nodes:
                    del self._positive[t]

    def count(self, key: Key) -> int:
        return self._counts.get(key, 0)

    def is_complete(self, node: int, shard: int, t) -> bool:
        """True when no tuple with timestamp <= t can still reach (node, shard)."""
        return self.blocker(node, shard, t) is None

    def blocker(self, node: int, shard: int, t):
        """A witness that (node, shard) is not complete for t, or None if it is.

        The witness names one positive location that can reach the shard; as long as it stays
        positive the shard stays incomplete. With ``track_drops`` the tracker adds a witness
        to ``dropped`` when it stops being positive, so a caller re-tests only the shards
        whose witness is in there.
        Upstream nodes are searched nearest first, so along a chain the witness is the
        predecessor, which is the next to finish.
        """
        upstream = self._upstream[node]
        for t2, nodes in self._positive.items():
            if not t2 <= t:
                continue
            if self._counts.get((INPUT, node, shard, t2), 0) > 0:
                return (INPUT, node, shard, t2)
            for up, every_shard in upstream:
                shards = nodes.get(up)
                if shards:
                    if every_shard:
                        return (None, up, next(iter(shards)), t2)
                    if shard in shards:
                        return (None, up, shard, t2)
        return None

    def is_done(self, t) -> bool:
        """True when nothing at all remains at timestamp t (the run has drained)."""
        return t not in self._nonzero

    def frontier(self, t) -> dict[int, int]:
        """Where run t still is: ``{node: number of its shards holding a pointstamp at t}``
        (a capability not yet dropped, or input not yet consumed). A node not in it is done
        for t: it has handled "complete for t" on every shard and nothing waits for it."""
        return {node: len(shards) for node, shards in self._positive.get(t, {}).items()
                if node != SINK}

    def pending_timestamps(self) -> list:
        return sorted(self._nonzero, key=lambda t: (str(type(t)), t))


def interested_workers(topology: Topology, placement, notify=None) -> dict:
    """For each operator shard, the workers whose completion tests can depend on it.

    A pointstamp at (node, shard) matters to the worker hosting that shard (its own input)
    and to every worker hosting a shard it can reach, counting only shards that are ever
    tested for completion (``notify[node]``; all by default). A worker keeps and receives
    only the pointstamps that matter to it: if one matters, so does every pointstamp that
    can cause it (whatever reaches a cause's effect reaches the cause's worker too), so the
    Naiad argument still holds for what it keeps, and progress traffic follows real
    dependencies (a chain of ONE_TO_ONE nodes on the same workers sends none between them).
    """
    n = len(topology.shards)
    notify = [True] * n if notify is None else list(notify)
    everywhere = [set() for _ in range(n)]  # workers reached from every shard of a node
    for src in range(n):
        for dst in range(n):
            if topology.any_path[src][dst] and notify[dst]:
                everywhere[src].update(placement[dst])
    out = {}
    for src in range(n):
        aligned = [dst for dst in range(n) if topology.aligned_path[src][dst]
                   and not topology.any_path[src][dst] and notify[dst]]
        for s in range(topology.shards[src]):
            workers = set(everywhere[src])
            if notify[src]:
                workers.add(placement[src][s])
            workers.update(placement[dst][s] for dst in aligned)
            out[(src, s)] = frozenset(workers)
    return out
