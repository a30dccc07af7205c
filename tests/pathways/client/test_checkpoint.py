"""Checkpoints written by the hosts (client.save / client.load): Zarr v3 that plain zarr opens,
round trips of every dtype across meshes and specs, trees, atomic commits, failures; a
checkpoint on disk never trusted (names, symlinks, chunks' presence, size and CRC32C, damaged
metadata) and commits that never replace what they must not, even when saves race."""

import collections
import itertools
import json
import os
import re
import shutil
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
from pathways import P
from pathways.checkpoint_format import ZARR_DTYPES, seal
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
    create(str(tmp_path / "z"), {"array": "value"}, [])
    arr = zarr.open_group(str(tmp_path / "z"), mode="r+").create_array(
        "value", shape=value.shape, chunks=(3, 5), dtype=value.dtype,
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


# ---- a checkpoint on disk is never trusted (issue 27) ----------------------------------------

def _meta(node):
    with open(os.path.join(node, "zarr.json")) as f:
        return json.load(f)


def _edit(node, change, reseal=True):
    """Change the zarr.json of ``node`` with ``change(meta)``; resealed (its checksum made to
    match) unless asked not to, so the check under test is the one that fires."""
    meta = _meta(node)
    change(meta)
    with open(os.path.join(node, "zarr.json"), "w") as f:
        json.dump(meta, f)
    if reseal and "pathways" in meta.get("attributes", {}):
        seal(node)


def _two(client, tmp_path, mesh):
    """Checkpoints ``a`` and ``other`` of the same tree with different values."""
    for name, value in (("a", np.arange(8.0)), ("other", -np.arange(8.0))):
        client.save(tmp_path / name, {"x": client.put(value, mesh, P("d"))}).result(timeout=30)
    return tmp_path / "a", tmp_path / "other"


def _loads(client, path, mesh):
    return {k: v.result(timeout=30) for k, v in client.load(path, mesh).items()}


@pytest.mark.parametrize("name", ["../other/x", "OTHER/x", "x/../../other/x"])
def test_array_names_that_leave_the_checkpoint_are_refused(client, tmp_path, name):
    mesh = client.mesh((8,), ("d",))
    a, other = _two(client, tmp_path, mesh)
    name = name.replace("OTHER", str(other))  # an absolute path

    def swap(meta):
        meta["attributes"]["pathways"]["tree"] = {"dict": [["x", {"array": name}]]}

    _edit(a, swap)
    with pytest.raises(pw.CheckpointError, match=f"array name '{name}' is not one path comp"):
        _loads(client, a, mesh)


def test_symlinks_out_of_the_checkpoint_are_refused(client, tmp_path):
    mesh = client.mesh((8,), ("d",))
    a, other = _two(client, tmp_path, mesh)
    os.replace(a / "x" / "c" / "3", tmp_path / "aside")
    os.symlink(other / "x" / "c" / "3", a / "x" / "c" / "3")  # one chunk
    with pytest.raises(pw.CheckpointError, match=r"chunk .*/a/x/c/3 leads to .*/other/x/c/3"):
        _loads(client, a, mesh)
    shutil.rmtree(a / "x")
    os.symlink(other / "x", a / "x")  # a whole array
    with pytest.raises(pw.CheckpointError, match=r"/a/x leads to .*/other/x: .*\(no symlinks\)"):
        _loads(client, a, mesh)
    # a checkpoint reached through a symlink is fine: only what is inside it must be its own
    os.symlink(other, tmp_path / "latest")
    np.testing.assert_array_equal(_loads(client, tmp_path / "latest", mesh)["x"],
                                  -np.arange(8.0))


def test_a_none_in_the_tree_is_saved_and_loaded_as_none(client, tmp_path):
    mesh = client.mesh((2, 4), ("data", "model"))
    w = np.arange(8.0)
    client.save(tmp_path / "n", {"w": client.put(w, mesh, P("data")), "b": None,
                                 "opt": (None, [])}).result(timeout=30)
    assert sorted(zarr.open_group(str(tmp_path / "n"), mode="r").array_keys()) == ["w"]
    back = client.load(tmp_path / "n", mesh)
    assert back["b"] is None and back["opt"] == (None, [])
    np.testing.assert_array_equal(back["w"].result(timeout=30), w)


def test_a_tree_naming_a_zarr_file_cannot_be_saved(client, tmp_path):
    x = client.put(np.zeros(8), client.mesh((8,), ("d",)))
    with pytest.raises(pw.CheckpointError, match="array name 'zarr.json' is not one path"):
        client.save(tmp_path / "z", {"zarr": {"json": x}})
    assert os.listdir(tmp_path) == []


def test_a_missing_chunk_is_an_error_not_zeros(client, tmp_path):
    mesh = client.mesh((8,), ("d",))
    a, _ = _two(client, tmp_path, mesh)
    os.remove(a / "x" / "c" / "5")
    with pytest.raises(pw.CheckpointError, match=r"chunk .*/a/x/c/5 is missing"):
        _loads(client, a, mesh)


def test_a_chunk_of_the_wrong_size_is_refused_before_it_is_read(client, tmp_path):
    mesh = client.mesh((8,), ("d",))
    a, _ = _two(client, tmp_path, mesh)
    size = os.path.getsize(a / "x" / "c" / "2")  # one float64 and its CRC32C
    os.truncate(a / "x" / "c" / "2", 1 << 30)  # sparse: a GiB that is never read
    with pytest.raises(pw.CheckpointError, match=rf"chunk .*/c/2 is {1 << 30} bytes, not {size}"):
        _loads(client, a, mesh)
    os.truncate(a / "x" / "c" / "2", size - 1)
    with pytest.raises(pw.CheckpointError, match=rf"chunk .*/c/2 is {size - 1} bytes, not {size}"):
        _loads(client, a, mesh)


def test_a_chunk_that_is_not_a_file_is_refused_without_opening_it(client, tmp_path):
    """A FIFO would block whoever opens it: the size is checked before anything is read."""
    mesh = client.mesh((8,), ("d",))
    a, _ = _two(client, tmp_path, mesh)
    fifo = a / "x" / "c" / "4"
    os.remove(fifo)
    os.mkfifo(fifo)
    try:
        with pytest.raises(pw.CheckpointError, match=r"chunk .*/c/4 is not a regular file"):
            _loads(client, a, mesh)
    finally:  # release a reader that opened it after all
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_chunks_carry_a_crc32c_that_the_hosts_and_zarr_check(client, tmp_path):
    mesh = client.mesh((2, 4), ("a", "b"))
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    path = tmp_path / "c"
    client.save(path, {"w": client.put(value, mesh, P("a", "b"))}).result(timeout=30)
    assert [c["name"] for c in _meta(path / "w")["codecs"]] == ["bytes", "crc32c"]
    np.testing.assert_array_equal(zarr.open_group(str(path), mode="r")["w"][...], value)
    chunk = path / "w" / "c" / "1" / "2"
    data = bytearray(chunk.read_bytes())
    assert len(data) == 4 * 2 * 4 + 4
    data[5] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(pw.CheckpointError, match=r"chunk .*/w/c/1/2 fails its CRC32C"):
        client.load(path, mesh)["w"].result(timeout=30)
    with pytest.raises(ValueError, match="checksum"):
        zarr.open_group(str(path), mode="r")["w"][...]


def test_a_chunk_of_many_blocks_is_checked_whole(client, tmp_path):
    """Hosts write, read and checksum large chunks a block at a time: the last block counts."""
    from pathways.checkpoint_format import BLOCK

    mesh = client.mesh((2, 4), ("a", "b"))
    value = np.arange(2 * (BLOCK // 8 + 1000), dtype=np.float64).reshape(2, -1)
    path = tmp_path / "big"
    client.save(path, client.put(value, mesh, P("a"))).result(timeout=30)
    assert _same_bits(client.load(path, mesh).result(timeout=30), value)
    assert _same_bits(zarr.open_group(str(path), mode="r")["value"][...], value)
    chunk = path / "value" / "c" / "1" / "0"
    with open(chunk, "r+b") as f:
        f.seek(BLOCK + 8)
        byte = f.read(1)
        f.seek(BLOCK + 8)
        f.write(bytes([byte[0] ^ 4]))
    with pytest.raises(pw.CheckpointError, match=r"chunk .*/value/c/1/0 fails its CRC32C"):
        client.load(path, mesh).result(timeout=30)


def test_a_checkpoint_of_format_1_without_checksums_still_loads(client, tmp_path):
    """As Pathways wrote them before chunks carried crc32c: codec "bytes" alone."""
    value = np.arange(1, 33, dtype=np.int32).reshape(8, 4)
    group = zarr.open_group(str(tmp_path / "old"), mode="w-", zarr_format=3, attributes={
        "pathways": {"format": 1, "tree": {"dict": [["w", {"array": "w"}]]}}})
    saved = {"spec": ["d", None], "mesh": {"shape": [4], "axes": ["d"]}}
    group.create_array("w", shape=value.shape, chunks=(2, 4), dtype=value.dtype,
                       compressors=None, filters=None,
                       attributes={"pathways": saved})[...] = value
    assert os.path.getsize(tmp_path / "old" / "w" / "c" / "0" / "0") == 2 * 4 * 4
    mesh = client.mesh((2, 4), ("d", "e"))
    back = client.load(tmp_path / "old", mesh, P("e"))["w"]
    np.testing.assert_array_equal(back.result(timeout=30), value)
    os.remove(tmp_path / "old" / "w" / "c" / "3" / "0")  # still: every chunk must be there
    with pytest.raises(pw.CheckpointError, match=r"chunk .*/old/w/c/3/0 is missing"):
        client.load(tmp_path / "old", mesh)["w"].result(timeout=30)


def _set(*keys, value):
    def change(meta):
        node = meta
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return change


DAMAGED = [  # (which zarr.json, change, what the error says)
    ("", _set("attributes", "pathways", "tree", value={"bogus": []}), "tree node"),
    ("", _set("attributes", "pathways", "tree", value={"list": 3}), "tree node 'list'"),
    ("", _set("attributes", "pathways", "tree", value={"dict": [["y", {"array": "x"}]]}),
     "names the array at \\['y'\\] 'x'; it is 'y'"),
    ("", _set("attributes", "pathways", "tree", value={"dict": [
        ["x", {"array": "x"}], [3, {"array": "3"}]]}), "keys mix str and int"),
    ("", _set("attributes", "pathways", "format", value=7), "has format 7"),
    ("", _set("attributes", "pathways", "format", value=True), "has format True"),
    ("", _set("node_type", value="array"), "is not a Zarr v3 group"),
    ("", _set("attributes", value={}), "is not a Pathways checkpoint"),
    ("x", _set("data_type", value="bogus"), "data_type 'bogus'"),
    ("x", _set("shape", value=[-8]), "shape \\[-8\\], not a list of integers >= 0"),
    ("x", _set("shape", value="8"), "shape '8'"),
    ("x", _set("shape", value=[4]), "spec and mesh that do not fit its shape"),
    ("x", _set("chunk_grid", "configuration", "chunk_shape", value=[2]),
     "chunk shape \\[2\\] but its shards are \\[1\\]"),
    ("x", _set("chunk_grid", "configuration", "chunk_shape", value=[1, 1]),
     "chunk shape \\[1, 1\\] for shape \\[8\\]"),
    ("x", _set("chunk_key_encoding", "configuration", "separator", value="."),
     "not the regular chunk grid and default '/' chunk keys"),
    ("x", _set("codecs", value="bytes"), "codecs 'bytes'"),
    ("x", _set("codecs", 0, "configuration", value={"endian": "middle"}),
     "bytes codec configuration"),
    ("x", _set("attributes", "pathways", "spec", value=["q"]), "axis 'q'"),
    ("x", _set("attributes", "pathways", "spec", value=[7]), "spec \\[7\\]"),
    ("x", _set("attributes", "pathways", "mesh", value={"shape": [8]}), "mesh axes None"),
    ("x", _set("node_type", value="group"), "is not a Zarr v3 array"),
]


@pytest.mark.parametrize("where,change,problem", DAMAGED)
def test_damaged_metadata_is_refused_at_load_naming_the_file(client, tmp_path, where, change,
                                                              problem):
    mesh = client.mesh((8,), ("d",))
    a, _ = _two(client, tmp_path, mesh)
    _edit(a / where, change)
    file = str(a / where / "zarr.json").replace("//", "/")
    with pytest.raises(pw.CheckpointError, match=f"{re.escape(file)} .*{problem}"):
        client.load(a, mesh)  # at once, on the client: nothing was sent to a host


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b""])
def test_metadata_that_does_not_parse_is_refused(client, tmp_path, content):
    mesh = client.mesh((8,), ("d",))
    a, _ = _two(client, tmp_path, mesh)
    for node in (a / "x", a):
        (node / "zarr.json").write_bytes(content)
        with pytest.raises(pw.CheckpointError, match=re.escape(str(node / "zarr.json"))):
            client.load(a, mesh)
    os.remove(a / "zarr.json")
    with pytest.raises(pw.CheckpointError, match=r"metadata .*/a/zarr.json is missing"):
        client.load(a, mesh)


def test_metadata_that_is_not_a_file_is_refused_without_opening_it(client, tmp_path):
    mesh = client.mesh((8,), ("d",))
    a, _ = _two(client, tmp_path, mesh)
    os.remove(a / "x" / "zarr.json")
    os.mkfifo(a / "x" / "zarr.json")  # opening it would block
    with pytest.raises(pw.CheckpointError, match=r"/a/x/zarr.json is not a regular file"):
        client.load(a, mesh)


def test_metadata_changed_consistently_still_fails_its_checksum(client, tmp_path):
    """Shape, chunk shape and mesh all halved agree with each other: only the checksum of
    the metadata tells that the checkpoint no longer says what was written."""
    mesh = client.mesh((8,), ("d",))
    a, _ = _two(client, tmp_path, mesh)

    def halve(meta):
        meta["shape"] = [4]
        meta["attributes"]["pathways"]["mesh"]["shape"] = [4]

    _edit(a / "x", halve, reseal=False)
    with pytest.raises(pw.CheckpointError, match=r"/a/x/zarr.json does not match its checksum"):
        client.load(a, mesh)


# ---- a commit never replaces what it must not (issue 27) ------------------------------------

def test_of_two_saves_racing_without_overwrite_one_commits_and_the_other_fails(client,
                                                                               tmp_path):
    """Both pass the check at save() (nothing is there yet); the commit enforces it."""
    mesh = client.mesh((8,), ("d",))
    path = tmp_path / "c"
    saves = {v: client.save(path, client.put(np.full(8, v), mesh, P("d"))) for v in (1.0, 2.0)}
    won = []
    for v, s in saves.items():
        try:
            s.result(timeout=30)
            won.append(v)
        except FileExistsError as exc:
            assert "another save committed it meanwhile" in str(exc)
    assert len(won) == 1
    np.testing.assert_array_equal(client.load(path, mesh).result(timeout=30), np.full(8, won[0]))
    assert os.listdir(tmp_path) == ["c"]


def test_a_save_does_not_replace_an_empty_directory_made_meanwhile(client, tmp_path):
    mesh = client.mesh((8,), ("d",))
    slow = pw.shard_map(lambda v: v * 2.0, mesh, P("d"), P("d"), cost=0.3)
    saved = client.save(tmp_path / "c", slow(client.put(np.ones(8), mesh, P("d"))))
    os.mkdir(tmp_path / "c")  # before the commit: the array is still being computed
    with pytest.raises(FileExistsError, match="exists"):
        saved.result(timeout=30)
    assert os.listdir(tmp_path) == ["c"] and os.listdir(tmp_path / "c") == []


def _race(client, path, values, overwrite, threads) -> dict:
    """Save ``{"w": v, "i": v}`` for each of ``values`` from a thread each, all at once;
    each one's path or exception."""
    outcomes: dict = {}
    go = threading.Barrier(len(values))

    def save(i):
        go.wait(10)
        try:
            outcomes[i] = client.save(path, {"w": values[i], "i": values[i]},
                                      overwrite=overwrite).result(timeout=30)
        except Exception as exc:  # noqa: BLE001 - what failed, and how, is the test
            outcomes[i] = exc

    started = [threads(save, i) for i in values]
    for t in started:
        t.join(60)
    return outcomes


def _whole(client, path, mesh, values):
    back = _loads(client, path, mesh)
    assert back["w"][0, 0] in values and np.all(back["w"] == back["w"][0, 0])
    np.testing.assert_array_equal(back["i"], back["w"])  # one save's, whole
    return int(back["w"][0, 0])


@pytest.fixture(params=["renameat2", "fallback"])
def renames(request, monkeypatch):
    """Commits by renameat2, and as where it is missing (another OS, a file system without
    its flags): by plain renames."""
    from pathways.client import checkpoint

    if request.param == "fallback":
        monkeypatch.setattr(checkpoint, "_renameat2", lambda src, dst, flags: False)
    elif checkpoint._libc_renameat2() is None:
        pytest.skip("no renameat2 here")
    return request.param


def test_threads_racing_saves_without_overwrite_commit_exactly_one(client, tmp_path, threads,
                                                                   renames):
    mesh = client.mesh((2, 4), ("a", "b"))
    values = {i: client.put(np.full((4, 4), float(i)), mesh, P("a", "b")) for i in range(6)}
    for round in range(3):
        path = tmp_path / f"c{round}"
        outcomes = _race(client, path, values, False, threads)
        won = [i for i, o in outcomes.items() if isinstance(o, str)]
        assert len(won) == 1, outcomes
        assert all(isinstance(o, FileExistsError) for i, o in outcomes.items() if i not in won)
        assert _whole(client, path, mesh, values) == won[0]
    assert sorted(os.listdir(tmp_path)) == ["c0", "c1", "c2"]


def test_threads_racing_overwriting_saves_each_commit_whole(client, tmp_path, threads,
                                                             renames):
    mesh = client.mesh((2, 4), ("a", "b"))
    values = {i: client.put(np.full((4, 4), float(i)), mesh, P("a", "b")) for i in range(6)}
    path = tmp_path / "c"
    client.save(path, {"w": values[0], "i": values[0]}).result(timeout=30)
    stop, missing = threading.Event(), []

    def watch():  # once committed, the path is never missing, not even for an instant
        while not stop.is_set():
            if not os.path.exists(path):
                missing.append(True)

    threads(watch)
    try:
        for _ in range(3):
            outcomes = _race(client, path, values, True, threads)
            assert all(isinstance(o, str) for o in outcomes.values()), outcomes
            _whole(client, path, mesh, values)
    finally:
        stop.set()
    if renames == "renameat2":  # an exchange; plain renames leave a moment without it
        assert not missing
    assert os.listdir(tmp_path) == ["c"]


def test_hosts_in_other_processes_check_chunks_and_say_so_as_checkpoint_errors(
        pw_process_cluster, tmp_path):
    """The reader and its error cross the process boundary (pickled) intact."""
    with pw.connect(pw_process_cluster.address) as client:
        mesh = client.mesh((2, 4), ("a", "b"))
        value = np.arange(32.0).reshape(4, 8)
        client.save(tmp_path / "c", client.put(value, mesh, P("a", "b"))).result(timeout=30)
        np.testing.assert_array_equal(client.load(tmp_path / "c", mesh).result(timeout=30),
                                      value)
        chunk = tmp_path / "c" / "value" / "c" / "1" / "3"
        data = bytearray(chunk.read_bytes())
        data[0] ^= 1
        chunk.write_bytes(bytes(data))
        with pytest.raises(pw.CheckpointError, match=r"chunk .*/value/c/1/3 fails its CRC32C"):
            client.load(tmp_path / "c", mesh).result(timeout=30)
