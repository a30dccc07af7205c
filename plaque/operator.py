"""What a user writes: an operator class, instantiated once per shard, and its context."""

from __future__ import annotations

from .keys import stable_hash


class Operator:
    """Base class of operators. Override what you need; every method is optional.

    ``on_start(ctx, t)`` is called when run t starts on this shard's worker, before any input;
    ``on_batch(ctx, t, port, values)`` for each batch of tuples that reaches this shard (a list,
    or a numpy array when the sender emitted one); by default it calls
    ``on_input(ctx, t, port, value)`` once per tuple, the simple form;
    ``on_complete(ctx, t)`` once no tuple with timestamp <= t can reach it any more (also when
    it received nothing). A source is a node without inputs: it gets ``on_complete`` as soon as
    run t starts and emits from there, usually from ``ctx.arg``.

    ``on_start_shards(shards, t)``, if an operator class has it, is called instead of
    ``on_start`` when run t starts, once for all of a node's shards on this worker: ``shards``
    is ``[(operator, ctx), ...]`` in shard order, and it is called on the first one's
    operator. A worker that runs several shards of a node can then do their shared start
    work once (a host launching one gang on all of its devices). Returning False declines:
    each shard then gets its ``on_start``.

    Runs overlap: keep what belongs to one run in ``ctx.state`` (a dict for run t, dropped once
    this shard completed t), not in attributes of the operator.

    >>> class Double(Operator):
    ...     def on_input(self, ctx, t, port, value):
    ...         ctx.emit(2 * value)
    >>> class Sum(Operator):
    ...     def on_batch(self, ctx, t, port, values):
    ...         ctx.state["sum"] = ctx.state.get("sum", 0) + sum(values)
    ...     def on_complete(self, ctx, t):
    ...         ctx.output(ctx.state.get("sum", 0))
    """

    def on_start(self, ctx: Context, t) -> None:
        pass

    def on_batch(self, ctx: Context, t, port: int, values) -> None:
        on_input = self.on_input
        for value in values:
            on_input(ctx, t, port, value)

    def on_input(self, ctx: Context, t, port: int, value) -> None:
        pass

    def on_complete(self, ctx: Context, t) -> None:
        pass


class Context:
    """Handed to every operator call; says which shard and run this is and lets it emit.

    Attributes: ``node`` (name), ``shard``, ``num_shards``, ``worker`` (id), ``t`` (the run),
    ``arg`` (the argument given to run t), ``services`` (whatever the worker process was
    started with), ``state`` (this shard's dict for run t).

    For the engine (not for operators): ``local_graph`` (the worker's ``LocalGraph``),
    ``node_index``, ``turn_routes`` (where emits go this turn, by (t, port): ``outbox.Route``) and
    ``run_states`` (t -> state dict).

    Routing on KEYED edges: ``key=k`` sends to shard ``plaque.stable_shard(k, n)`` of the
    receiver's n shards, the same in every process (never ``hash()``, which differs between
    processes); ``shard=i`` names the shard. Other edges ignore both. On a combining KEYED edge
    (``Graph.edge(..., combine=f)``) ``key=`` is required and values are folded per key: the
    receiver gets ``(key, accumulator)`` pairs.
    """

    __slots__ = ("node", "shard", "num_shards", "worker", "arg", "services", "t", "_core",
                 "local_graph", "node_index", "_notify", "turn_routes", "run_states",
                 "last_route")

    def __init__(self, node, shard, num_shards, worker, core, graph, index, notify=True,
                 services=None):
        self.node, self.shard, self.num_shards, self.worker = node, shard, num_shards, worker
        self._core, self.local_graph, self.node_index, self._notify = core, graph, index, notify
        self.services = services if services is not None else {}
        self.arg = None
        self.t = None
        self.turn_routes: dict = {}  # (t, port) -> where emits go (outbox.Route), this turn only
        self.last_route = None  # the last route of port 0 opened this turn (any t)
        self.run_states: dict = {}  # t -> state dict

    def emit(self, value, port: int = 0, shard: int | None = None, key=None) -> None:
        """Send ``value`` on output ``port``."""
        route = self.last_route
        if route is None or port or route.t != self.t:
            route = self.turn_routes.get((self.t, port))
            if route is None:
                route = self._core.outbox.open(self, self.t, port)
        fold = route.fold
        if fold is not None and key is not None:  # only a combining KEYED edge: fold
            pending = fold.pending
            if key not in pending:
                pending[key] = value if fold.create is None else fold.create(value)
            elif fold.plus:
                pending[key] = pending[key] + value
            else:
                pending[key] = fold.add(pending[key], value)
            return
        for bucket in route.plain:
            bucket.values.append(value)
        keyed = route.keyed
        if keyed:
            if key is not None and len(keyed) == 1:  # the usual keyed emit, without calls
                edge = keyed[0]
                if edge.pending is not None:  # a combining edge (beside plain ones): fold
                    edge.fold(key, value)
                    return
                s = stable_hash(key) % edge.shards
                bucket = edge.buckets[s]
                if bucket is None:
                    bucket = self._core.outbox.keyed_bucket(self, self.t, edge, s)
                bucket.values.append(value)
            else:
                self._core.outbox.emit_keyed(self, route, value, shard, key)

    def emit_batch(self, values, port: int = 0, shard: int | None = None, key=None,
                   shards=None, keys=None) -> None:
        """Send every value of ``values`` (a sequence, or a numpy array whose rows are the
        tuples, sent without copies) on output ``port``; on KEYED edges ``shard=``/``key=``
        send all of them to one shard, ``shards=``/``keys=`` (one per value) each to its own.
        Progress is counted once per destination shard, not per value."""
        self._core.outbox.emit(self, self.t, port, values, shard, key, shards, keys)

    def output(self, value) -> None:
        """Hand ``value`` to the driver: it appears in the run's result under this node/shard."""
        self._core.add_output(self.local_graph, self.node_index, self.shard, self.t, value)

    def fail(self, exc: BaseException, t=None) -> None:
        """Fail run ``t`` (default: the current one) with ``exc``, as if a handler of this
        shard had raised it."""
        self._core.report(self.local_graph, self.node_index, self.shard,
                           self.t if t is None else t, exc)

    def hold(self) -> Capability:
        """Keep this shard's capability for the current run after the handler returns.

        Downstream shards are not told "complete" until it is released, so the shard can
        finish its work later (on another thread) and still emit. See ``Capability``.
        """
        return self._core.hold_capability(self.local_graph, self.node_index, self.shard, self.t)

    @property
    def part(self):
        """This shard's part of the current run's partitioned input
        (``run(arg, parts={node: [part of shard 0, ...]})``): only the worker hosting the
        shard receives it. None when the run gave this node no parts."""
        parts = self.local_graph.parts.get(self.t)
        return None if parts is None else parts.get((self.node_index, self.shard))

    @property
    def stream(self) -> int | None:
        """The stream the current run is an epoch of (``installed.stream()``), or None."""
        return self.local_graph.stream_of.get(self.t)

    @property
    def keyed_state(self) -> dict:
        """This shard's state across the epochs of its stream: a dict, empty at first, kept
        until the stream closes and its last epoch is over here (a plain run is a stream of
        one epoch: its ``keyed_state`` is its ``state``). Keys of a KEYED edge always reach
        the same shard, so what a shard keeps here by key is that key's state.

        Input of a later epoch may arrive before an earlier epoch completes, while
        ``on_complete`` comes in epoch order: gather an epoch's input in ``ctx.state`` and
        fold it into ``keyed_state`` in ``on_complete``, so each epoch sees exactly the
        epochs before it."""
        g = self.local_graph
        stream = g.stream_of.get(self.t)
        if stream is None:
            return self.state
        key = (stream, self.node_index, self.shard)
        state = g.stream_states.get(key)
        if state is None:
            state = g.stream_states[key] = {}
        return state

    @property
    def state(self) -> dict:
        """This shard's state for the current run: a dict, empty at first, dropped when the
        shard has completed the run (after ``on_complete`` and any held capability). A node
        that is never notified (``notify=False``, or no ``on_complete``) never learns that a
        run is over: its state is kept as long as the run's argument, until its worker retires
        the run (``LocalGraph.RETIRED_KEPT`` runs later)."""
        state = self.run_states.get(self.t)
        if state is None:
            state = self.run_states[self.t] = {}
            if not self._notify:
                self.local_graph.unnotified_states.setdefault(self.t, []).append(self)
        return state


class Capability:
    """The right to emit at timestamp ``t`` from one shard, held until ``release()``.

    ``emit``, ``emit_batch``, ``output`` and ``release`` must be called on the worker's event
    loop; from any other thread use ``post(fn)``, which runs ``fn(capability)`` there. An
    exception in ``fn`` fails the run like an exception in a handler, and releases the
    capability. ``ctx`` is the context of the shard it belongs to.
    """

    __slots__ = ("t", "_core", "ctx", "released")

    def __init__(self, core, ctx, t):
        self._core, self.ctx, self.t = core, ctx, t
        self.released = False

    def emit(self, value, port: int = 0, shard: int | None = None, key=None) -> None:
        self.emit_batch((value,), port, shard, key)

    def emit_batch(self, values, port: int = 0, shard: int | None = None, key=None,
                   shards=None, keys=None) -> None:
        self._check()
        self._core.outbox.emit(self.ctx, self.t, port, values, shard, key, shards, keys)

    def output(self, value) -> None:
        self._check()
        ctx = self.ctx
        self._core.add_output(ctx.local_graph, ctx.node_index, ctx.shard, self.t, value)

    def release(self) -> None:
        self._check()
        self.released = True
        ctx = self.ctx
        self._core.release_capability(ctx.local_graph, ctx.node_index, ctx.shard, self.t)

    @property
    def valid(self) -> bool:
        """Not released, and its graph still installed (on the worker's event loop)."""
        graph = self.ctx.local_graph
        return not self.released and self._core.graphs.get(graph.gid) is graph

    def post(self, fn) -> None:
        """Thread-safe: run ``fn(self)`` on the worker's event loop."""
        self._core.post(self, fn)

    def _check(self):
        if self.released:
            raise RuntimeError(f"capability for t={self.t} was already released")
