"""A checkpoint's metadata, read and validated on the client before anything is sent to a host.

Nothing read from disk is trusted: each zarr.json (``pathways.checkpoint_format`` describes the
files) must be a regular file of the checkpoint (no symlink) of a sane size, parse, and say
what a Pathways checkpoint says: node types, the tree's shape, array names that are one path
component matching their place in the tree, shapes, data types, codecs, chunk shapes equal to
the shard shape of the saved spec and mesh; and it must carry the CRC32C of its meaningful
content (``attributes["pathways"]["checksum"]``), so even consistent changes to a shape are
caught. Anything wrong raises ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

from . import checkpoint_format as fmt
from .errors import CheckpointError, ShardingError
from .program import sharding, tree

__all__ = ["ArrayInfo", "Checkpoint", "open_array", "open_checkpoint"]


@dataclass(frozen=True)
class ArrayInfo:
    """One array of a checkpoint, as its validated metadata describes it."""
    name: str
    shape: tuple
    dtype: str
    spec: tuple | None  # as saved: the default layout of ``load``
    layout: fmt.Layout | None  # None: stored with other codecs, read through zarr-python
    key: str | None = None  # saved from JAX PRNG keys: their impl (the array: their data)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's validated metadata: its tree and each array's description."""
    names: object  # the saved tree, each leaf its array's name
    arrays: dict  # name -> ArrayInfo


def open_checkpoint(path: str) -> Checkpoint:
    """Read and validate all of a checkpoint's metadata (plain JSON reads); raises
    FileNotFoundError if there is nothing at ``path``, else CheckpointError naming the file."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no Zarr node at {path} (no checkpoint directory)")
    file, meta = _read_json(path, path)
    _expect(isinstance(meta, dict) and meta.get("node_type") == "group"
            and meta.get("zarr_format") == 3, file, "is not a Zarr v3 group")
    ours = _pathways_attributes(meta, file)
    _expect(isinstance(ours, dict) and "tree" in ours, file, "is not a Pathways checkpoint"
            " (a Zarr group whose attributes name its tree)")
    _expect(type(ours.get("format")) is int and ours["format"] in (1, fmt.FORMAT), file,
            f"has format {ours.get('format')!r}; this version reads formats 1 to {fmt.FORMAT}")
    _check_seal(meta, ours, file, required=ours["format"] >= 2)
    names = _tree_names(ours["tree"], [], set(), file)
    return Checkpoint(names, {n: open_array(path, n) for n in tree.flatten(names)[0]})


def open_array(path: str, name: str) -> ArrayInfo:
    """Read and validate the metadata of array ``name`` of the checkpoint at ``path``."""
    fmt.check_name(name, f"checkpoint {path}")
    array_dir = os.path.join(path, name)
    fmt.check_own(path, array_dir)
    file, meta = _read_json(path, array_dir)
    _expect(isinstance(meta, dict) and meta.get("node_type") == "array"
            and meta.get("zarr_format") == 3, file, "is not a Zarr v3 array")
    shape = _ints(meta.get("shape"), file, "shape", 0)
    ours = _pathways_attributes(meta, file) or {}
    _expect(isinstance(ours, dict), file, "has pathways attributes that are not an object")
    dtype = _dtype(meta.get("data_type"), ours, file)
    layout = _layout(meta, file, shape, dtype)
    _check_seal(meta, ours, file, required=layout is not None and layout.checksum)
    spec = _saved_spec(ours, file, shape, layout)
    key = ours.get("prng_key")
    _expect(key is None or (isinstance(key, str) and dtype == "uint32" and shape), file,
            f"has prng_key {key!r}, not the name of an impl of keys saved as uint32 data")
    return ArrayInfo(name, shape, dtype, spec, layout, key)


def _dtype(data_type, ours: dict, file: str) -> str:
    """The name of the array's type: a Zarr core data type, or the ml_dtypes type our
    attributes name for one stored as raw bytes of its size (``checkpoint_format``)."""
    if isinstance(data_type, str) and data_type in fmt.ZARR_DTYPES:
        _expect("dtype" not in ours, file, f"has data_type {data_type!r} and names another"
                f" type {ours.get('dtype')!r}")
        return data_type
    name = ours.get("dtype")
    try:
        dtype = fmt.stored_dtype(name) if name is not None else None
    except CheckpointError:
        dtype = None
    _expect(dtype is not None and data_type == fmt.raw_data_type(dtype)
            and name not in fmt.ZARR_DTYPES, file, f"has data_type {data_type!r} (pathways"
            f" dtype {name!r}); a checkpoint holds {', '.join(fmt.ZARR_DTYPES)} or an ml_dtypes"
            " type as raw bytes of its size")
    return name


def _expect(ok, file: str, problem: str) -> None:
    if not ok:
        raise CheckpointError(f"checkpoint metadata {file} {problem}")


def _read_json(root: str, node: str) -> tuple[str, object]:
    """The zarr.json of ``node``, parsed once it is known to be a regular file of the
    checkpoint of a sane size (a FIFO would block, a huge file take all memory)."""
    file = os.path.join(node, "zarr.json")
    fmt.check_own(root, file)
    try:
        st = os.stat(file)
        _expect(stat.S_ISREG(st.st_mode) and st.st_size <= fmt.MAX_METADATA, file, "is not a"
                f" regular file of at most {fmt.MAX_METADATA} bytes")
        with open(file, "rb") as f:
            return file, json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint metadata {file} is missing") from None
    except (ValueError, RecursionError, OSError) as exc:
        raise CheckpointError(f"checkpoint metadata {file} cannot be read: {exc}") from None


def _pathways_attributes(meta: dict, file: str):
    attributes = meta.get("attributes", {})
    _expect(isinstance(attributes, dict), file, "has attributes that are not an object")
    return attributes.get("pathways")


def _check_seal(meta: dict, ours: dict, file: str, required: bool) -> None:
    """A zarr.json that carries a checksum must match it; one that must carry one does."""
    if "checksum" not in ours:
        _expect(not required, file, "has no metadata checksum (attributes.pathways.checksum)")
        return
    _expect(ours["checksum"] == fmt.digest(meta), file, "does not match its checksum: it was"
            " changed or damaged since it was written")


def _ints(value, file: str, what: str, minimum: int) -> tuple:
    _expect(isinstance(value, list) and all(type(v) is int and v >= minimum for v in value),
            file, f"has {what} {value!r}, not a list of integers >= {minimum}")
    return tuple(value)


def _tree_names(node, at: list, seen: set, file: str):
    """The tree a checkpoint's structure describes, each leaf its array's name, checked: every
    node one of array/dict/tuple/list, every array named after its place in the tree."""
    _expect(isinstance(node, dict) and len(node) == 1, file, f"has a tree node {node!r} at"
            f" {at}, not one of {{'array'|'dict'|'tuple'|'list'|'none': ...}}")
    (kind, value), = node.items()
    if kind == "none":
        _expect(value is None, file, f"has a none node at {at} holding {value!r}")
        return None
    if kind == "array":
        fmt.check_name(value, f"checkpoint metadata {file}")
        _expect(value == fmt.leaf_name(at) and value not in seen, file, f"names the array at {at}"
                f" {value!r}; it is {fmt.leaf_name(at)!r}")
        seen.add(value)
        return value
    _expect(kind in ("dict", "tuple", "list") and isinstance(value, list), file,
            f"has a tree node {kind!r} at {at} that is not a dict, tuple or list of nodes")
    if kind != "dict":
        children = [_tree_names(c, [*at, i], seen, file) for i, c in enumerate(value)]
        return tuple(children) if kind == "tuple" else children
    out = {}
    for pair in value:
        _expect(isinstance(pair, list) and len(pair) == 2 and fmt.valid_key(pair[0])
                and pair[0] not in out, file, f"has a dict entry {pair!r} at {at}, not a"
                " [key, node] pair with a new key that can name an array")
        out[pair[0]] = _tree_names(pair[1], [*at, pair[0]], seen, file)
    _expect(len({type(k) for k in out}) <= 1, file, f"has a dict at {at} whose keys mix str"
            " and int (they cannot be ordered)")
    return out


def _layout(meta: dict, file: str, shape: tuple, dtype: str) -> fmt.Layout | None:
    """The layout of an array Pathways wrote ("bytes", then "crc32c" from format 2 on), or
    None for one stored otherwise (read through zarr-python)."""
    codecs = meta.get("codecs")
    _expect(isinstance(codecs, list) and codecs and all(isinstance(c, dict) for c in codecs),
            file, f"has codecs {codecs!r}, not a list of codec objects")
    names = [c.get("name") for c in codecs]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        return None
    grid, keys = meta.get("chunk_grid"), meta.get("chunk_key_encoding")
    plain = (isinstance(grid, dict) and grid.get("name") == "regular"
             and isinstance(grid.get("configuration"), dict)
             and isinstance(keys, dict) and keys.get("name") == "default"
             and keys.get("configuration", {}) in ({}, {"separator": "/"})
             and not meta.get("storage_transformers"))
    if not plain:  # only Pathways' own writes carry crc32c: they are always plain
        _expect(names == ["bytes"], file, "has codecs bytes, crc32c but not the regular chunk"
                " grid and default '/' chunk keys Pathways writes")
        return None
    chunk = _ints(grid["configuration"].get("chunk_shape"), file, "chunk shape", 1)
    _expect(len(chunk) == len(shape), file, f"has chunk shape {list(chunk)} for shape"
            f" {list(shape)}")
    config = codecs[0].get("configuration", {})
    _expect(isinstance(config, dict) and set(config) <= {"endian"}
            and config.get("endian", "little") in ("little", "big"), file,
            f"has a bytes codec configuration {config!r}")
    _expect(all(set(c) <= {"name", "configuration"} for c in codecs)
            and all(c.get("configuration") in (None, {}) for c in codecs[1:]),
            file, f"has codecs {codecs!r}")
    endian = config.get("endian", "little")
    _expect(endian == "little" or dtype in fmt.ZARR_DTYPES, file, f"stores {dtype} as raw"
            " bytes with a big-endian bytes codec: raw bytes are little-endian bits")
    return fmt.Layout(shape, dtype, chunk, "<" if endian == "little" else ">", len(codecs) == 2)


def _saved_spec(ours: dict, file: str, shape: tuple, layout: fmt.Layout | None):
    """The spec an array was saved with, checked against its saved mesh and chunk shape."""
    if "spec" not in ours:
        return None
    entries = ours["spec"]
    _expect(isinstance(entries, list) and len(entries) == len(shape) and all(
        e is None or isinstance(e, str) or (isinstance(e, list) and all(
            isinstance(a, str) for a in e)) for e in entries), file,
        f"has spec {entries!r}, not one entry (null, an axis or a list of axes) per dimension")
    spec = fmt.decode_spec(entries)
    if "mesh" not in ours:
        return spec
    mesh = ours["mesh"]
    _expect(isinstance(mesh, dict), file, f"has mesh {mesh!r}, not an object")
    sizes = _ints(mesh.get("shape"), file, "mesh shape", 1)
    axes = mesh.get("axes")
    try:
        _expect(isinstance(axes, list), file, f"has mesh axes {axes!r}, not a list")
        sizes, axes = sharding.check_mesh(sizes, axes)
        block = sharding.shard_shape(shape, sizes, axes,
                                     sharding.normalize_spec(spec, len(shape), axes))
    except ShardingError as exc:
        raise CheckpointError(f"checkpoint metadata {file} has a spec and mesh that do not"
                              f" fit its shape {list(shape)}: {exc}") from None
    expected = tuple(max(1, b) for b in block)
    _expect(layout is None or layout.chunk == expected, file, f"has chunk shape"
            f" {list(layout.chunk if layout else ())} but its shards are {list(expected)}")
    return spec
