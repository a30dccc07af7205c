"""Values consumed on other slices or with other specs move between hosts (resharding), also
between islands over DCN; results equal the reference interpreter."""

import gc

import numpy as np
import pytest
from conftest import store_bytes, wait_for_store_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
from pathways import P


def test_reshard_within_a_mesh_and_across_meshes(client):
    a = client.mesh((2, 4), ("data", "model"))
    b = client.mesh((4, 2), ("x", "y"))
    f = pw.shard_map(lambda v: v * 2.0, a, P("data"), P("data", "model"))
    g = pw.shard_map(lambda v: v + pw.axis_index("x"), b, P("y", "x"), P("y", "x"))
    h = pw.shard_map(lambda v: pw.psum(v, "model"), a, P(None, "model"), P())

    @pw.program
    def prog(v):
        return h(g(f(v)))

    x0 = np.arange(64.0).reshape(8, 8)
    before = store_bytes(client)
    x = client.put(x0, a, P("data"))
    out = prog(x)
    np.testing.assert_allclose(out.result(60), pw.reference(prog)(x0))
    del x, out
    gc.collect()
    # intermediates and transfer buffers are freed by the hosts, the arrays by the client
    assert wait_for_store_bytes(client, before) == before


def test_op_by_op_calls_on_different_slices_move_their_inputs(client):
    a = client.mesh((2, 2), ("p", "q"))
    b = client.mesh((4,), ("r",))
    f = pw.shard_map(lambda v: v + 1.0, a, P("p", "q"), P("p", "q"))
    g = pw.shard_map(lambda v: pw.psum(v, "r"), b, P("r"), P())
    x0 = np.arange(16.0).reshape(4, 4)
    y = f(client.put(x0, a, P("p", "q")))
    z = g(y)  # y lives on a, sharded two ways: it is resharded onto b
    np.testing.assert_allclose(z.result(60), pw.reference(g)(pw.reference(f)(x0)))


def failing(v):
    raise RuntimeError("stage one broke")


def test_a_failed_producer_fails_the_consumer_across_a_transfer(client):
    a = client.mesh((2,), ("p",))
    b = client.mesh((2,), ("q",), hosts=2)  # one device on a's host, one on another
    bad = pw.shard_map(failing, a, P("p"), P("p"))
    g = pw.shard_map(lambda v: v * 3, b, P(), P())

    @pw.program
    def prog(v):
        return g(bad(v))

    with pytest.raises(pw.PathwaysError, match="stage one broke"):
        prog(client.put(np.ones(4), a, P("p"))).result(60)


def test_a_program_spanning_two_islands():
    with pw.local_cluster(islands=2, hosts_per_island=1, devices_per_host=4,
                          processes=False) as cluster:
        with pw.connect(cluster.address) as client:
            left = client.mesh((4,), ("d",), island=0)
            right = client.mesh((2, 2), ("a", "b"), island=1)
            assert {d.island for d in client.devices() if d.id in left.ids} == {0}
            assert {d.island for d in client.devices() if d.id in right.ids} == {1}
            f = pw.shard_map(lambda v: pw.psum(v, "d") / 4, left, P("d"), P())
            g = pw.shard_map(lambda v: v * pw.axis_index("a") + 1, right, P("a"), P("a"))

            @pw.program
            def two_islands(v):
                return g(f(v))

            x0 = np.arange(32.0).reshape(8, 4)
            out = two_islands(client.put(x0, left, P("d")))
            np.testing.assert_allclose(out.result(60), pw.reference(two_islands)(x0))


MESHES = [((8,), ("a",)), ((2, 4), ("a", "b")), ((4, 2), ("a", "b")), ((2, 2, 2), ("a", "b", "c")),
          ((2, 2), ("a", "b")), ((4,), ("a",))]


@st.composite
def reshard_case(draw):
    src, dst = draw(st.sampled_from(MESHES)), draw(st.sampled_from(MESHES))

    def spec(mesh):
        names = list(mesh[1])
        entries = []
        for _ in range(2):
            if names and draw(st.booleans()):
                entries.append(names.pop(draw(st.integers(0, len(names) - 1))))
            else:
                entries.append(None)
        return P(*entries)

    return src, spec(src), dst, spec(dst)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reshard_case())
def test_random_reshards_match_the_reference(client, case):
    (src_shape, src_names), src_spec, (dst_shape, dst_names), dst_spec = case
    src = client.mesh(src_shape, src_names)
    dst = client.mesh(dst_shape, dst_names)
    f = pw.shard_map(lambda v: v * 2.0, src, src_spec, src_spec)
    g = pw.shard_map(lambda v: v + 1.0, dst, dst_spec, dst_spec)

    @pw.program
    def prog(v):
        return g(f(v))

    x0 = np.arange(8.0 * 8).reshape(8, 8)
    np.testing.assert_allclose(prog(client.put(x0, src, src_spec)).result(60),
                               pw.reference(prog)(x0))


def test_both_dispatch_modes_agree_across_slices(pw_cluster):
    results = {}
    for mode in ("parallel", "sequential"):
        with pw.connect(pw_cluster.address, dispatch=mode) as c:
            a = c.mesh((2,), ("p",))
            b = c.mesh((4,), ("q",))
            f = pw.shard_map(lambda v: pw.psum(v, "p") + 1.0, a, P("p"), P("p"))
            g = pw.shard_map(lambda v: v * (1 + pw.axis_index("q")), b, P("q"), P("q"))

            @pw.program
            def prog(v, f=f, g=g):
                for _ in range(4):
                    v = f(g(v))
                return v

            x0 = np.arange(8.0)
            results[mode] = prog(c.put(x0, a, P("p"))).result(60)
            np.testing.assert_allclose(results[mode], pw.reference(prog)(x0))
    np.testing.assert_array_equal(results["parallel"], results["sequential"])


def test_a_moved_value_may_be_any_argument(client):
    a, b = client.mesh((1,), ("p",)), client.mesh((1,), ("q",))
    f = pw.shard_map(lambda v: v + 1, a, P(), P())
    g = pw.shard_map(lambda w, v: w * 10 + v, b, (P(), P()), P())

    @pw.program
    def prog(w, v):
        return g(w, f(v))  # the moved value is argument 1

    w0, v0 = np.ones(2), np.arange(2.0)
    out = prog(client.put(w0, b, P()), client.put(v0, a, P()))
    np.testing.assert_array_equal(out.result(30), w0 * 10 + v0 + 1)


def test_a_scalar_moves_between_hosts(client):
    a, b = client.mesh((1,), ("p",)), client.mesh((1,), ("q",))
    f = pw.shard_map(lambda v: v + 1, a, P(), P())
    g = pw.shard_map(lambda v: v * 2, b, P(), P())

    @pw.program
    def prog(v):
        return g(f(v))

    assert prog(client.put(np.zeros(()), a, P())).result(30) == 2.0
