"""A lowered graph's wire form: the coordinator rebuilds the graph's shape from it without
unpickling code, and importing the coordinator reaches neither the program representation
nor JAX."""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest

import pathways as pw
import plaque
from pathways import _imports
from pathways.errors import ProgramError
from pathways.lowering import wire
from pathways.lowering.lower import lower, placement_of
from pathways.program.ir import Aval
from pathways.program.mesh import Mesh
from pathways.program.sharding import P


def lowered_pipeline():
    """Two stages on two islands (devices 0-3 on hosts 10, 11; 4-7 on hosts 12, 13)."""
    m0, m1 = Mesh((4,), ("d",), (0, 1, 2, 3), island=0), Mesh((4,), ("d",), (4, 5, 6, 7), island=1)
    s0 = pw.shard_map(lambda x: x + 1, m0, P("d"), P("d"), name="stage0")
    s1 = pw.shard_map(lambda x: x * 2, m1, P("d"), P("d"), name="stage1")
    program = pw.program(lambda x: s1(s0(x))).trace([Aval((8, 3), np.dtype("float32"))])
    return lower(program, [placement_of(m0, P("d"), 2)], {d: 10 + d // 2 for d in range(8)},
                 {d: d // 4 for d in range(8)}), (s0.body, s1.body)


def test_the_coordinator_rebuilds_the_graph_placed_on_live_workers():
    lowered, bodies = lowered_pipeline()
    nodes, edges, blob, gangs, islands = lowered.install_payload(bodies)
    assert nodes == [wire.WireNode("0:stage0", 4, (10, 10, 11, 11), False),
                     wire.WireNode("1:stage1", 4, (12, 12, 13, 13), False),
                     wire.WireNode("1:send0:v1", 4, (10, 10, 11, 11), False)]
    assert edges == [wire.WireEdge(0, 2, "one_to_one", 0, 0), wire.WireEdge(2, 1, "keyed", 0, 0)]
    assert (gangs, islands) == (lowered.gangs, lowered.islands)
    g = wire.rebuild(nodes, edges, blob, live_workers=[13, 12, 11, 10])
    assert [(n.name, n.shards, n.placement, n.notify) for n in g.nodes] == [
        ("0:stage0", 4, (3, 3, 2, 2), False), ("1:stage1", 4, (1, 1, 0, 0), False),
        ("1:send0:v1", 4, (3, 3, 2, 2), False)]
    assert [(e.src, e.dst, e.routing) for e in g.edges] == [(0, 2, plaque.ONE_TO_ONE),
                                                            (2, 1, plaque.KEYED)]
    assert all(isinstance(n.factory, wire.LazyFactory) for n in g.nodes)


def test_a_graph_on_a_host_that_is_not_live_is_refused():
    lowered, bodies = lowered_pipeline()
    nodes, edges, blob, *_ = lowered.install_payload(bodies)
    with pytest.raises(ProgramError, match="host 12 is not live"):
        wire.rebuild(nodes, edges, blob, live_workers=[10, 11, 13])


def test_a_node_s_factory_is_unpickled_only_when_a_host_builds_it():
    g = plaque.Graph("g")
    g.node("a", functools.partial(dict, shard="a"), 2, placement=[7, 7])
    g.node("b", functools.partial(dict, shard="b"), 1, placement=[7])
    nodes, edges, blob = wire.pack(g, [])
    rebuilt = wire.rebuild(nodes, edges, blob, live_workers=[7])
    assert [n.factory() for n in rebuilt.nodes] == [{"shard": "a"}, {"shard": "b"}]


def test_the_coordinator_imports_only_the_wire_form_of_the_lowering():
    edges = _imports.graph()
    reached, todo = set(), ["control.coordinator"]
    while todo:
        for dst in edges[todo.pop()] - reached:
            reached.add(dst)
            todo.append(dst)
    assert "lowering.wire" in reached
    assert not {m for m in reached if m.startswith("program") or m in {"lowering.lower",
                                                                       "lowering.specs"}}


def test_importing_the_coordinator_loads_no_program_module_and_no_jax():
    """In a fresh process, with the package's own ``__init__`` (re-exports for users, which
    load everything) left out: what the coordinator's module itself loads."""
    code = "\n".join([
        "import importlib.util, sys, types",
        "pkg = types.ModuleType('pathways')",
        "pkg.__path__ = list(importlib.util.find_spec('pathways').submodule_search_locations)",
        "sys.modules['pathways'] = pkg",
        "import pathways.control.coordinator",
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'jax'",
        "             or m.startswith(('pathways.program', 'pathways.lowering.lower')))",
        "assert 'pathways.lowering.wire' in sys.modules",
        "assert not bad, bad",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-c", "import sys, pathways.control.coordinator;"
                          " assert 'jax' not in sys.modules"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
