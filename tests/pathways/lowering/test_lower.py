"""``lower`` on abstract meshes, no cluster: the nodes, edges, keyed sends and expectations a
traced program becomes, and the paper's compact property (the graph grows with the number of
sharded computations, never with their shards)."""

from __future__ import annotations

import numpy as np
import pytest

import pathways as pw
from pathways.errors import ProgramError
from pathways.lowering.lower import lower, placement_of
from pathways.lowering.specs import ROUTED_PORT, Incoming
from pathways.program.ir import Aval
from pathways.program.mesh import Mesh
from pathways.program.sharding import P

F32, I32 = np.dtype("float32"), np.dtype("int32")
ONE_TO_ONE, KEYED = "one_to_one", "keyed"


def mesh(ids, axis="d", island=0) -> Mesh:
    return Mesh((len(ids),), (axis,), tuple(ids), island=island)


def hosts(n_devices, per_host=2, per_island=4):
    """(worker_of, island_of) for ``n_devices`` devices, ``per_host`` on each host."""
    return ({d: d // per_host for d in range(n_devices)},
            {d: d // per_island for d in range(n_devices)})


def chain_of(a, b):
    @pw.program
    def chain(x):
        return b(a(x))

    return chain


def graph(lowered):
    """(name, kind, shards, placement, notify) per node and (src, dst, routing, ports) per
    edge, by node name."""
    g = lowered.graph
    nodes = [(n.name, n.factory.kind, n.shards, n.placement, n.notify) for n in g.nodes]
    edges = [(g.nodes[e.src].name, g.nodes[e.dst].name, e.routing.value, e.src_port,
              e.dst_port) for e in g.edges]
    return nodes, edges


def spec_of(lowered, name):
    return next(n.factory.spec for n in lowered.graph.nodes if n.name == name)


def lowered_chain(n, b_mesh=None, b_spec=None, dispatch="parallel"):
    """A -> B on ``n`` devices; B on ``b_mesh`` (A's by default) with ``b_spec`` (A's)."""
    m = mesh(range(n))
    b_spec = P("d") if b_spec is None else b_spec
    a = pw.shard_map(lambda x: x + 1, m, P("d"), P("d"), name="A")
    b = pw.shard_map(lambda x: x * 2, b_mesh or m, b_spec, b_spec, name="B")
    program = chain_of(a, b).trace([Aval((8 * n, 3), F32)])
    worker_of, island_of = hosts(2 * n)
    return lower(program, [placement_of(m, P("d"), 2)], worker_of, island_of, dispatch)


def test_a_chain_is_two_kernel_nodes_joined_one_to_one():
    lowered = lowered_chain(4)
    nodes, edges = graph(lowered)
    assert nodes == [("0:A", "kernel", 4, (0, 0, 1, 1), False),
                     ("1:B", "kernel", 4, (0, 0, 1, 1), False)]
    assert edges == [("0:A", "1:B", ONE_TO_ONE, 0, 0)]
    assert lowered.gangs == [(0, 1, 2, 3), (0, 1, 2, 3)] and lowered.islands == [0, 0]
    assert lowered.devices == [(0, 1, 2, 3), (0, 1, 2, 3)]
    a, b = spec_of(lowered, "0:A"), spec_of(lowered, "1:B")
    # v0 (the program's input) is kept; v1 has one user where it lives, then is freed
    assert (a.index, a.inputs, a.outputs, a.releases, a.incoming) == (0, (0,), (1,), (0,), {})
    assert (b.index, b.inputs, b.outputs, b.releases, b.incoming) == (1, (1,), (2,), (1,), {})
    assert b.expect.avals == (Aval((32, 3), F32),) and b.expect.shards == (Aval((8, 3), F32),)
    out_mesh, out_spec = lowered.outputs[2]
    assert out_mesh.ids == (0, 1, 2, 3) and out_spec == P("d", None)


def test_sequential_dispatch_makes_every_node_wait_for_completion():
    nodes, _ = graph(lowered_chain(2, dispatch="sequential"))
    assert [notify for *_, notify in nodes] == [True, True]


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_the_graph_size_does_not_grow_with_the_shards(n):
    """Paper §4.2: a chain of two N-shard computations is a fixed number of nodes whatever
    N (the arguments and results are buffers named by each run, not nodes); a resharding
    between them adds one send node, whose shards pick their destinations over one edge."""
    nodes, edges = graph(lowered_chain(n))
    assert (len(nodes), len(edges)) == (2, 1)
    assert nodes[0][2] == n  # the shards are in the node, not in the graph
    other = mesh(range(n, 2 * n))
    nodes, edges = graph(lowered_chain(n, b_mesh=other))
    assert (len(nodes), len(edges)) == (3, 2)
    assert [kind for _, kind, *_ in nodes] == ["kernel", "kernel", "send"]


def test_a_resharding_between_nodes_is_a_keyed_send_with_its_pieces_expected():
    """B wants A's output replicated: a send node on A's devices gives every shard of B one
    piece from each of A's four tiles, over a keyed edge into B's input port 0."""
    lowered = lowered_chain(4, b_spec=P())
    nodes, edges = graph(lowered)
    assert nodes == [("0:A", "kernel", 4, (0, 0, 1, 1), False),
                     ("1:B", "kernel", 4, (0, 0, 1, 1), False),
                     ("1:send0:v1", "send", 4, (0, 0, 1, 1), False)]
    assert edges == [("0:A", "1:send0:v1", ONE_TO_ONE, 0, 0),
                     ("1:send0:v1", "1:B", KEYED, 0, 0)]
    b, send = spec_of(lowered, "1:B"), spec_of(lowered, "1:send0:v1")
    assert b.releases == (None,)  # the transfer buffer is B's alone: freed after it
    assert b.incoming == {0: Incoming(1, (32, 3), F32, (4, 4, 4, 4))}
    assert (send.var, send.devices, send.uses) == (1, (0, 1, 2, 3), 1)
    for src, pieces in enumerate(send.pieces):
        assert [dst for dst, *_ in pieces] == [0, 1, 2, 3]
        for dst, src_slices, dst_slices, link in pieces:
            assert src_slices == (slice(0, 8), slice(0, 3))
            assert dst_slices == (slice(8 * src, 8 * src + 8), slice(0, 3))
            assert link == ("local" if src // 2 == dst // 2 else "ici")


def test_an_argument_placed_elsewhere_is_sent_with_no_producer_edge():
    m, other = mesh(range(4)), mesh(range(4, 8))
    b = pw.shard_map(lambda x: x * 2, other, P("d"), P("d"), name="B")
    program = pw.program(lambda x: b(x)).trace([Aval((8, 3), F32)])
    lowered = lower(program, [placement_of(m, P("d"), 2)], *hosts(8))
    nodes, edges = graph(lowered)
    assert [name for name, *_ in nodes] == ["0:B", "0:send0:v0"]
    assert edges == [("0:send0:v0", "0:B", KEYED, 0, 0)]
    assert spec_of(lowered, "0:send0:v0").uses == 0  # a program input: kept where it is


def test_a_multi_island_pipeline_sends_its_activations_over_dcn():
    m0, m1 = mesh(range(4), island=0), mesh(range(4, 8), island=1)
    s0 = pw.shard_map(lambda x: x + 1, m0, P("d"), P("d"), name="stage0")
    s1 = pw.shard_map(lambda x: x * 2, m1, P("d"), P("d"), name="stage1")
    program = chain_of(s0, s1).trace([Aval((8, 3), F32)])
    lowered = lower(program, [placement_of(m0, P("d"), 2)], *hosts(8))
    nodes, edges = graph(lowered)
    assert nodes == [("0:stage0", "kernel", 4, (0, 0, 1, 1), False),
                     ("1:stage1", "kernel", 4, (2, 2, 3, 3), False),
                     ("1:send0:v1", "send", 4, (0, 0, 1, 1), False)]
    assert edges == [("0:stage0", "1:send0:v1", ONE_TO_ONE, 0, 0),
                     ("1:send0:v1", "1:stage1", KEYED, 0, 0)]
    assert lowered.gangs == [(0, 1, 2, 3), (4, 5, 6, 7)] and lowered.islands == [0, 1]
    send = spec_of(lowered, "1:send0:v1")
    # same spec, other devices: shard i goes whole to shard i, across the islands
    assert [[(dst, link) for dst, _, _, link in p] for p in send.pieces] == \
        [[(i, "dcn")] for i in range(4)]
    assert spec_of(lowered, "1:stage1").incoming == {0: Incoming(1, (2, 3), F32, (1, 1, 1, 1))}


def routed_program(tm, em):
    ffn = pw.expert_map(lambda x, w: x @ w, tm, em, num_experts=8, name="ffn")
    after = pw.shard_map(lambda y: y + 1, tm, P("t"), P("t"), name="after")

    @pw.program
    def moe(route, x, w):
        return after(ffn(route, x, w))

    return moe.trace([Aval((16, 2), I32), Aval((16, 3), F32), Aval((8, 3, 3), F32)])


def test_a_routed_call_is_route_experts_gather_joined_by_keyed_edges():
    tm, em = mesh(range(4), "t"), mesh(range(2, 6), "e")  # experts overlap the token hosts
    program = routed_program(tm, em)
    places = [placement_of(tm, P("t"), 2), placement_of(tm, P("t"), 2),
              placement_of(em, P("e"), 3)]
    assert [e.fn.routed for e in program.eqns] == [True, False]
    lowered = lower(program, places, *hosts(8))
    nodes, edges = graph(lowered)
    # how many rows reach an expert is data-dependent: experts and gather always wait
    assert nodes == [("0:ffn:route", "route", 4, (0, 0, 1, 1), False),
                     ("0:ffn", "expert", 4, (1, 1, 2, 2), True),
                     ("0:ffn:gather", "gather", 4, (0, 0, 1, 1), True),
                     ("1:after", "kernel", 4, (0, 0, 1, 1), False)]
    assert edges == [("0:ffn:route", "0:ffn", KEYED, ROUTED_PORT, 3),
                     ("0:ffn", "0:ffn:gather", KEYED, ROUTED_PORT, 0),
                     ("0:ffn:gather", "1:after", ONE_TO_ONE, 0, 0)]
    route = spec_of(lowered, "0:ffn:route")
    assert route.inputs == (0, 1, 2) and route.outputs == (3,)
    assert route.links[0] == ("ici", "ici", "dcn", "dcn")  # token device 0 (host 0, island 0)
    assert route.links[2] == ("local", "local", "dcn", "dcn")  # token device 2 (host 1)
    assert route.out_avals == (Aval((16, 2, 3), F32),) and route.row_avals == (Aval((3,), F32),)
    assert lowered.outputs[3][0] == tm  # the rows come back to the token devices
    assert lowered.gangs == [em.ids, tm.ids]


def test_a_device_on_no_live_host_is_a_program_error():
    b = pw.shard_map(lambda x: x, mesh(range(4, 8)), P("d"), P("d"), name="B")
    program = pw.program(lambda x: b(x)).trace([Aval((8, 3), F32)])
    worker_of, island_of = hosts(8)
    del worker_of[5]
    with pytest.raises(ProgramError, match="device 5 of B is not known to be on a live host"):
        lower(program, [placement_of(mesh(range(4)), P("d"), 2)], worker_of, island_of)


def test_a_lowered_program_prints_one_line_per_node_and_edge():
    assert str(lowered_chain(4, b_spec=P())) == "\n".join([
        "lowered chain: 3 nodes, 2 edges; gangs on islands [0, 0]",
        "  0:A  kernel  devices [0, 1, 2, 3]  shards per host {0: [0, 1], 1: [2, 3]}",
        "  1:B  kernel  devices [0, 1, 2, 3]  shards per host {0: [0, 1], 1: [2, 3]}",
        "  1:send0:v1  send  devices [0, 1, 2, 3]  shards per host {0: [0, 1], 1: [2, 3]}",
        "  0:A -> 1:send0:v1  one_to_one",
        "  1:send0:v1 -> 1:B  keyed",
    ])
    tm, em = mesh(range(4), "t"), mesh(range(4, 8), "e")
    places = [placement_of(tm, P("t"), 2), placement_of(tm, P("t"), 2),
              placement_of(em, P("e"), 3)]
    text = str(lower(routed_program(tm, em), places, *hosts(8)))
    assert "  0:ffn  expert  devices [4, 5, 6, 7]  shards per host {2: [0, 1], 3: [2, 3]}" \
           "  waits for completion" in text.splitlines()
    assert "  0:ffn:route -> 0:ffn  keyed  port 1 -> 3" in text.splitlines()
