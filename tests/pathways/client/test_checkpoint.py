"""Checkpoints written by the hosts (client.save / client.load): Zarr v3 that plain zarr opens,
round trips of every dtype across meshes and specs, trees, atomic commits, failures."""

import collections
import itertools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
from pathways import P
from pathways.checkpoint_format import ZARR_DTYPES
from pathways.program.sharding import shard_shape

zarr = pytest.importorskip("zarr")

MESHES = [((8,), ("a",)), ((2, 4), ("a", "b")), ((4, 2), ("a", "b")), ((2, 2, 2), ("a", "b", "c"))]


@pytest.fixture
def client(pw_cluster):
    with pw.connect(pw_cluster.address) as c:
        yield c


def _value(dtype, shape, seed):
    """Every bit pattern of the dtype is fair (NaNs too), but bools are 0 or 1."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=int(np.prod(shape, dtype=int)) * dtype.itemsize,
                       dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@st.composite
def placements(draw, ndim):
    """A mesh (shape, axes) and a spec for an array of ``ndim`` dimensions, with a shape
    that spec divides."""
    mesh_shape, axes = draw(st.sampled_from(MESHES))
    free = list(axes)
    spec, dims = [], []
    for _ in range(ndim):
        choice = draw(st.sampled_from(["none", "one", "two"]))
        if choice == "one" and free:
            name = free.pop(draw(st.integers(0, len(free) - 1)))
            spec.append(name)
            split = mesh_shape[axes.index(name)]
        elif choice == "two" and len(free) >= 2:
            pair = (free.pop(0), free.pop(0))
            spec.append(pair)
            split = mesh_shape[axes.index(pair[0])] * mesh_shape[axes.index(pair[1])]
        else:
            spec.append(None)
            split = 1
        dims.append(split * draw(st.integers(1, 3)))
    return mesh_shape, axes, P(*spec), tuple(dims)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data(), dtype=st.sampled_from(ZARR_DTYPES), ndim=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1))
def test_round_trip_of_every_dtype_across_meshes_and_specs(client, tmp_path_factory, data,
                                                           dtype, ndim, seed):
    mesh_shape, axes, spec, shape = data.draw(placements(ndim))
    value = _value(dtype, shape, seed)
    mesh = client.mesh(mesh_shape, axes)
    path = tmp_path_factory.mktemp("ckpt") / "c"
    assert client.save(path, {"v": client.put(value, mesh, spec)}).result(timeout=30) == str(path)
    # plain zarr opens it and reads the same bits; its chunks are the shards
    stored = zarr.open_group(str(path), mode="r")["v"]
    assert _same_bits(stored[...], value)
    assert stored.chunks == shard_shape(shape, mesh_shape, axes, spec)
    # back as saved, and onto another mesh and spec (the hosts reshard)
    back = client.load(path, mesh)["v"]
    assert back.spec == spec and _same_bits(back.result(timeout=30), value)
    other_shape, other_axes, other_spec, _ = data.draw(placements(ndim))
    other_spec = P(*[e if _divides(shape[i], e, other_shape, other_axes) else None
                     for i, e in enumerate(other_spec)])
    other = client.mesh(other_shape, other_axes)
    moved = client.load(path, other, other_spec)["v"]
    assert moved.sharding.mesh == other and moved.spec == other_spec
    assert _same_bits(moved.result(timeout=30), value)


def _divides(n, entry, mesh_shape, axes):
    names = (entry,) if isinstance(entry, str) else entry or ()
    return n % int(np.prod([mesh_shape[axes.index(a)] for a in names], dtype=int)) == 0


def test_a_tree_of_dicts_tuples_and_lists_comes_back_whole(client, tmp_path):
    mesh = client.mesh((2, 4), ("data", "model"))
    w = np.arange(32.0).reshape(8, 4)
    tree = {"params": {"w": client.put(w, mesh, P("data", "model")),
                       "b": client.put(np.ones(4, np.float32), mesh)},
            "opt": (client.put(np.int64(7), mesh), [client.put(w.T, mesh, P(None, "data"))]),
            "by_id": {3: client.put(np.zeros((2, 2), np.complex64), mesh)}}
    client.save(tmp_path / "t", tree).result(timeout=30)
    group = zarr.open_group(str(tmp_path / "t"), mode="r")
    assert sorted(group.array_keys()) == ["by_id.3", "opt.0", "opt.1.0", "params.b",
                                                 "params.w"]
    back = client.load(tmp_path / "t", mesh)
    assert sorted(back) == sorted(tree) and list(back["by_id"]) == [3]
    assert isinstance(back["opt"], tuple) and isinstance(back["opt"][1], list)
    np.testing.assert_array_equal(back["params"]["w"].result(timeout=30), w)
    np.testing.assert_array_equal(back["opt"][1][0].result(timeout=30), w.T)
    assert back["opt"][0].result(timeout=30) == 7 and back["by_id"][3].dtype == np.complex64
    # a tree prefix of specs: one spec for a whole subtree
    line = client.mesh((8,), ("d",))
    specs = {"params": {"w": P("d"), "b": None}, "opt": P(), "by_id": None}
    again = client.load(tmp_path / "t", line, specs)
    assert again["params"]["w"].spec == P("d", None) and again["opt"][1][0].spec == P(None, None)
    np.testing.assert_array_equal(again["params"]["w"].result(timeout=30), w)


def test_a_save_overlaps_the_run_that_makes_its_array_and_the_steps_after(client, tmp_path):
    mesh = client.mesh((2, 4), ("data", "model"))
    step = pw.shard_map(lambda v: v * 2.0, mesh, P("data"), P("data"), cost=0.2)
    x = client.put(np.arange(8.0), mesh, P("data"))
    y = step(x)
    saved = client.save(tmp_path / "s", y)  # y is still being computed
    z = step(y)  # and the next step goes on while it is written
    assert not saved.done()
    assert saved.result(timeout=30) == str(tmp_path / "s")
    np.testing.assert_array_equal(client.load(tmp_path / "s", mesh).result(timeout=30),
                                  np.arange(8.0) * 2)
    np.testing.assert_array_equal(z.result(timeout=30), np.arange(8.0) * 4)


def test_a_save_is_committed_last_and_replaces_only_when_asked(client, tmp_path):
    mesh = client.mesh((8,), ("d",))
    path = tmp_path / "c"
    client.save(path, client.put(np.zeros(8), mesh, P("d"))).result(timeout=30)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        client.save(path, client.put(np.ones(8), mesh, P("d")))
    client.save(path, client.put(np.ones(8), mesh, P("d")), overwrite=True).result(timeout=30)
    np.testing.assert_array_equal(client.load(path, mesh).result(timeout=30), np.ones(8))
    assert os.listdir(tmp_path) == ["c"]  # no temporary or replaced directory left


def test_a_failed_save_leaves_nothing_and_names_the_error(client, tmp_path):
    mesh = client.mesh((8,), ("d",))

    def bad(v):
        if v.sum() > 0:  # not in the abstract pass, on zeros: on the devices
            raise ValueError("no luck")
        return v

    y = pw.shard_map(bad, mesh, P("d"), P("d"))(client.put(np.ones(8), mesh, P("d")))
    saved = client.save(tmp_path / "f", {"ok": client.put(np.ones(8), mesh), "bad": y})
    with pytest.raises(pw.RemoteError, match="no luck"):
        saved.result(timeout=30)
    assert os.listdir(tmp_path) == []


def test_bad_input_gets_clear_errors(client, tmp_path):
    mesh = client.mesh((8,), ("d",))
    x = client.put(np.zeros(8), mesh, P("d"))
    with pytest.raises(pw.ProgramError, match="dtype object has no Zarr"):
        client.save(tmp_path / "o", client.put(np.array([{}] * 8, dtype=object), mesh))
    with pytest.raises(pw.ProgramError, match="ndarray, not an array of this client"):
        client.save(tmp_path / "n", {"x": np.zeros(3)})
    with pytest.raises(pw.ProgramError, match="key 'a/b' cannot name"):
        client.save(tmp_path / "k", {"a/b": x})
    with pytest.raises(pw.ProgramError, match="x is set, not an array"):
        client.save(tmp_path / "s", {"x": {x}})
    pair = collections.namedtuple("Pair", "a b")
    with pytest.raises(pw.ProgramError, match="Pair in the tree; a checkpoint holds dicts"):
        client.save(tmp_path / "p", pair(x, x))
    gone = client.put(np.zeros(8), mesh, P("d"))
    gone.delete()
    with pytest.raises(pw.ProgramError, match="x was deleted"):
        client.save(tmp_path / "d", {"x": gone})
    with pytest.raises(FileNotFoundError, match="no Zarr node"):
        client.load(tmp_path / "missing", mesh)
    client.save(tmp_path / "ok", {"x": client.put(np.zeros(6), mesh)}).result(timeout=30)
    with pytest.raises(pw.ShardingError, match="load x: .*divisible"):
        client.load(tmp_path / "ok", mesh, P("d"))
    assert os.listdir(tmp_path) == ["ok"]


def test_a_foreign_zarr_array_with_compression_loads_through_zarr(client, tmp_path):
    """Checkpoints others wrote (compressed chunks) load too, through zarr-python."""
    from pathways.checkpoint_format import create

    value = np.arange(64.0).reshape(8, 8)
    create(str(tmp_path / "z"), {"array": "v"}, [])
    arr = zarr.open_group(str(tmp_path / "z"), mode="r+").create_array(
        "v", shape=value.shape, chunks=(3, 5), dtype=value.dtype,
        attributes={"pathways": {"spec": [None, None]}})
    arr[...] = value
    mesh = client.mesh((2, 4), ("a", "b"))
    np.testing.assert_array_equal(client.load(tmp_path / "z", mesh, P("a", "b")).result(
        timeout=30), value)


def test_many_saves_in_flight_each_commit_once(client, tmp_path):
    mesh = client.mesh((2, 4), ("data", "model"))
    x = client.put(np.arange(16.0).reshape(4, 4), mesh, P("data"))
    saves = [client.save(tmp_path / f"step_{i}", {"x": x, "i": client.put(np.int32(i), mesh)})
             for i in range(6)]
    for i, s in zip(itertools.count(), saves):
        assert s.result(timeout=30).endswith(f"step_{i}")
    assert sorted(os.listdir(tmp_path)) == [f"step_{i}" for i in range(6)]
    assert client.load(tmp_path / "step_4", mesh)["i"].result(timeout=30) == 4
