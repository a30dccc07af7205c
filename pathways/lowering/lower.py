"""Lowering: a traced program plus physical placements becomes a Plaque graph.

Each equation becomes ONE sharded Plaque node whose shards are the devices of its mesh, placed
on the hosts (Plaque workers) owning those devices; an edge joins a producer to each consumer
(ONE_TO_ONE when both run on the same devices in the same order, else BROADCAST), so progress
tracking can tell a consumer shard when its producers are done (sequential dispatch) and the
run is over when every kernel has finished. The graph is installed once; each run is a
timestamp whose argument (``RunArg``) names the buffers and the gang sequence numbers.

A value consumed on other devices or with another spec than where it lives gets a transfer:
a Send node on the devices that hold it, whose shards emit, over a KEYED edge, exactly the
blocks each consumer shard needs (``resharding.plan``); the consumer assembles them into a
transfer buffer its kernel waits on. Transfers between islands are charged DCN time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

import plaque

from ..errors import ProgramError
from ..program.ir import Program
from ..program.sharding import P, distinct_parts, normalize_spec, shard_shape
from . import resharding, wire
from .specs import ROUTED_PORT, HostOp, Incoming, KernelSpec, RouteSpec, SendSpec

SMALL_RESULT = int(os.environ.get("PATHWAYS_SMALL_RESULT", 64 * 1024))  # bytes: a program
# result this small reaches its client with the run's end (RunDone), so fetching it costs no
# request to a host (0: none does)


def _nbytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


@dataclass(frozen=True)
class Placement:
    """Where a value lives: the mesh (devices, shape, axis names) and its partition spec."""

    devices: tuple[int, ...]
    spec: tuple
    shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    @property
    def mesh(self):
        return self.shape, self.axis_names

    def __str__(self):
        return f"devices {list(self.devices)} spec {self.spec}"


@dataclass
class LoweredProgram:
    """A program lowered onto physical devices: the Plaque graph to install (one node per
    kernel, transfer or routing step, whatever the number of shards), each equation's gang of
    devices and its island (what the island schedulers order), where each output is made, and
    the devices of each graph node. ``str()`` prints it one node and one edge a line."""

    graph: plaque.Graph
    gangs: list[tuple[int, ...]]  # devices of each equation, in equation order
    islands: list[int]  # island of each gang
    outputs: dict  # var id of each equation output -> (mesh, P spec) where it is made
    devices: list[tuple[int, ...]] = field(default_factory=list)  # per graph node, per shard

    def install_payload(self, bodies) -> tuple:
        """What the coordinator installs, ``(nodes, edges, blob, gangs, islands)``: the
        graph's wire form (``wire.pack``: its skeleton, and its operators and ``bodies``
        shipped as one blob, code from scripts by value) and the gangs."""
        nodes, edges, blob = wire.pack(self.graph, bodies)
        return nodes, edges, blob, self.gangs, self.islands

    def __str__(self):
        g = self.graph
        count = ", ".join(f"{len(xs)} {what}{'' if len(xs) == 1 else 's'}"
                          for xs, what in ((g.nodes, "node"), (g.edges, "edge")))
        lines = [f"lowered {g.name}: {count}; gangs on islands {self.islands}"]
        for n in g.nodes:
            per_host: dict[int, list[int]] = {}
            for shard, host in enumerate(n.placement or ()):
                per_host.setdefault(host, []).append(shard)
            devices = list(self.devices[n.index]) if self.devices else "?"
            kind = getattr(n.factory, "kind", type(n.factory).__name__)
            wait = "  waits for completion" if n.notify else ""
            lines.append(f"  {n.name}  {kind}  devices {devices}  shards per host"
                         f" {per_host}{wait}")
        for e in g.edges:
            ports = f"  port {e.src_port} -> {e.dst_port}" if e.src_port or e.dst_port else ""
            lines.append(f"  {g.nodes[e.src].name} -> {g.nodes[e.dst].name}"
                         f"  {e.routing.value}{ports}")
        return "\n".join(lines)


def placement_of(m, spec, ndim) -> Placement:
    """Where a value of ``ndim`` dimensions with ``spec`` lives on mesh ``m``."""
    return Placement(m.ids, tuple(normalize_spec(spec, ndim, m.axis_names)), m.axis_sizes,
                     m.axis_names)


def lower(program: Program, input_placements: list[Placement], worker_of: dict[int, int],
          island_of: dict[int, int], dispatch: str = "parallel") -> LoweredProgram:
    """Place every equation; insert a transfer wherever a value is consumed elsewhere. The
    result says where each output is made (``outputs``) and what to install.

    With parallel dispatch no node waits for "complete" notifications (kernels are enqueued
    at run start, transfers leave when their buffer is ready), so hosts exchange no progress
    updates during a run; sequential dispatch is built on them.
    """
    where: dict[int, Placement] = {v.id: p for v, p in zip(program.inputs, input_placements)}
    uses: dict[int, int] = {}  # users of each value where it lives (kernels and transfers)
    transfers: dict[tuple[int, int], Placement] = {}  # (eqn, input index) -> where it must go
    made: dict[int, tuple] = {}  # output var id -> (mesh, spec)
    for e, eqn in enumerate(program.eqns):
        specs = eqn.fn.arg_specs(len(eqn.inputs))
        for i, (v, spec) in enumerate(zip(eqn.inputs, specs)):
            need = placement_of(eqn.fn.in_mesh(i), spec, len(v.aval.shape))
            if where[v.id] != need:
                transfers[(e, i)] = need
            uses[v.id] = uses.get(v.id, 0) + 1
        for k, (v, spec) in enumerate(zip(eqn.outputs, eqn.fn.out_specs)):
            where[v.id] = placement_of(eqn.fn.out_mesh(k), spec, len(v.aval.shape))
            made[v.id] = (eqn.fn.out_mesh(k), P(*where[v.id].spec))
    keep = {v.id for v in program.outputs} | {v.id for v in program.inputs}
    builder = _Builder(program, worker_of, island_of, where, uses, keep, transfers)
    builder.results = {v.id for v in program.outputs} - {v.id for v in program.inputs}
    builder.notify = dispatch == "sequential"
    return builder.build(made)


class _Builder:
    """Emits the graph of one lowering: ``build`` walks the equations in order and adds each
    one's nodes, the transfers into them and the edges from their producers."""

    def __init__(self, program, worker_of, island_of, where, uses, keep, transfers):
        self.program, self.worker_of, self.island_of = program, worker_of, island_of
        self.where, self.uses, self.keep, self.transfers = where, uses, keep, transfers
        self.graph = plaque.Graph(program.name)
        self.producer: dict[int, plaque.graph.Node] = {}  # var id -> node that makes it
        self.devices: list[tuple[int, ...]] = []  # per node: the device of each shard

    def hosts(self, devices, what):
        try:
            return [self.worker_of[d] for d in devices]
        except KeyError as exc:
            raise ProgramError(f"device {exc.args[0]} of {what} is not known to be on a live"
                               " host") from None

    def build(self, outputs: dict) -> LoweredProgram:
        for e, eqn in enumerate(self.program.eqns):
            self._kernel(e, eqn)
        g = self.graph
        gangs = [e.fn.mesh.ids for e in self.program.eqns]
        islands = [self.island_of[d[0]] for d in gangs]
        return LoweredProgram(g, gangs, islands, outputs, self.devices)

    def _node(self, name, op: HostOp, devices, what, notify) -> plaque.graph.Node:
        """A node with one shard per device of ``devices``, on the hosts owning them."""
        node = self.graph.node(name, op, len(devices), placement=self.hosts(devices, what),
                               notify=notify)
        self.devices.append(tuple(devices))
        return node

    def _kernel(self, e, eqn):
        fn = eqn.fn
        if fn.routed:
            return self._routed(e, eqn)
        incoming, releases = self._inputs(e, eqn)
        spec = KernelSpec(e, fn, tuple(v.id for v in eqn.inputs), tuple(v.id for v in eqn.outputs),
                          releases, incoming, fn.signature([v.aval for v in eqn.inputs]),
                          self._ships(eqn))
        node = self._node(f"{e}:{fn.name}", HostOp("kernel", spec), fn.mesh.ids, fn.name,
                          self.notify)
        self._connect(e, eqn, range(len(eqn.inputs)), node)
        for v in eqn.outputs:
            self.producer[v.id] = node

    def _ships(self, eqn) -> tuple:
        """For each output that is a small result of the program (a new array the client
        gets, of at most ``SMALL_RESULT`` bytes): its index and the shards whose values ride
        on the run's end, one holder of each distinct part."""
        ships = []
        for k, v in enumerate(eqn.outputs):
            if not SMALL_RESULT or v.id not in self.results or _nbytes(v.aval) > SMALL_RESULT:
                continue
            have = self.where[v.id]
            parts = distinct_parts(v.aval.shape, have.shape, have.axis_names, P(*have.spec))
            ships.append((k, tuple(part.holders[0] for part in parts)))
        return tuple(ships)

    def _inputs(self, e, eqn):
        """(inputs arriving by transfer, and for each input how many users share it where it
        lives: 0 when it is kept, None when it is moved, so its transfer buffer is freed)."""
        incoming, releases = {}, []
        for i, v in enumerate(eqn.inputs):
            if (e, i) in self.transfers:
                incoming[i] = self._incoming(e, i, v)
                releases.append(None)
            else:
                releases.append(0 if v.id in self.keep else self.uses[v.id])
        return incoming, tuple(releases)

    def _connect(self, e, eqn, inputs, node):
        """Edges into ``node`` from the producers of these inputs, or transfers."""
        for i in inputs:
            v = eqn.inputs[i]
            if (e, i) in self.transfers:
                self._send(e, i, v, node)
            elif v.id in self.producer:
                self._edge(self.producer[v.id], node)

    def _routed(self, e, eqn):
        """A routed call: route (token devices) -> experts -> gather (token devices)."""
        fn, g = eqn.fn, self.graph
        tm, em = fn.token_mesh, fn.mesh
        incoming, releases = self._inputs(e, eqn)
        links = tuple(tuple(self._link(a, b) for b in em.ids) for a in tm.ids)
        spec = RouteSpec(e, fn, tuple(v.id for v in eqn.inputs),
                         tuple(v.id for v in eqn.outputs), releases, incoming, links,
                         tuple(v.aval for v in eqn.outputs),
                         tuple(fn.split_avals([v.aval for v in eqn.inputs])[2]))
        route = self._node(f"{e}:{fn.name}:route", HostOp("route", spec), tm.ids, fn.name,
                           self.notify)
        # How many rows reach an expert is data-dependent: these two always wait for
        # progress tracking to say their input is complete (sequential for this node only).
        experts = self._node(f"{e}:{fn.name}", HostOp("expert", spec), em.ids, fn.name, True)
        gather = self._node(f"{e}:{fn.name}:gather", HostOp("gather", spec), tm.ids, fn.name,
                            True)
        g.edge(route, experts, plaque.KEYED, ROUTED_PORT, len(eqn.inputs))
        g.edge(experts, gather, plaque.KEYED, ROUTED_PORT, 0)
        split = 1 + fn.token_args
        self._connect(e, eqn, range(split), route)
        self._connect(e, eqn, range(split, len(eqn.inputs)), experts)
        for k, v in enumerate(eqn.outputs):
            self.producer[v.id] = gather if k < fn.row_outputs else experts

    def _link(self, a, b) -> str:
        return ("local" if self.worker_of[a] == self.worker_of[b] else
                "ici" if self.island_of[a] == self.island_of[b] else "dcn")

    def _edge(self, src, dst, routing=None):
        g = self.graph
        if routing is None:
            same = src.placement == dst.placement and src.shards == dst.shards
            routing = plaque.ONE_TO_ONE if same else plaque.BROADCAST
        if not any(ed.src == src.index and ed.dst == dst.index for ed in g.edges):
            g.edge(src, dst, routing)

    def _incoming(self, e, i, v) -> Incoming:
        need = self.transfers[(e, i)]
        m = self.program.eqns[e].fn.in_mesh(i)
        have = self.where[v.id]
        pieces = resharding.plan(v.aval.shape, have.mesh, have.spec, need.mesh, need.spec)
        expect = [0] * m.size
        for p in pieces:
            expect[p.dst] += 1
        shape = shard_shape(v.aval.shape, m.axis_sizes, m.axis_names, need.spec)
        return Incoming(v.id, shape, v.aval.dtype, tuple(expect))

    def _send(self, e, i, v, consumer):
        have, need = self.where[v.id], self.transfers[(e, i)]
        m = self.program.eqns[e].fn.in_mesh(i)
        per_src: list[list] = [[] for _ in have.devices]
        for p in resharding.plan(v.aval.shape, have.mesh, have.spec, need.mesh, need.spec):
            link = self._link(have.devices[p.src], m.ids[p.dst])
            per_src[p.src].append((p.dst, p.src_slices, p.dst_slices, link))
        spec = SendSpec(v.id, have.devices, tuple(map(tuple, per_src)),
                        0 if v.id in self.keep else self.uses[v.id])
        node = self._node(f"{e}:send{i}:v{v.id}", HostOp("send", spec), have.devices,
                          "a send", self.notify)
        if v.id in self.producer:
            self._edge(self.producer[v.id], node)
        self.graph.edge(node, consumer, plaque.KEYED, dst_port=i)
