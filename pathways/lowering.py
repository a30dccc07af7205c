"""Lowering: a traced program plus physical placements becomes a Plaque graph.

Each equation becomes ONE sharded Plaque node whose shards are the devices of its mesh, placed
on the hosts (Plaque workers) owning those devices; an edge joins a producer to each consumer
(ONE_TO_ONE when both run on the same devices in the same order, else BROADCAST), so progress
tracking can tell a consumer shard when its producers are done (sequential dispatch) and the
run is over when every kernel has finished. The graph is installed once; each run is a
timestamp whose argument (``RunArg``) names the buffers and the gang sequence numbers.

For now every value must stay on the mesh and spec it was produced with: a consumer with a
different placement is refused with a clear error (resharding transfers are the next step).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import plaque

from .errors import ProgramError
from .ir import Program
from .kernel import KernelOp, KernelSpec
from .sharding import normalize_spec


@dataclass(frozen=True)
class Placement:
    devices: tuple[int, ...]
    spec: tuple

    def __str__(self):
        return f"devices {list(self.devices)} spec {self.spec}"


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


def skeleton(graph: plaque.Graph) -> tuple[list, list]:
    """The graph's shape without its code: nodes (name, shards, worker ids) and edges."""
    nodes = [(n.name, n.shards, n.placement) for n in graph.nodes]
    edges = [(e.src, e.dst, e.routing.value) for e in graph.edges]
    return nodes, edges


def rebuild(nodes, edges, blob: bytes, live_workers: list[int]) -> plaque.Graph:
    """The Plaque graph from a skeleton; placement becomes indices into the live workers."""
    index = {w: i for i, w in enumerate(live_workers)}
    g = plaque.Graph()
    made = []
    for i, (name, shards, placement) in enumerate(nodes):
        try:
            where = [index[w] for w in placement]
        except KeyError as exc:
            raise ProgramError(f"host {exc.args[0]} is not live") from None
        made.append(g.node(name, LazyFactory(blob, i), shards, placement=where))
    for src, dst, routing in edges:
        g.edge(made[src], made[dst], plaque.Routing(routing))
    return g


@dataclass
class LoweredProgram:
    program: Program
    graph: plaque.Graph
    gangs: list[tuple[int, ...]]  # devices of each equation, in equation order
    hosts: list[int]  # worker ids involved
    island: int | None


def placement_of(fn, spec, ndim) -> Placement:
    m = fn.mesh
    return Placement(m.devices, tuple(normalize_spec(spec, ndim, m.axis_names)))


def lower(program: Program, input_placements: list[Placement], worker_of: dict[int, int],
          island_of: dict[int, int]) -> LoweredProgram:
    """Place every equation; check that every value is consumed where it lives."""
    where: dict[int, Placement] = {v.id: p for v, p in zip(program.inputs, input_placements)}
    last_use: dict[int, int] = {}
    for e, eqn in enumerate(program.eqns):
        specs = eqn.fn.arg_specs(len(eqn.inputs))
        for i, (v, spec) in enumerate(zip(eqn.inputs, specs)):
            need = placement_of(eqn.fn, spec, len(v.aval.shape))
            have = where[v.id]
            if have != need:
                raise ProgramError(
                    f"{eqn.fn.name}: argument {i} lives on {have} but the call needs {need};"
                    " moving data between slices or specs (resharding) is not supported yet")
            last_use[v.id] = e
        for v, spec in zip(eqn.outputs, eqn.fn.out_specs):
            where[v.id] = placement_of(eqn.fn, spec, len(v.aval.shape))
    keep = {v.id for v in program.outputs} | {v.id for v in program.inputs}
    islands = {island_of[d] for eqn in program.eqns for d in eqn.fn.mesh.devices}
    if len(islands) > 1:
        raise ProgramError(f"program {program.name} spans islands {sorted(islands)}; programs"
                           " across islands are not supported yet")
    return _build_graph(program, worker_of, last_use, keep, islands.pop() if islands else None)


def _build_graph(program, worker_of, last_use, keep, island) -> LoweredProgram:
    g = plaque.Graph(program.name)
    nodes, producer = [], {}
    for e, eqn in enumerate(program.eqns):
        frees = tuple(v.id for v in eqn.inputs if last_use.get(v.id) == e and v.id not in keep)
        spec = KernelSpec(e, eqn.fn, tuple(v.id for v in eqn.inputs),
                          tuple(v.id for v in eqn.outputs),
                          tuple(v.aval for v in eqn.inputs), frees)
        devices = eqn.fn.mesh.devices
        try:
            hosts = [worker_of[d] for d in devices]
        except KeyError as exc:
            raise ProgramError(f"device {exc.args[0]} of {eqn.fn.name} is not known to be on"
                               " a live host") from None
        node = g.node(f"{e}:{eqn.fn.name}", functools.partial(KernelOp, spec), len(devices),
                      placement=hosts)
        for v in eqn.inputs:
            if v.id in producer:
                src = producer[v.id]
                same = program.eqns[src].fn.mesh.devices == devices
                if not any(ed.src == nodes[src].index and ed.dst == node.index for ed in g.edges):
                    g.edge(nodes[src], node, plaque.ONE_TO_ONE if same else plaque.BROADCAST)
        for v in eqn.outputs:
            producer[v.id] = e
        nodes.append(node)
    hosts = sorted({w for n in g.nodes for w in n.placement})
    return LoweredProgram(program, g, [e.fn.mesh.devices for e in program.eqns], hosts, island)
