"""Partition specs: which part of a global array each device of a mesh holds. No I/O.

A mesh has a shape such as (2, 4) and axis names such as ("data", "model"); its devices are
numbered by their row-major *flat index*, so device 5 of that mesh sits at coordinates (1, 1).
A partition spec ``P(...)`` has one entry per array dimension: ``None`` (the dimension is not
split), an axis name, or a tuple of axis names (the dimension is split over those axes, the
first one major). Mesh axes the spec does not name replicate the array.

Worked example: a (4, 6) array on the mesh above with ``P("data", None)``. Dimension 0 is split
in 2 along "data"; "model" is unused, so the 4 devices of one "data" row all hold the same
(2, 6) block: device 5 (data=1, model=1) holds rows 2..4. With ``P(None, ("data", "model"))``
dimension 1 would need 2 * 4 = 8 blocks, and 6 is not divisible by 8: a ShardingError.

A dimension split over axes (a, b) is cut into size(a) * size(b) equal blocks, and the device at
coordinates (ca, cb) holds block ``ca * size(b) + cb``: the same row-major rule as flat indices.

JAX's ``jax.sharding.PartitionSpec`` means the same and is taken wherever a ``P`` is: the edges
that take specs (``normalize_spec``, ``shard_map``, ``NamedSharding``) convert it with
``as_spec``. JAX is never imported here: only a program that has imported it can hold one of
its specs.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import ShardingError

__all__ = [
    "P",
    "as_spec",
    "assemble",
    "axis_group",
    "axis_size",
    "check_mesh",
    "device_slices",
    "global_shape_of",
    "is_jax_spec",
    "normalize_spec",
    "shard_shape",
    "split",
]


class P(tuple):
    """A partition spec: ``P("data", None)``, ``P(("data", "model"))``, ``P()``. JAX's
    ``jax.sharding.PartitionSpec`` is taken wherever a P is, with the same meaning.

    >>> P("data", None)          # dimension 0 split over "data", dimension 1 whole
    >>> P(("data", "model"))     # dimension 0 split over both axes, "data" major
    >>> x = client.put(np.ones((8, 4)), mesh, P())     # P(): a full copy on every device
    """

    def __new__(cls, *entries):
        return super().__new__(cls, entries)

    def __getnewargs__(self):
        # tuple's own __getnewargs__ returns (tuple(self),), which __new__ would wrap once more.
        return tuple(self)

    def __repr__(self) -> str:
        return "P(" + ", ".join(repr(e) for e in self) + ")"


def is_jax_spec(obj) -> bool:
    """Whether ``obj`` is JAX's ``PartitionSpec`` (False, importing nothing, if JAX is not
    loaded: then nothing can be one)."""
    sharding = getattr(sys.modules.get("jax"), "sharding", None)
    jax_spec = getattr(sharding, "PartitionSpec", None)
    return jax_spec is not None and isinstance(obj, jax_spec)


def as_spec(spec):
    """``spec`` as a ``P`` if it is JAX's ``PartitionSpec`` (same entries: None, an axis name,
    a tuple of names; ``PartitionSpec()`` is ``P()``); anything else unchanged.

    JAX's ``PartitionSpec.UNCONSTRAINED`` (let the compiler choose) and its unreduced or
    reduced axes have no meaning here: a ShardingError says so.
    """
    if not is_jax_spec(spec):
        return spec
    if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
        raise ShardingError(f"partition spec {spec!r} has unreduced or reduced axes, which"
                            " pathways does not have: name the axes a dimension is split over,"
                            " and sum partial values in the body (pw.psum)")
    entries = tuple(getattr(spec, "partitions", spec))
    unconstrained = getattr(type(spec), "UNCONSTRAINED", None)
    for i, entry in enumerate(entries):
        if unconstrained is not None and entry is unconstrained:
            raise ShardingError(
                f"entry {i} of partition spec {spec!r} is PartitionSpec.UNCONSTRAINED, which"
                " lets JAX's compiler choose; pathways places every dimension as its spec"
                " says: give None (not split) or the mesh axes to split it over")
    return P(*entries)


def check_mesh(mesh_shape, axis_names) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Validate a mesh and return it as (shape tuple, names tuple)."""
    shape, names = tuple(mesh_shape), tuple(axis_names)
    if len(shape) != len(names):
        raise ShardingError(f"mesh shape {shape} has {len(shape)} axes but names {names}")
    for size in shape:
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
            raise ShardingError(f"mesh shape {shape}: every axis size must be an int >= 1")
    for name in names:
        if not isinstance(name, str):
            raise ShardingError(f"mesh axis names {names}: every name must be a str")
    if len(set(names)) != len(names):
        raise ShardingError(f"mesh axis names {names} repeat a name")
    return tuple(int(s) for s in shape), names


def normalize_spec(spec, ndim: int, axis_names) -> P:
    """Check ``spec`` against an ndim-dimensional array and a mesh; pad it with None to ndim.

    ``None`` means ``P()``. Entries come back canonical: ``()`` becomes None and a one-name
    tuple becomes the bare name, so equal shardings compare equal.
    """
    names = tuple(axis_names)
    spec = P() if spec is None else as_spec(spec)
    if not isinstance(spec, (tuple, list)):
        raise ShardingError(f"a partition spec must be P(...) (or JAX's PartitionSpec), got"
                            f" {spec!r} ({type(spec).__name__})")
    spec = P(*spec)
    if len(spec) > ndim:
        raise ShardingError(
            f"partition spec {spec!r} has {len(spec)} entries but the array has only "
            f"{ndim} dimension(s)"
        )
    entries, used = [], set()
    for i, entry in enumerate(spec):
        axes = _entry_axes(spec, i, entry)
        for name in axes:
            if name not in names:
                raise ShardingError(
                    f"partition spec {spec!r} names mesh axis {name!r}, but the mesh's axes "
                    f"are {names}"
                )
            if name in used:
                raise ShardingError(
                    f"partition spec {spec!r} uses mesh axis {name!r} twice; a mesh axis can "
                    "split at most one dimension"
                )
            used.add(name)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return P(*entries, *([None] * (ndim - len(entries))))


def spec_for(aval, spec, axis_names) -> P:
    """``normalize_spec`` for an array of ``aval`` (an ``Aval``): a key array's spec names its
    keys' dimensions only, and comes back padded over its key data's (``prng``)."""
    if aval.key is None:
        return normalize_spec(spec, len(aval.shape), axis_names)
    keys = normalize_spec(spec, len(aval.logical_shape), axis_names)
    return P(*keys, *([None] * (len(aval.shape) - len(keys))))


def _entry_axes(spec: P, i: int, entry) -> tuple[str, ...]:
    """The axis names of entry i of ``spec``, or a ShardingError naming the bad entry."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)) and all(isinstance(n, str) for n in entry):
        return tuple(entry)
    raise ShardingError(
        f"entry {i} of partition spec {spec!r} is {entry!r} ({type(entry).__name__}); each "
        "entry must be None, a mesh axis name or a tuple of mesh axis names"
    )


def _dims(global_ndim, mesh_shape, axis_names, spec) -> list[tuple[int, ...]]:
    """For each array dimension, the mesh axis numbers splitting it (major first)."""
    _, names = check_mesh(mesh_shape, axis_names)
    spec = normalize_spec(spec, global_ndim, names)
    return [tuple(names.index(n) for n in _entry_axes(spec, i, e)) for i, e in enumerate(spec)]


def shard_shape(global_shape, mesh_shape, axis_names, spec) -> tuple[int, ...]:
    """The shape of the block each device holds of an array of ``global_shape``."""
    global_shape = tuple(int(d) for d in global_shape)
    dims = _dims(len(global_shape), mesh_shape, axis_names, spec)
    out = []
    for d, (size, axes) in enumerate(zip(global_shape, dims)):
        parts = math.prod(mesh_shape[a] for a in axes)
        if size % parts:
            axis_desc = " x ".join(f"{axis_names[a]}={mesh_shape[a]}" for a in axes)
            raise ShardingError(
                f"dimension {d} of shape {global_shape} has size {size}, which is not divisible "
                f"by {parts}, the number of blocks of mesh axes {axis_desc}"
            )
        out.append(size // parts)
    return tuple(out)


def global_shape_of(shard_shape, mesh_shape, axis_names, spec) -> tuple[int, ...]:
    """The global shape whose blocks have ``shard_shape`` (the inverse of ``shard_shape``)."""
    shard_shape = tuple(int(d) for d in shard_shape)
    dims = _dims(len(shard_shape), mesh_shape, axis_names, spec)
    return tuple(s * math.prod(mesh_shape[a] for a in axes) for s, axes in zip(shard_shape, dims))


def _coords(mesh_shape, flat_index: int) -> tuple[int, ...]:
    """Row-major coordinates of a flat index."""
    n = math.prod(mesh_shape)
    if not 0 <= flat_index < n:
        raise ShardingError(f"flat index {flat_index} is outside a mesh of {n} device(s)")
    coords = []
    for size in reversed(mesh_shape):
        flat_index, c = divmod(flat_index, size)
        coords.append(c)
    return tuple(reversed(coords))


def _ravel(coords, sizes) -> int:
    """Row-major flat index of ``coords`` in a box of ``sizes``."""
    index = 0
    for c, size in zip(coords, sizes):
        index = index * size + c
    return index


class Part(NamedTuple):
    """A distinct part of a global array: where it lies, and the mesh positions holding it."""

    slices: tuple[slice, ...]
    holders: tuple[int, ...]


def distinct_parts(global_shape, mesh_shape, axis_names, spec) -> tuple[Part, ...]:
    """Each distinct part of the global array (replicas share one), in order of their first
    holder: a part is read from one of its holders. Worked out once per layout."""
    return _parts(tuple(global_shape), tuple(mesh_shape), tuple(axis_names), P(*spec))


@functools.lru_cache(maxsize=1024)
def _parts(global_shape, mesh_shape, axis_names, spec) -> tuple[Part, ...]:
    parts: dict[tuple, tuple] = {}
    for i in range(math.prod(mesh_shape)):
        sl = device_slices(global_shape, mesh_shape, axis_names, spec, i)
        key = tuple((s.start, s.stop) for s in sl)
        parts[key] = (parts[key][0], parts[key][1] + (i,)) if key in parts else (sl, (i,))
    return tuple(Part(sl, holders) for sl, holders in parts.values())


def device_slices(global_shape, mesh_shape, axis_names, spec, flat_index) -> tuple[slice, ...]:
    """The part of the global array that device ``flat_index`` holds, one slice per dimension."""
    block = shard_shape(global_shape, mesh_shape, axis_names, spec)
    dims = _dims(len(block), mesh_shape, axis_names, spec)
    coords = _coords(tuple(mesh_shape), flat_index)
    slices = []
    for size, axes in zip(block, dims):
        k = _ravel([coords[a] for a in axes], [mesh_shape[a] for a in axes])
        slices.append(slice(k * size, (k + 1) * size))
    return tuple(slices)


def split(array, mesh_shape, axis_names, spec) -> list[np.ndarray]:
    """Cut ``array`` into one contiguous copy per device, in flat-index order."""
    array = np.asarray(array)
    n = math.prod(check_mesh(mesh_shape, axis_names)[0])
    return [
        np.array(array[device_slices(array.shape, mesh_shape, axis_names, spec, i)], order="C")
        for i in range(n)
    ]


def assemble(shards: Sequence, mesh_shape, axis_names, spec) -> np.ndarray:
    """Rebuild the global array from per-device blocks (the inverse of ``split``).

    Where blocks are replicated, the lowest flat index's copy is used; the others are not read.
    """
    mesh_shape, axis_names = check_mesh(mesh_shape, axis_names)
    n = math.prod(mesh_shape)
    if len(shards) != n:
        raise ShardingError(f"assemble got {len(shards)} shards for a mesh of {n} devices")
    shards = [np.asarray(s) for s in shards]
    block = shards[0].shape
    for i, s in enumerate(shards):
        if s.shape != block:
            raise ShardingError(f"shard {i} has shape {s.shape} but shard 0 has {block}")
    global_shape = global_shape_of(block, mesh_shape, axis_names, spec)
    out = np.empty(global_shape, dtype=shards[0].dtype)
    filled = set()
    for i, s in enumerate(shards):
        where = device_slices(global_shape, mesh_shape, axis_names, spec, i)
        key = tuple(sl.start for sl in where)
        if key not in filled:
            filled.add(key)
            out[where] = s
    return out


def _axis_numbers(axis_names, axes) -> tuple[int, ...]:
    """Mesh axis numbers of an axis name or tuple of names, checked known and distinct."""
    names = tuple(axis_names)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    for name in axes:
        if name not in names:
            raise ShardingError(f"unknown mesh axis {name!r}; the mesh's axes are {names}")
    if len(set(axes)) != len(axes):
        raise ShardingError(f"mesh axes {axes} repeat a name")
    return tuple(names.index(name) for name in axes)


def axis_size(mesh_shape, axis_names, axes) -> int:
    """The number of devices along ``axes`` (an axis name or a tuple of names)."""
    mesh_shape, axis_names = check_mesh(mesh_shape, axis_names)
    return math.prod(mesh_shape[a] for a in _axis_numbers(axis_names, axes))


def axis_group(mesh_shape, axis_names, axes, flat_index) -> tuple[list[int], int]:
    """The devices a collective over ``axes`` joins device ``flat_index`` with.

    Returns the flat indices of the devices sharing ``flat_index``'s coordinates on every
    other axis, ordered by their coordinates on ``axes`` (the first axis given major), and
    ``flat_index``'s position in that list.
    """
    mesh_shape, axis_names = check_mesh(mesh_shape, axis_names)
    numbers = _axis_numbers(axis_names, axes)
    coords = list(_coords(mesh_shape, flat_index))
    members = []
    for group_coords in itertools.product(*(range(mesh_shape[a]) for a in numbers)):
        for a, c in zip(numbers, group_coords):
            coords[a] = c
        members.append(_ravel(coords, mesh_shape))
    return members, members.index(flat_index)
