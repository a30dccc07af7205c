"""Unit and property tests of partition specs (``pathways.program.sharding``). No threads, no I/O.

What is tested:

- ``P``: construction, repr, equality with tuples, pickling;
- ``normalize_spec``: padding, canonical entries, and the error for each kind of bad spec
  (unknown axis, axis used twice, too many entries, wrong entry type);
- ``shard_shape`` / ``global_shape_of`` / ``device_slices`` on the worked example of the
  module docstring, and the divisibility error;
- ``axis_group`` / ``axis_size`` on a 2 x 3 x 2 mesh by hand, and unknown axes;
- hypothesis, for random meshes (1-3 axes of sizes 1-4) and specs: split/assemble round trip,
  shard shapes agree with split, replicas hold equal blocks, distinct blocks tile the array,
  and axis groups partition the mesh with the position rule of the docstring.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.errors import ShardingError
from pathways.program.sharding import (
    P,
    assemble,
    axis_group,
    axis_size,
    device_slices,
    global_shape_of,
    normalize_spec,
    shard_shape,
    split,
)

MESH, NAMES = (2, 4), ("data", "model")


def test_p_repr_equality_and_pickle():
    assert repr(P("data", None)) == "P('data', None)"
    assert repr(P(("data", "model"))) == "P(('data', 'model'))"
    assert repr(P()) == "P()"
    assert P("data", None) == ("data", None)
    spec = P(("data", "model"), None)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and type(back) is P


def test_normalize_pads_and_canonicalizes():
    assert normalize_spec(None, 2, NAMES) == P(None, None)
    assert normalize_spec(P("data"), 3, NAMES) == P("data", None, None)
    assert normalize_spec(P(("model",), ()), 2, NAMES) == P("model", None)
    assert normalize_spec(("data", ["model"]), 2, NAMES) == P("data", "model")
    assert type(normalize_spec(("data",), 1, NAMES)) is P


@pytest.mark.parametrize(
    "spec, ndim, words",
    [
        (P("batch"), 1, ["'batch'", "('data', 'model')"]),
        (P(("data", "nope")), 1, ["'nope'", "('data', 'model')"]),
        (P("data", "data"), 2, ["'data'", "twice"]),
        (P(("model", "data"), "model"), 2, ["'model'", "twice"]),
        (P("data", None, None), 2, ["3 entries", "2 dimension"]),
        (P(3), 1, ["entry 0", "int"]),
        (P(None, ("data", 1)), 2, ["entry 1"]),
        ("data", 1, ["P(...)"]),
    ],
)
def test_normalize_errors_name_the_problem(spec, ndim, words):
    with pytest.raises(ShardingError) as info:
        normalize_spec(spec, ndim, NAMES)
    for word in words:
        assert word in str(info.value)


def test_worked_example():
    spec = P("data", None)
    assert shard_shape((4, 6), MESH, NAMES, spec) == (2, 6)
    assert global_shape_of((2, 6), MESH, NAMES, spec) == (4, 6)
    # Device 5 sits at (data=1, model=1): the second half of the rows, all the columns.
    assert device_slices((4, 6), MESH, NAMES, spec, 5) == (slice(2, 4), slice(0, 6))


def test_multi_axis_dimension_is_major_first():
    spec = P(("data", "model"))
    # Device (data=1, model=2) holds block 1 * 4 + 2 = 6 of 8.
    assert device_slices((16,), MESH, NAMES, spec, 6) == (slice(12, 14),)
    # Reversed order: block 2 * 2 + 1 = 5.
    assert device_slices((16,), MESH, NAMES, P(("model", "data")), 6) == (slice(10, 12),)


def test_not_divisible_names_dimension_size_and_axes():
    with pytest.raises(ShardingError) as info:
        shard_shape((4, 6), MESH, NAMES, P(None, ("data", "model")))
    msg = str(info.value)
    for word in ["dimension 1", "size 6", "8", "data", "model"]:
        assert word in msg


def test_bad_mesh_and_flat_index():
    with pytest.raises(ShardingError):
        shard_shape((4,), (2, 2), ("a",), P())
    with pytest.raises(ShardingError):
        shard_shape((4,), (2, 2), ("a", "a"), P())
    with pytest.raises(ShardingError):
        device_slices((4,), MESH, NAMES, P(), 8)
    with pytest.raises(ShardingError):
        assemble([np.zeros(2)] * 3, MESH, NAMES, P())


def test_an_abstract_mesh_has_jax_s_shape_and_device_objects():
    from pathways import Device, Mesh

    mesh = Mesh.abstract((2, 3), ("a", "b"))
    assert mesh.shape == {"a": 2, "b": 3} and mesh.axis_sizes == (2, 3)
    assert mesh.devices.shape == (2, 3)
    assert mesh.devices[1, 2] == Device(5, None, None, None)  # nothing known without a client
    assert mesh.device_ids.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ShardingError, match="needs 6 devices"):
        Mesh((2, 3), ("a", "b"), (0, 1, 2))
    with pytest.raises(ShardingError, match="distinct"):
        Mesh((2,), ("a",), (0, 0))


def test_axis_group_by_hand():
    mesh, names = (2, 3, 2), ("a", "b", "c")
    # Device 9 is at (1, 1, 1).
    assert axis_group(mesh, names, "b", 9) == ([7, 9, 11], 1)
    assert axis_group(mesh, names, ("a", "c"), 9) == ([2, 3, 8, 9], 3)
    assert axis_group(mesh, names, ("c", "a"), 9) == ([2, 8, 3, 9], 3)
    assert axis_group(mesh, names, (), 9) == ([9], 0)
    assert axis_size(mesh, names, ("a", "b")) == 6
    assert axis_size(mesh, names, "c") == 2


def test_axis_group_unknown_axis():
    with pytest.raises(ShardingError, match="'rows'.*'data', 'model'"):
        axis_group(MESH, NAMES, "rows", 0)
    with pytest.raises(ShardingError):
        axis_size(MESH, NAMES, ("data", "data"))


@st.composite
def meshes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    return shape, ("x", "y", "z")[: len(shape)]


@st.composite
def sharded_arrays(draw):
    """A mesh, a spec over it, and a global shape that the spec divides."""
    shape, names = draw(meshes())
    ndim = draw(st.integers(0, 3))
    unused = list(draw(st.permutations(names)))
    entries, global_shape = [], []
    for _ in range(ndim):
        take = draw(st.integers(0, len(unused)))
        axes, unused = tuple(unused[:take]), unused[take:]
        entries.append(axes[0] if len(axes) == 1 else (axes or None))
        parts = math.prod(shape[names.index(a)] for a in axes)
        global_shape.append(parts * draw(st.integers(0, 3)))
    # Sometimes leave trailing entries out: they mean None.
    cut = draw(st.integers(0, ndim))
    spec = P(*entries[:cut]) if all(e is None for e in entries[cut:]) else P(*entries)
    return shape, names, spec, tuple(global_shape)


@settings(max_examples=150, deadline=None)
@given(sharded_arrays())
def test_split_assemble_round_trip(case):
    mesh, names, spec, global_shape = case
    array = np.arange(math.prod(global_shape), dtype=np.int32).reshape(global_shape)
    shards = split(array, mesh, names, spec)
    assert len(shards) == math.prod(mesh)
    block = shard_shape(global_shape, mesh, names, spec)
    assert global_shape_of(block, mesh, names, spec) == global_shape
    for i, s in enumerate(shards):
        assert s.shape == block and s.flags.c_contiguous
        assert np.array_equal(s, array[device_slices(global_shape, mesh, names, spec, i)])
    s = shards[0]
    assert s.size == 0 or not np.shares_memory(s, array)
    assert np.array_equal(assemble(shards, mesh, names, spec), array)


@settings(max_examples=100, deadline=None)
@given(sharded_arrays())
def test_replicas_agree_and_blocks_tile(case):
    """Devices equal on the used axes hold one block; distinct blocks cover every element once."""
    mesh, names, spec, global_shape = case
    full = normalize_spec(spec, len(global_shape), names)
    used = [names.index(a) for e in full if e for a in ((e,) if isinstance(e, str) else e)]
    cover = np.zeros(global_shape, dtype=np.int64)
    blocks = {}
    for i in range(math.prod(mesh)):
        coords = np.unravel_index(i, mesh)
        where = device_slices(global_shape, mesh, names, spec, i)
        key = tuple(int(coords[a]) for a in used)
        if key in blocks:
            assert blocks[key] == where
        else:
            blocks[key] = where
            cover[where] += 1
    assert np.all(cover == 1)


@settings(max_examples=100, deadline=None)
@given(meshes(), st.data())
def test_axis_groups_partition_the_mesh(mesh_case, data):
    mesh, names = mesh_case
    axes = tuple(data.draw(st.permutations(names)))[: data.draw(st.integers(1, len(names)))]
    seen = {}
    for i in range(math.prod(mesh)):
        members, position = axis_group(mesh, names, axes, i)
        assert members[position] == i and len(members) == axis_size(mesh, names, axes)
        seen.setdefault(tuple(members), set()).add(i)
        coords = [np.unravel_index(j, mesh) for j in members]
        others = [k for k in range(len(mesh)) if names[k] not in axes]
        assert len({tuple(int(c[k]) for k in others) for c in coords}) == 1
        on_axes = [tuple(int(c[names.index(a)]) for a in axes) for c in coords]
        assert on_axes == sorted(on_axes)
    # Every device is in exactly one group, and its group is the same seen from every member.
    assert all(set(members) == devices for members, devices in seen.items())
    assert sum(len(d) for d in seen.values()) == math.prod(mesh)
