"""The checkpoint format: a Zarr v3 group with one array per leaf of a tree, chunked by shard.

A checkpoint of ``{"w": w, "opt": (m, v)}`` is a directory::

    ckpt/zarr.json            group; attributes["pathways"] = the tree's structure
    ckpt/w/zarr.json          array: shape, dtype, chunk shape = w's shard shape, codec "bytes"
    ckpt/w/c/0/0 ...          one chunk per distinct shard, written by the host that holds it
    ckpt/opt.0/...  ckpt/opt.1/...

The client writes the metadata (with ``zarr``); hosts write and read chunks. Every array here is
stored with the one Zarr codec "bytes" (little-endian, no compression), so a chunk file is
exactly a shard's bytes in C order: hosts write them with plain file writes and read them back
the same way, which costs the disk's speed and not zarr-python's encode path (3-4x slower when
measured here). An array stored with other codecs (written by another tool) is read through
``zarr``. Any Zarr v3 reader (zarr-python, TensorStore) opens a checkpoint.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys

import numpy as np

from .errors import ProgramError

__all__ = ["ZARR_DTYPES", "ChunkReader", "check_dtype", "chunk_file", "create", "decode_spec",
           "encode_spec", "read_group", "require_zarr", "write_chunk"]

# numpy kinds with a Zarr v3 core data type of the same name
ZARR_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
               "uint64", "float16", "float32", "float64", "complex64", "complex128")
FORMAT = 1


def require_zarr():
    try:
        import zarr
    except ImportError:
        raise ImportError("checkpoints need the zarr package: pip install"
                          " 'pathways-open[zarr]'") from None
    return zarr


def check_dtype(dtype, what: str) -> None:
    if np.dtype(dtype).name not in ZARR_DTYPES:
        raise ProgramError(f"{what}: dtype {np.dtype(dtype)} has no Zarr v3 data type; a"
                           f" checkpoint holds {', '.join(ZARR_DTYPES)}")


def encode_spec(spec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def decode_spec(entries) -> tuple:
    return tuple(tuple(e) if isinstance(e, list) else e for e in entries)


def create(path: str, structure, arrays: list[tuple]) -> None:
    """Write the metadata of a checkpoint at ``path`` (which must not exist): the group with
    ``structure`` and, for each ``(name, shape, dtype, chunks, attributes)``, an empty array."""
    zarr = require_zarr()
    group = zarr.open_group(store=path, mode="w-", zarr_format=3, attributes={
        "pathways": {"format": FORMAT, "tree": structure}})
    for name, shape, dtype, chunks, attributes in arrays:
        group.create_array(name, shape=shape, chunks=tuple(max(1, c) for c in chunks),
                           dtype=np.dtype(dtype), compressors=None, filters=None,
                           attributes={"pathways": attributes})


def _read_json(path: str) -> dict:
    try:
        with open(os.path.join(path, "zarr.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no Zarr node at {path} (no zarr.json)") from None


def read_group(path: str) -> tuple[object, dict]:
    """A checkpoint's tree structure and each array's metadata by name (plain JSON reads)."""
    meta = _read_json(path)
    tree = meta.get("attributes", {}).get("pathways", {}).get("tree")
    if meta.get("node_type") != "group" or tree is None:
        raise ProgramError(f"{path} is not a Pathways checkpoint (a Zarr group whose"
                           " attributes name its tree)")
    names = []

    def walk(node):
        if "array" in node:
            names.append(node["array"])
        for child in node.get("dict", ()):
            walk(child[1])
        for child in node.get("tuple", node.get("list", ())):
            walk(child)

    walk(tree)
    return tree, {n: _read_json(os.path.join(path, n)) for n in names}


def chunk_file(array_dir: str, index) -> str:
    """The file of chunk ``index`` under Zarr v3's default chunk key encoding."""
    return os.path.join(array_dir, "c", *map(str, index))


def write_chunk(array_dir: str, index, value: np.ndarray) -> None:
    """Write one chunk (a whole shard) durably: its little-endian bytes, then fsync."""
    value = np.ascontiguousarray(value)
    if value.dtype.byteorder == ">" or (value.dtype.byteorder == "=" and sys.byteorder == "big"):
        value = value.astype(value.dtype.newbyteorder("<"))
    path = chunk_file(array_dir, index)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(memoryview(value).cast("B"))
        f.flush()
        os.fsync(f.fileno())


class ChunkReader:
    """Reads a region of a stored array: ``ChunkReader(dir)(slices)``. Shipped to hosts by
    ``load`` (as a ``generate`` function), so each host reads the chunks its devices need."""

    def __init__(self, array_dir: str):
        self.array_dir = array_dir

    def __call__(self, slices) -> np.ndarray:
        meta = _read_json(self.array_dir)
        codecs = meta.get("codecs", [])
        plain = (len(codecs) == 1 and codecs[0].get("name") == "bytes"
                 and meta.get("chunk_grid", {}).get("name") == "regular"
                 and meta.get("chunk_key_encoding", {}).get("configuration", {})
                 .get("separator", "/") == "/"
                 and meta.get("chunk_key_encoding", {}).get("name") == "default"
                 and meta.get("data_type") in ZARR_DTYPES)
        if not plain:
            return require_zarr().open_array(store=self.array_dir, mode="r")[slices]
        return self._read_plain(meta, codecs[0].get("configuration") or {}, slices)

    def _read_plain(self, meta, config, slices) -> np.ndarray:
        shape = tuple(meta["shape"])
        chunk = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
        endian = "<" if config.get("endian", "little") == "little" else ">"
        dtype = np.dtype(meta["data_type"])
        stored = dtype.newbyteorder(endian) if dtype.itemsize > 1 else dtype
        box = [range(*s.indices(n)) for s, n in zip(slices, shape)]
        out = np.empty([len(r) for r in box], dtype=dtype)
        if out.size == 0:
            return out
        fill = meta.get("fill_value")
        span = [range(r.start // c, (r.stop - 1) // c + 1) for r, c in zip(box, chunk)]
        for index in itertools.product(*span):
            src, dst = [], []
            for i, r, c in zip(index, box, chunk):
                lo, hi = max(r.start, i * c), min(r.stop, (i + 1) * c)
                src.append(slice(lo - i * c, hi - i * c))
                dst.append(slice(lo - r.start, hi - r.start))
            path = chunk_file(self.array_dir, index)
            try:
                data = np.fromfile(path, dtype=stored)
            except FileNotFoundError:
                out[tuple(dst)] = _fill(fill, dtype)
                continue
            if data.size != math.prod(chunk):
                raise ProgramError(f"chunk {path} holds {data.size} values, not"
                                   f" {math.prod(chunk)}: the checkpoint is damaged")
            data = data.reshape(chunk)
            if out.shape == chunk and all(s.start == 0 for s in src):
                return data.astype(dtype, copy=False)  # the region is this chunk: no copy
            out[tuple(dst)] = data[tuple(src)]
        return out


def _fill(fill, dtype):
    if isinstance(fill, list):  # complex: [real, imaginary]
        return complex(*fill)
    if isinstance(fill, str):  # "NaN", "Infinity", "-Infinity" or hex
        return {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(fill, 0)
    return 0 if fill is None else fill
