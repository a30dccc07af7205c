"""Client API misuse fails at once, at the call that is wrong, with an error naming the
problem; the client and the cluster stay usable."""

from dataclasses import dataclass

import numpy as np
import pytest

import pathways as pw
from pathways import P


def test_wrong_shapes_and_unknown_axes_fail_at_the_call(client):
    mesh = client.mesh((2, 2), ("data", "model"))
    with pytest.raises(pw.ShardingError, match="names mesh axis 'batch'"):
        client.put(np.ones((4, 4)), mesh, P("batch"))
    with pytest.raises(pw.ShardingError, match="not divisible"):
        client.put(np.ones((3, 4)), mesh, P("data"))
    f = pw.shard_map(lambda x: x @ np.ones((5, 2)), mesh, P("data"), P("data"))
    x = client.put(np.ones((4, 4)), mesh, P("data"))
    with pytest.raises(pw.ProgramError, match="shapes|matmul|mismatch"):
        f(x)
    with pytest.raises(pw.ShardingError):
        pw.shard_map(lambda x: pw.psum(x, "nope"), mesh, P("data"), P("data"))(x)
    with pytest.raises(pw.ShardingError, match="mesh shape"):
        client.mesh((2, 2), ("data",))


def test_more_devices_than_exist_is_a_resource_error(client):
    with pytest.raises(pw.ResourceError, match="64"):
        client.mesh((64,), ("d",))


def test_arrays_of_a_closed_client_or_another_client(pw_cluster, client):
    with pw.connect(pw_cluster.address) as other:  # closed below too: close is idempotent
        arrays_of_another_and_a_closed_client(client, other)


def arrays_of_another_and_a_closed_client(client, other):
    mesh_o = other.mesh((2,), ("d",))
    x_other = other.put(np.ones(2), mesh_o, P("d"))
    mesh = client.mesh((2,), ("d",))
    f = pw.shard_map(lambda v: v + 1, mesh, P("d"), P("d"))
    with pytest.raises(pw.ProgramError, match="another client"):
        client.run_program(client.op_program(f, [x_other.aval]), [x_other])
    other.close()
    with pytest.raises(pw.ClientClosed):
        other.put(np.ones(2), mesh_o, P("d"))
    f_other = pw.shard_map(lambda v: v + 1, mesh_o, P("d"), P("d"))
    with pytest.raises(pw.ClientClosed):
        f_other(x_other)


def test_python_control_flow_and_arithmetic_on_traced_values_are_refused(client):
    mesh = client.mesh((2,), ("d",))
    f = pw.shard_map(lambda v: v + 1, mesh, P("d"), P("d"))

    @pw.program
    def branchy(v):
        y = f(v)
        if y:  # data-dependent Python control flow
            return y
        return f(y)

    @pw.program
    def arith(v):
        return f(v) * 2

    x = client.put(np.ones(2), mesh, P("d"))
    with pytest.raises(pw.ProgramError, match="no value yet"):
        branchy(x)
    with pytest.raises(pw.ProgramError, match="only compiled functions"):
        arith(x)


def test_exceeding_hbm_fails_at_once(pw_cluster, client):
    mesh = client.mesh((1,), ("d",))
    hbm = client.cluster.hbm(mesh.ids[0])
    assert hbm == 16 << 30

    with pytest.raises(pw.DeviceOutOfMemory, match="larger than the whole HBM"):
        client.generate(lambda idx: None, (hbm // 4 + 1,), np.float32, mesh, P())


def test_a_hand_made_mesh_on_devices_of_no_slice_of_the_client_is_refused(pw_cluster):
    with pw.connect(pw_cluster.address) as c:
        mine = c.mesh((2,), ("d",))
        others = [d.id for d in c.devices() if d.id not in mine.ids][:2]
        rogue = pw.Mesh((2,), ("d",), tuple(others), client=c)
        f = pw.shard_map(lambda v: v + 1, rogue, P("d"), P("d"))
        with pytest.raises(pw.ResourceError, match="in no slice of client"):
            f(c.put(np.ones(2), rogue, P("d"))).result(timeout=30)
        g = pw.shard_map(lambda v: v + 1, mine, P("d"), P("d"))  # its own slice still works
        np.testing.assert_array_equal(g(c.put(np.ones(2), mine, P("d"))).result(30), [2, 2])


# -- arguments that are not live arrays of this client: named at the call -----------------


@dataclass
class Pair:
    a: object
    b: object


def test_a_value_that_is_not_an_array_is_named_at_the_call(client):
    mesh = client.mesh((2,), ("d",))
    f = pw.shard_map(lambda v: v + 1, mesh, P("d"), P("d"))
    x = client.put(np.ones(8), mesh, P("d"))
    with pytest.raises(pw.ProgramError, match=r"argument 0\[0\] is a float \(0\.0\), not a"
                                              r" pw.Array.*client.put"):
        f([0.0] * 8)
    with pytest.raises(pw.ProgramError, match=r"argument 0 is a numpy.ndarray float64\[8\]"):
        f(np.ones(8))
    with pytest.raises(pw.ProgramError, match=r"argument 1\['b'\]\[1\] is an int"):
        pw.shard_map(lambda v, t: v, mesh, P("d"), P("d"))(x, {"a": x, "b": (x, 3)})
    with pytest.raises(pw.ProgramError, match=r"argument 0\.b is a str"):
        pw.shard_map(lambda p: p.a, mesh, P("d"), P("d"))(Pair(x, "w"))
    np.testing.assert_array_equal(f(x).result(timeout=30), np.full(8, 2.0))  # still usable


def test_a_program_names_its_bad_argument_too(client):
    mesh = client.mesh((2,), ("d",))
    f = pw.shard_map(lambda v: v + 1, mesh, P("d"), P("d"))
    x = client.put(np.ones(8), mesh, P("d"))

    @pw.program
    def step(a, b):
        return f(a)

    @pw.program
    def closes_over_a_float(a):
        return f((a, 1.0))

    with pytest.raises(pw.ProgramError, match=r"step: argument 1 is a float \(2\.0\), not a"
                                              r" pw.Array"):
        step(x, 2.0)
    with pytest.raises(pw.ProgramError, match=r"step: argument 1\[1\] is a numpy.ndarray"):
        step(x, [x, np.ones(3)])
    with pytest.raises(pw.ProgramError, match=r"argument 0\[1\] is a float \(1\.0\), not a"
                                              " value of this program"):
        closes_over_a_float(x)
    np.testing.assert_array_equal(step(x, x).result(timeout=30), np.full(8, 2.0))


def test_an_array_of_another_client_or_a_deleted_one_is_named_at_the_call(pw_cluster,
                                                                           client):
    mesh = client.mesh((2,), ("d",))
    f = pw.shard_map(lambda v, w: v + w, mesh, P("d"), P("d"))
    x = client.put(np.ones(8), mesh, P("d"))
    gone = client.put(np.ones(8), mesh, P("d"))
    gone.delete()
    with pytest.raises(pw.ProgramError, match="argument 1 was deleted"):
        f(x, gone)
    with pytest.raises(pw.ProgramError, match=r"argument 0\['w'\] was deleted"):
        pw.shard_map(lambda t: t["v"], mesh, P("d"), P("d"))({"v": x, "w": gone})

    @pw.program
    def add(a, b):
        return f(a, b)

    with pw.connect(pw_cluster.address) as other:
        mesh_o = other.mesh((2,), ("d",))
        y = other.put(np.ones(8), mesh_o, P("d"))
        with pytest.raises(pw.ProgramError, match="argument 1 belongs to another client than"
                                                  " argument 0"):
            f(x, y)
        with pytest.raises(pw.ProgramError, match="argument 0 belongs to another client than"
                                                  " the mesh of the function"):
            f(y, x)
        with pytest.raises(pw.ProgramError, match=r"add: argument 1 belongs to another client"):
            add(x, y)
        with pytest.raises(pw.ProgramError, match=r"add: argument 1\[0\] was deleted"):
            add(x, [gone])
    np.testing.assert_array_equal(f(x, x).result(timeout=30), np.full(8, 2.0))


def test_a_tree_whose_dict_keys_cannot_be_sorted_is_named():
    from pathways.program import tree

    with pytest.raises(pw.ProgramError, match="keys that cannot be sorted"):
        tree.flatten({"a": 1.0, 3: 2.0})
