"""A worker's outgoing tuples for one turn: one bucket per destination (graph, node, shard,
port, t), whatever the number of emits.

An emit appends to a bucket; a batch (a list, or a numpy array whose rows are the tuples)
extends one. Each operator shard's routes are cached per (t, port) for the turn, so a per-tuple
emit is a dict lookup and an append. On a combining KEYED edge an emit folds the value into its
key's accumulator for the turn instead (``KeyedRoute.pending``); the accumulators go to their
shards' buckets, each key hashed once, when the turn's changes are committed or local tuples
delivered (``flush_combined``), so what is counted is the pairs that leave. Progress counts a
bucket's tuples once, when the turn's changes are committed (``count``), never per tuple. At
the end of the turn the worker delivers the local buckets and sends the others, one DATA
message per peer (``messages``). No I/O.
"""

from __future__ import annotations

import operator

import numpy as np

from .graph import KEYED, ONE_TO_ONE
from .keys import stable_hash, stable_shards
from .progress import INPUT

MAX_TUPLES_PER_MESSAGE = 8192  # a message carries at most this many values of a list ...
MAX_ARRAY_BYTES_PER_MESSAGE = 1 << 22  # ... or about this many bytes of numpy rows


class Bucket:
    """Tuples for one (graph, node, shard, port, t): single values, numpy row arrays and
    (on a combining edge) accumulators by key, which leave as ``(key, accumulator)`` pairs."""

    __slots__ = ("key", "pointstamp", "graph", "worker", "values", "arrays", "rows", "counted",
                 "combined")

    def __init__(self, graph, dst, shard, port, t, worker):
        self.key = (graph.gid, dst, shard, port, t)
        self.pointstamp = (INPUT, dst, shard, t)
        self.graph, self.worker = graph, worker
        self.values: list = []
        self.arrays: list = []
        self.rows = 0  # rows in arrays
        self.counted = 0  # tuples already in the staged progress changes
        self.combined: dict = {}  # key -> accumulator (combining edges only)

    def add(self, values) -> None:
        if isinstance(values, np.ndarray):
            if len(values):
                self.arrays.append(values)
                self.rows += len(values)
        else:
            self.values.extend(values)

    def __bool__(self) -> bool:
        return bool(self.values) or bool(self.rows) or bool(self.combined)


class KeyedRoute:
    """One KEYED edge of a route: the edge, its destination's shard count and name, and the
    destination's buckets by shard, made as keys pick them. On a combining edge, ``pending``
    holds this turn's accumulators by key until they are flushed to the buckets, and ``add``
    and ``create`` are its combiner's (``pending`` is None on other edges)."""

    __slots__ = ("edge", "shards", "buckets", "name", "pending", "add", "create", "ctx", "t",
                 "plus")

    def __init__(self, edge, shards: int, name: str, ctx=None, t=None):
        self.edge, self.shards, self.name = edge, shards, name
        self.buckets: list[Bucket | None] = [None] * shards
        combine = edge.combine
        self.pending: dict | None = None if combine is None else {}
        self.add = self.create = None
        if combine is not None:
            self.add, self.create = combine.add, combine.create
        # operator.add with no create: fold with "+" inline (a new object, as add makes)
        self.plus = self.add is operator.add and self.create is None
        self.ctx, self.t = ctx, t  # whose emits, at which run (to flush them)

    def fold(self, key, value) -> None:
        """Fold one value emitted under ``key`` into its accumulator."""
        pending = self.pending
        if key in pending:
            pending[key] = self.add(pending[key], value)
        else:
            pending[key] = value if self.create is None else self.create(value)


class Route:
    """Where one shard's emits on one port go in one run: the buckets of its ONE_TO_ONE and
    BROADCAST edges, and its KEYED edges; ``fold`` is the KEYED route when that is all there
    is and it combines (``Context.emit`` then only folds)."""

    __slots__ = ("plain", "keyed", "t", "fold")

    def __init__(self, t=None):
        self.plain: list[Bucket] = []
        self.keyed: list[KeyedRoute] = []
        self.t = t
        self.fold: KeyedRoute | None = None


class Outbox:
    """This turn's buckets of one worker (``me``, set once the worker has its id)."""

    def __init__(self):
        self.me: int | None = None
        self.buckets: dict[tuple, Bucket] = {}
        self.local: list[Bucket] = []  # the buckets of shards on this worker
        self._cached: list = []  # contexts whose routes are cached for this turn
        self._combining: list[KeyedRoute] = []  # this turn's routes of combining edges

    def bucket(self, g, dst, shard, port, t) -> Bucket:
        b = self.buckets.get((g.gid, dst, shard, port, t))
        if b is None:
            worker = g.placement[dst][shard]
            b = Bucket(g, dst, shard, port, t, worker)
            self.buckets[b.key] = b
            if worker == self.me:
                self.local.append(b)
        return b

    def open(self, ctx, t, port) -> Route:
        """Where emits from ``ctx``'s shard at t on ``port`` go, cached for this turn."""
        g, route = ctx.local_graph, Route(t)
        for e in g.routes.get((ctx.node_index, port), ()):
            node = g.graph.nodes[e.dst]
            if e.routing is KEYED:
                keyed = KeyedRoute(e, node.shards, node.name, ctx, t)
                route.keyed.append(keyed)
                if keyed.pending is not None:
                    self._combining.append(keyed)
                continue
            shards = (ctx.shard,) if e.routing is ONE_TO_ONE else range(node.shards)
            route.plain.extend(self.bucket(g, e.dst, s, e.dst_port, t) for s in shards)
        if len(route.keyed) == 1 and not route.plain and route.keyed[0].pending is not None:
            route.fold = route.keyed[0]
        if not ctx.turn_routes:
            self._cached.append(ctx)
        ctx.turn_routes[(t, port)] = route
        if port == 0:
            ctx.last_route = route
        return route

    def keyed_bucket(self, ctx, t, keyed: KeyedRoute, s) -> Bucket:
        """The bucket of shard ``s`` of a KEYED edge of ``ctx``'s route at t (made once)."""
        e, buckets = keyed.edge, keyed.buckets
        b = buckets[s]
        if b is None:
            b = buckets[s] = self.bucket(ctx.local_graph, e.dst, s, e.dst_port, t)
        return b

    def emit_keyed(self, ctx, route, value, shard, key) -> None:
        """One tuple onto the KEYED edges of ``route``: to its key's shard, or to ``shard``."""
        h = None if key is None else stable_hash(key)
        for keyed in route.keyed:
            if keyed.pending is not None:
                if key is None:
                    raise ValueError(f"emit on the combining KEYED edge to {keyed.name!r}"
                                     " needs key= (values are folded per key)")
                keyed.fold(key, value)
                continue
            n = keyed.shards
            s = h % n if h is not None else checked_shard(shard, n, keyed.name)
            self.keyed_bucket(ctx, ctx.t, keyed, s).values.append(value)

    def emit(self, ctx, t, port, values, shard=None, key=None, shards=None, keys=None) -> None:
        """Emit ``values`` (a sequence or a numpy array of rows) from ``ctx``'s shard at t."""
        if isinstance(values, np.generic) or (isinstance(values, np.ndarray)
                                              and values.ndim == 0):
            raise ValueError("emit_batch needs a sequence or an array of rows, got a 0-d array"
                             f" (a numpy scalar: {type(values).__name__})")
        if not isinstance(values, (list, tuple, np.ndarray)):
            values = list(values)
        route = ctx.turn_routes.get((t, port)) or self.open(ctx, t, port)
        for b in route.plain:
            b.add(values)
        for keyed in route.keyed:
            n, name = keyed.shards, keyed.name
            if keyed.pending is not None:
                fold_batch(keyed, values, key, keys)
            elif key is not None or shard is not None:
                s = stable_hash(key) % n if key is not None else checked_shard(shard, n, name)
                self.keyed_bucket(ctx, t, keyed, s).add(values)
            elif shards is not None or keys is not None:
                for s, part in split(values, shards, keys, n, name):
                    self.keyed_bucket(ctx, t, keyed, s).add(part)
            else:
                raise ValueError(f"emit on a KEYED edge to {name!r} needs key= (or shard=); a"
                                 " batch also takes keys= or shards=")

    def flush_combined(self) -> None:
        """Move the accumulators of this turn's combining routes into their shards' buckets,
        hashing each key once; a key that has no stable hash, or a ``merge`` that raises,
        fails its run (reported as an error of the emitting shard)."""
        for keyed in self._combining:
            pending = keyed.pending
            if not pending:
                continue
            keyed.pending = {}
            ctx, t = keyed.ctx, keyed.t
            try:
                n = keyed.shards
                dests = stable_shards(list(pending), n).tolist() if n > 1 \
                    else [0] * len(pending)
                merge, buckets = keyed.edge.combine.merge, keyed.buckets
                for (key, acc), s in zip(pending.items(), dests):
                    b = buckets[s]
                    if b is None:
                        b = self.keyed_bucket(ctx, t, keyed, s)
                    combined = b.combined
                    combined[key] = merge(combined[key], acc) if key in combined else acc
            except Exception as exc:
                ctx.fail(exc, t)

    def count(self) -> None:
        """Stage every bucket's uncounted tuples in its graph's progress changes."""
        self.flush_combined()
        for b in self.buckets.values():
            self._count(b)

    @staticmethod
    def _count(b: Bucket) -> None:
        n = len(b.values) + b.rows + len(b.combined) - b.counted
        if n:
            b.graph.staged.add(b.pointstamp, n)
            b.counted += n

    def take(self, b: Bucket) -> list:
        """Empty ``b``: its chunks (a list of values, then arrays), all counted."""
        self._count(b)
        chunks = [b.values] if b.values else []
        chunks.extend(b.arrays)
        if b.combined:
            chunks.append(list(b.combined.items()))
            b.combined = {}
        b.values, b.arrays, b.rows, b.counted = [], [], 0, 0
        return chunks

    def messages(self) -> dict[int, list]:
        """Empty the remote buckets: per peer, DATA payloads ``[(key, values), ...]`` with
        their tuple counts, each about a message's worth."""
        per_peer: dict[int, list] = {}
        for b in self.buckets.values():
            if b.worker != self.me and b:
                per_peer.setdefault(b.worker, []).append(b)
        out: dict[int, list] = {}
        for peer, buckets in per_peer.items():
            msgs, msg, count, load = [], [], 0, 0.0
            for b in buckets:
                for chunk in self.take(b):
                    step = _rows_per_message(chunk)
                    for i in range(0, len(chunk), step):
                        part = chunk[i:i + step] if len(chunk) > step else chunk  # no copy
                        msg.append((b.key, part))
                        count += len(part)
                        load += len(part) / step
                        if load >= 1.0:
                            msgs.append((msg, count))
                            msg, count, load = [], 0, 0.0
            if msg:
                msgs.append((msg, count))
            out[peer] = msgs
        return out

    def end_turn(self) -> None:
        """Forget this turn's routes and buckets; local tuples not yet delivered stay."""
        for ctx in self._cached:
            ctx.turn_routes.clear()
            ctx.last_route = None
        self._cached.clear()
        self._combining.clear()
        self.buckets = {b.key: b for b in self.local if b}
        self.local = list(self.buckets.values())


def checked_shard(shard, n: int, name: str) -> int:
    if shard is None or isinstance(shard, bool) or not isinstance(shard, (int, np.integer)) \
            or not 0 <= shard < n:
        raise ValueError(f"emit on a KEYED edge to {name!r} needs key=, or shard= in [0, {n}),"
                         f" got shard={shard!r}")
    return int(shard)


def _rows_per_message(chunk) -> int:
    if isinstance(chunk, np.ndarray):
        return max(1, MAX_ARRAY_BYTES_PER_MESSAGE // max(1, chunk[:1].nbytes))
    return MAX_TUPLES_PER_MESSAGE


def split(values, shards, keys, n: int, name: str):
    """(shard, part) for each destination of a batch whose values are routed one by one."""
    what = "keys" if keys is not None else "shards"
    dests = stable_shards(keys, n) if keys is not None else np.asarray(shards)
    if len(dests) != len(values):
        raise ValueError(f"emit_batch to {name!r}: {len(values)} values but {len(dests)} {what}")
    if not len(dests):
        return
    if keys is None and (dests.dtype.kind not in "iu" or dests.ndim != 1
                         or dests.min() < 0 or dests.max() >= n):
        raise ValueError(f"emit_batch to {name!r} needs shards= of ints in [0, {n}), got"
                         f" {dests!r:.80}")
    if isinstance(values, np.ndarray):
        order = np.argsort(dests, kind="stable")
        bounds = np.searchsorted(dests[order], np.arange(n + 1))
        rows = values[order]
        for s in range(n):
            if bounds[s + 1] > bounds[s]:
                yield s, rows[bounds[s]:bounds[s + 1]]
        return
    parts: list[list] = [[] for _ in range(n)]
    appends = [p.append for p in parts]
    for v, s in zip(values, dests.tolist()):
        appends[s](v)
    for s, part in enumerate(parts):
        if part:
            yield s, part


def fold_batch(keyed: KeyedRoute, values, key, keys) -> None:
    """Fold a batch into a combining route: every value under ``key``, or each under its own
    of ``keys``."""
    if key is None and keys is None:
        raise ValueError(f"emit_batch on the combining KEYED edge to {keyed.name!r} needs key="
                         " or keys= (values are folded per key)")
    if isinstance(values, np.ndarray):
        values = list(values)
    if key is not None:
        for v in values:
            keyed.fold(key, v)
        return
    if isinstance(keys, np.ndarray):
        keys = keys.tolist()
    if len(keys) != len(values):
        raise ValueError(f"emit_batch to {keyed.name!r}: {len(values)} values but"
                         f" {len(keys)} keys")
    fold = keyed.fold
    for k, v in zip(keys, values):
        fold(k, v)
