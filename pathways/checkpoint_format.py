"""The checkpoint format: a Zarr v3 group with one array per leaf of a tree, chunked by shard.

A checkpoint of ``{"w": w, "opt": (m, v)}`` is a directory::

    ckpt/zarr.json            group; attributes["pathways"] = format, the tree's structure
    ckpt/w/zarr.json          array: shape, dtype, chunk shape = w's shard shape,
                              codecs "bytes" then "crc32c"; attributes["pathways"] = spec, mesh
    ckpt/w/c/0/0 ...          one chunk per distinct shard, written by the host that holds it
    ckpt/opt.0/...  ckpt/opt.1/...

The client writes the metadata (with ``zarr``); hosts write and read chunks. Every array here is
stored with the Zarr codecs "bytes" (little-endian, no compression) and "crc32c", so a chunk file
is exactly a shard's bytes in C order followed by the 4-byte little-endian CRC32C of those bytes:
hosts write and read them with plain file I/O, which costs the disk's speed and not zarr-python's
encode path (3-4x slower when measured here), and any Zarr v3 reader (zarr-python, TensorStore)
opens a checkpoint and verifies the checksums. An array stored with other codecs (written by
another tool) is read through ``zarr``; checkpoints of format 1 (codec "bytes" alone, no
checksums) still load.

Nothing read from disk is trusted (``open_checkpoint``, on the client, before anything is sent
to a host): each zarr.json must parse and say what a Pathways checkpoint says (node types, the
tree's shape, array names that are one path component matching their place in the tree, shapes,
data types, chunk shapes equal to the shard shape of the saved spec and mesh), and carry the
CRC32C of its meaningful content (``attributes["pathways"]["checksum"]``), so even consistent
changes to a shape are caught. Each host then checks every chunk it reads: it exists, is a
regular file of this checkpoint (no symlink), has exactly its size (checked before reading) and
its checksum. Anything wrong raises ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
import sys
from dataclasses import dataclass

import numpy as np

from .errors import CheckpointError, ProgramError, ShardingError
from .program import sharding, tree

__all__ = ["FORMAT", "ZARR_DTYPES", "ArrayInfo", "Checkpoint", "ChunkReader",
           "Layout", "check_dtype", "check_name", "chunk_file", "create", "decode_spec",
           "encode_spec", "leaf_name", "open_array", "open_checkpoint", "require_zarr",
           "seal", "valid_key", "write_chunk"]

# numpy kinds with a Zarr v3 core data type of the same name
ZARR_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
               "uint64", "float16", "float32", "float64", "complex64", "complex128")
FORMAT = 2  # 2: chunks carry crc32c and metadata a checksum; 1: codec "bytes" alone
CRC_BYTES = 4
BLOCK = 4 << 20  # bytes read or written, and checksummed, at a time
MAX_METADATA = 64 << 20  # bytes of one zarr.json: a tree of a million arrays fits


def require_zarr():
    try:
        import zarr
    except ImportError:
        raise ImportError("checkpoints need the zarr package: pip install"
                          " 'pathways-open[zarr]'") from None
    return zarr


def _crc32c(data, crc: int = 0) -> int:
    """CRC32C of a bytes-like (a numpy array included) continuing ``crc``, by
    google_crc32c's C implementation."""
    try:
        import google_crc32c
    except ImportError:
        raise ImportError("checkpoints need the google-crc32c package: pip install"
                          " 'pathways-open[zarr]'") from None
    return google_crc32c.extend(crc, data)


def check_dtype(dtype, what: str) -> None:
    if np.dtype(dtype).name not in ZARR_DTYPES:
        raise ProgramError(f"{what}: dtype {np.dtype(dtype)} has no Zarr v3 data type; a"
                           f" checkpoint holds {', '.join(ZARR_DTYPES)}")


def check_name(name, what: str) -> None:
    """An array's name must be one path component of the checkpoint's own directory."""
    if not isinstance(name, str) or name in ("", ".", "..", "zarr.json") or "/" in name \
            or "\\" in name or "\0" in name or name.startswith("__"):
        raise CheckpointError(f"{what}: array name {name!r} is not one path component of the"
                              " checkpoint (no '/', '..', '.', 'zarr.json', leading '__' or"
                              " empty name)")


def valid_key(key) -> bool:
    """Whether a dict key can be part of an array's name: a str or int without '/' or '.',
    not empty and not starting with '__' (Zarr reserves that)."""
    return isinstance(key, (str, int)) and not isinstance(key, bool) and "/" not in str(key) \
        and "." not in str(key) and not str(key).startswith("__") and str(key) != ""


def leaf_name(at) -> str:
    """The array name of the leaf at path ``at`` (dict keys and sequence indices) in a tree."""
    return ".".join(map(str, at)) or "value"


def encode_spec(spec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def decode_spec(entries) -> tuple:
    return tuple(tuple(e) if isinstance(e, list) else e for e in entries)


# ---- writing --------------------------------------------------------------------------------

def create(path: str, structure, arrays: list[tuple]) -> None:
    """Write the metadata of a checkpoint at ``path`` (which must not exist): the group with
    ``structure`` and, for each ``(name, shape, dtype, chunks, attributes)``, an empty array;
    then seal each zarr.json with the checksum of its content."""
    zarr = require_zarr()
    group = zarr.open_group(store=path, mode="w-", zarr_format=3, attributes={
        "pathways": {"format": FORMAT, "tree": structure}})
    for name, shape, dtype, chunks, attributes in arrays:
        check_name(name, "save")
        group.create_array(name, shape=shape, chunks=tuple(max(1, c) for c in chunks),
                           dtype=np.dtype(dtype), compressors=[zarr.codecs.Crc32cCodec()],
                           filters=None, attributes={"pathways": attributes})
    for node in [path, *(os.path.join(path, a[0]) for a in arrays)]:
        seal(node)


def _digest(meta: dict) -> str:
    """CRC32C of what a zarr.json says that matters: all but attributes other than ours."""
    body = {k: v for k, v in meta.items() if k != "attributes"}
    body["pathways"] = {k: v for k, v in meta["attributes"]["pathways"].items()
                        if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return f"{_crc32c(text.encode()):08x}"


def seal(node: str) -> None:
    """Write the checksum of the content of the zarr.json of ``node`` into it."""
    file = os.path.join(node, "zarr.json")
    with open(file) as f:
        meta = json.load(f)
    meta["attributes"]["pathways"]["checksum"] = _digest(meta)
    with open(file, "w") as f:
        json.dump(meta, f, indent=2)


def chunk_file(array_dir: str, index) -> str:
    """The file of chunk ``index`` under Zarr v3's default chunk key encoding."""
    return os.path.join(array_dir, "c", *map(str, index))


def write_chunk(array_dir: str, index, value: np.ndarray) -> None:
    """Write one chunk (a whole shard) durably: its little-endian bytes and their CRC32C
    (Zarr's crc32c codec), then fsync."""
    value = np.ascontiguousarray(value)
    if value.dtype.byteorder == ">" or (value.dtype.byteorder == "=" and sys.byteorder == "big"):
        value = value.astype(value.dtype.newbyteorder("<"))
    raw = value.reshape(-1).view(np.uint8)
    path = chunk_file(array_dir, index)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    crc = 0
    with open(path, "wb") as f:
        for start in range(0, raw.size, BLOCK):  # the checksum of a block still in cache
            block = raw[start:start + BLOCK]
            crc = _crc32c(block, crc)
            f.write(memoryview(block))
        f.write(crc.to_bytes(CRC_BYTES, "little"))
        f.flush()
        os.fsync(f.fileno())


# ---- reading and validating metadata (on the client) ----------------------------------------

@dataclass(frozen=True)
class Layout:
    """How a Pathways-written array's chunks sit on disk: what a host needs to read them."""
    shape: tuple
    dtype: str
    chunk: tuple
    endian: str  # "<" or ">"
    checksum: bool  # chunks end with their CRC32C


@dataclass(frozen=True)
class ArrayInfo:
    name: str
    shape: tuple
    dtype: str
    spec: tuple | None  # as saved: the default layout of ``load``
    layout: Layout | None  # None: stored with other codecs, read through zarr-python


@dataclass(frozen=True)
class Checkpoint:
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
    _expect(type(ours.get("format")) is int and ours["format"] in (1, FORMAT), file,
            f"has format {ours.get('format')!r}; this version reads formats 1 to {FORMAT}")
    _check_seal(meta, ours, file, required=ours["format"] >= 2)
    names = _tree_names(ours["tree"], [], set(), file)
    return Checkpoint(names, {n: open_array(path, n) for n in tree.flatten(names)[0]})


def open_array(path: str, name: str) -> ArrayInfo:
    """Read and validate the metadata of array ``name`` of the checkpoint at ``path``."""
    check_name(name, f"checkpoint {path}")
    array_dir = os.path.join(path, name)
    _own(path, array_dir)
    file, meta = _read_json(path, array_dir)
    _expect(isinstance(meta, dict) and meta.get("node_type") == "array"
            and meta.get("zarr_format") == 3, file, "is not a Zarr v3 array")
    shape = _ints(meta.get("shape"), file, "shape", 0)
    dtype = meta.get("data_type")
    _expect(isinstance(dtype, str) and dtype in ZARR_DTYPES, file, f"has data_type {dtype!r};"
            f" a checkpoint holds {', '.join(ZARR_DTYPES)}")
    ours = _pathways_attributes(meta, file) or {}
    _expect(isinstance(ours, dict), file, "has pathways attributes that are not an object")
    layout = _layout(meta, file, shape, dtype)
    _check_seal(meta, ours, file, required=layout is not None and layout.checksum)
    spec = _saved_spec(ours, file, shape, layout)
    return ArrayInfo(name, shape, dtype, spec, layout)


def _expect(ok, file: str, problem: str) -> None:
    if not ok:
        raise CheckpointError(f"checkpoint metadata {file} {problem}")


def _own(root: str, path: str) -> None:
    """``path`` (under ``root``) must be the checkpoint's own: no symlink on the way to it."""
    real = os.path.realpath(path)
    if real != os.path.join(os.path.realpath(root), os.path.relpath(path, root)):
        raise CheckpointError(f"{path} leads to {real}: a checkpoint's files must be its own"
                              " (no symlinks)")


def _read_json(root: str, node: str) -> tuple[str, object]:
    """The zarr.json of ``node``, parsed once it is known to be a regular file of the
    checkpoint of a sane size (a FIFO would block, a huge file take all memory)."""
    file = os.path.join(node, "zarr.json")
    _own(root, file)
    try:
        st = os.stat(file)
        _expect(stat.S_ISREG(st.st_mode) and st.st_size <= MAX_METADATA, file, "is not a"
                f" regular file of at most {MAX_METADATA} bytes")
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
    _expect(ours["checksum"] == _digest(meta), file, "does not match its checksum: it was"
            " changed or damaged since it was written")


def _ints(value, file: str, what: str, minimum: int) -> tuple:
    _expect(isinstance(value, list) and all(type(v) is int and v >= minimum for v in value),
            file, f"has {what} {value!r}, not a list of integers >= {minimum}")
    return tuple(value)


def _tree_names(node, at: list, seen: set, file: str):
    """The tree a checkpoint's structure describes, each leaf its array's name, checked: every
    node one of array/dict/tuple/list, every array named after its place in the tree."""
    _expect(isinstance(node, dict) and len(node) == 1, file, f"has a tree node {node!r} at"
            f" {at}, not one of {{'array'|'dict'|'tuple'|'list': ...}}")
    (kind, value), = node.items()
    if kind == "array":
        check_name(value, f"checkpoint metadata {file}")
        _expect(value == leaf_name(at) and value not in seen, file, f"names the array at {at}"
                f" {value!r}; it is {leaf_name(at)!r}")
        seen.add(value)
        return value
    _expect(kind in ("dict", "tuple", "list") and isinstance(value, list), file,
            f"has a tree node {kind!r} at {at} that is not a dict, tuple or list of nodes")
    if kind != "dict":
        children = [_tree_names(c, [*at, i], seen, file) for i, c in enumerate(value)]
        return tuple(children) if kind == "tuple" else children
    out = {}
    for pair in value:
        _expect(isinstance(pair, list) and len(pair) == 2 and valid_key(pair[0])
                and pair[0] not in out, file, f"has a dict entry {pair!r} at {at}, not a"
                " [key, node] pair with a new key that can name an array")
        out[pair[0]] = _tree_names(pair[1], [*at, pair[0]], seen, file)
    _expect(len({type(k) for k in out}) <= 1, file, f"has a dict at {at} whose keys mix str"
            " and int (they cannot be ordered)")
    return out


def _layout(meta: dict, file: str, shape: tuple, dtype: str) -> Layout | None:
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
    return Layout(shape, dtype, chunk, "<" if endian == "little" else ">", len(codecs) == 2)


def _saved_spec(ours: dict, file: str, shape: tuple, layout: Layout | None):
    """The spec an array was saved with, checked against its saved mesh and chunk shape."""
    if "spec" not in ours:
        return None
    entries = ours["spec"]
    _expect(isinstance(entries, list) and len(entries) == len(shape) and all(
        e is None or isinstance(e, str) or (isinstance(e, list) and all(
            isinstance(a, str) for a in e)) for e in entries), file,
        f"has spec {entries!r}, not one entry (null, an axis or a list of axes) per dimension")
    spec = decode_spec(entries)
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


# ---- reading chunks (on the hosts) ----------------------------------------------------------

class ChunkReader:
    """Reads a region of a stored array: ``ChunkReader(root, name, layout)(slices)``. Shipped
    to hosts by ``load`` (as a ``generate`` function), so each host reads the chunks its
    devices need, checking each (module doc). ``layout`` None reads through zarr-python."""

    def __init__(self, root: str, name: str, layout: Layout | None):
        self.root, self.name, self.layout = root, name, layout

    def __call__(self, slices) -> np.ndarray:
        array_dir = os.path.join(self.root, self.name)
        if self.layout is None:
            try:
                return require_zarr().open_array(store=array_dir, mode="r")[slices]
            except ImportError:
                raise
            except Exception as exc:
                raise CheckpointError(f"array {array_dir} cannot be read: {exc!r}") from None
        return self._read_plain(array_dir, slices)

    def _read_plain(self, array_dir: str, slices) -> np.ndarray:
        shape, chunk = self.layout.shape, self.layout.chunk
        dtype = np.dtype(self.layout.dtype)
        box = [range(*s.indices(n)) for s, n in zip(slices, shape)]
        out = np.empty([len(r) for r in box], dtype=dtype)
        if out.size == 0:
            return out
        real_dir = os.path.join(os.path.realpath(self.root), self.name)
        span = [range(r.start // c, (r.stop - 1) // c + 1) for r, c in zip(box, chunk)]
        for index in itertools.product(*span):
            src, dst = [], []
            for i, r, c in zip(index, box, chunk):
                lo, hi = max(r.start, i * c), min(r.stop, (i + 1) * c)
                src.append(slice(lo - i * c, hi - i * c))
                dst.append(slice(lo - r.start, hi - r.start))
            data = self._read_chunk(chunk_file(array_dir, index), chunk_file(real_dir, index))
            if out.shape == chunk and all(s.start == 0 for s in src):
                return data.astype(dtype, copy=False)  # the region is this chunk: no copy
            out[tuple(dst)] = data[tuple(src)]
        return out

    def _read_chunk(self, path: str, own: str) -> np.ndarray:
        """One chunk's values, after checking the file is this checkpoint's own, of exactly
        its size (before reading a byte) and, when it carries one, its checksum."""
        layout = self.layout
        stored = np.dtype(layout.dtype).newbyteorder(layout.endian)
        nbytes = math.prod(layout.chunk) * stored.itemsize
        size = nbytes + (CRC_BYTES if layout.checksum else 0)
        real = os.path.realpath(path)
        if real != own:
            raise CheckpointError(f"chunk {path} leads to {real}: a checkpoint's files must be its"
                             " own (no symlinks)")
        try:
            st = os.stat(real)
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                what = f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode) else \
                    "not a regular file"
                raise CheckpointError(f"chunk {path} is {what}, not {size} bytes: the checkpoint"
                                 " is damaged")
            buf, crc = _read_file(real, size, nbytes if layout.checksum else 0)
        except FileNotFoundError:
            raise CheckpointError(f"chunk {path} is missing: the checkpoint is damaged") from None
        except OSError as exc:
            raise CheckpointError(f"chunk {path} cannot be read: {exc}") from None
        if buf.size != size:
            raise CheckpointError(f"chunk {path} changed size while read: read {buf.size} of"
                             f" {size}")
        if layout.checksum and crc != int.from_bytes(buf[nbytes:], "little"):
            raise CheckpointError(f"chunk {path} fails its CRC32C checksum: the checkpoint is"
                             " damaged")
        return buf[:nbytes].view(stored).reshape(layout.chunk)


def _read_file(path: str, size: int, checked: int) -> tuple[np.ndarray, int]:
    """Up to ``size`` bytes of a file (fewer if it shrank meanwhile) and the CRC32C of its
    first ``checked``, computed a block at a time, while the block is still in cache."""
    buf = np.empty(size, np.uint8)
    got, crc, view = 0, 0, memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while got < size and (n := f.readinto(view[got:got + BLOCK])):
            if got < checked:
                crc = _crc32c(buf[got:min(got + n, checked)], crc)
            got += n
    return buf[:got], crc
