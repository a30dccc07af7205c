"""The checkpoint format: a Zarr v3 group with one array per leaf of a tree, chunked by shard.

A checkpoint of ``{"w": w, "opt": (m, v)}`` is a directory::

    ckpt/zarr.json            group; attributes["pathways"] = format, the tree's structure
    ckpt/w/zarr.json          array: shape, dtype, chunk shape = w's shard shape,
                              codecs "bytes" then "crc32c"; attributes["pathways"] = spec, mesh
                              (and dtype, for a type Zarr has not: see below)
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

Zarr v3 has no core type for JAX's narrow types (bfloat16, the float8/6/4 variants, int4, ...:
every numpy dtype of ``ml_dtypes``), and zarr-python reads neither the spec's raw bits types
(``r16``) nor the names of the zarr-extensions registry ("bfloat16"). Such an array is stored as
zarr-python's ``raw_bytes`` of the type's size (``{"name": "raw_bytes", "configuration":
{"length_bytes": 2}}``: each element's little-endian bits) and its real type is named in our
attributes (``attributes["pathways"]["dtype"] = "bfloat16"``, covered by the checksum). Plain
zarr opens it as a ``V2`` array, bit for bit: ``.view(ml_dtypes.bfloat16)`` gives the values.

Nothing read from disk is trusted: the client validates all the metadata before anything is
sent to a host (``pathways.checkpoint_metadata``), and each host checks every chunk it reads
(``ChunkReader``): it exists, is a regular file of this checkpoint (no symlink), has exactly its
size (checked before reading) and its checksum. Anything wrong raises ``CheckpointError``
naming the file.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
import sys
import warnings
from dataclasses import dataclass

import numpy as np

from .dtypes import is_ml_dtype, ml_dtypes_by_name
from .errors import CheckpointError, ProgramError

__all__ = ["CRC_BYTES", "FORMAT", "MAX_METADATA", "ZARR_DTYPES", "ChunkReader", "Layout",
           "check_dtype", "check_name", "check_own", "chunk_file", "crc32c", "create",
           "decode_spec", "digest", "encode_spec", "leaf_name", "raw_data_type",
           "require_zarr", "seal", "stored_dtype", "valid_key", "write_chunk"]

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


def crc32c(data, crc: int = 0) -> int:
    """CRC32C of a bytes-like (a numpy array included) continuing ``crc``, by
    google_crc32c's C implementation."""
    try:
        import google_crc32c
    except ImportError:
        raise ImportError("checkpoints need the google-crc32c package: pip install"
                          " 'pathways-open[zarr]'") from None
    return google_crc32c.extend(crc, data)


def check_dtype(dtype, what: str) -> None:
    dtype = np.dtype(dtype)
    if dtype.name not in ZARR_DTYPES and not (is_ml_dtype(dtype) and dtype.isnative):
        raise ProgramError(f"{what}: dtype {dtype} has no Zarr v3 data type; a checkpoint"
                           f" holds {', '.join(ZARR_DTYPES)} and, as raw bytes, ml_dtypes'"
                           f" {', '.join(ml_dtypes_by_name()) or '(not installed)'}")


def stored_dtype(name) -> np.dtype:
    """The dtype a checkpoint names ``name`` (a Zarr core type, or an ml_dtypes type stored
    as raw bytes); CheckpointError naming it if it names none."""
    if isinstance(name, str):
        if name in ZARR_DTYPES:
            return np.dtype(name)
        ml = ml_dtypes_by_name().get(name)
        if ml is not None:
            return ml
    raise CheckpointError(f"dtype {name!r} is neither a Zarr v3 core data type nor an"
                          " ml_dtypes type")


def raw_data_type(dtype: np.dtype) -> dict:
    """The Zarr data type (its zarr.json form) an ml_dtypes ``dtype`` is stored as."""
    return {"name": "raw_bytes", "configuration": {"length_bytes": dtype.itemsize}}


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
        dtype = np.dtype(dtype)
        if is_ml_dtype(dtype):  # as raw bytes, its type in our attributes (module doc)
            attributes = {**attributes, "dtype": dtype.name}
            dtype = np.dtype(f"V{dtype.itemsize}")
        with warnings.catch_warnings():  # raw bytes "may change": we check what we read
            warnings.simplefilter("ignore", getattr(zarr.errors, "UnstableSpecificationWarning",
                                                    FutureWarning))
            group.create_array(name, shape=shape, chunks=tuple(max(1, c) for c in chunks),
                               dtype=dtype, compressors=[zarr.codecs.Crc32cCodec()],
                               filters=None, attributes={"pathways": attributes})
    for node in [path, *(os.path.join(path, a[0]) for a in arrays)]:
        seal(node)


def digest(meta: dict) -> str:
    """CRC32C of what a zarr.json says that matters: all but attributes other than ours."""
    body = {k: v for k, v in meta.items() if k != "attributes"}
    body["pathways"] = {k: v for k, v in meta["attributes"]["pathways"].items()
                        if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return f"{crc32c(text.encode()):08x}"


def seal(node: str) -> None:
    """Write the checksum of the content of the zarr.json of ``node`` into it."""
    file = os.path.join(node, "zarr.json")
    with open(file) as f:
        meta = json.load(f)
    meta["attributes"]["pathways"]["checksum"] = digest(meta)
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
            crc = crc32c(block, crc)
            f.write(memoryview(block))
        f.write(crc.to_bytes(CRC_BYTES, "little"))
        f.flush()
        os.fsync(f.fileno())


# ---- reading and validating metadata (on the client) ----------------------------------------

@dataclass(frozen=True)
class Layout:
    """How a Pathways-written array's chunks sit on disk: what a host needs to read them."""
    shape: tuple
    dtype: str  # its real type's name ("float32", "bfloat16": ``stored_dtype``)
    chunk: tuple
    endian: str  # "<" or ">"
    checksum: bool  # chunks end with their CRC32C


def check_own(root: str, path: str) -> None:
    """``path`` (under ``root``) must be the checkpoint's own: no symlink on the way to it."""
    real = os.path.realpath(path)
    if real != os.path.join(os.path.realpath(root), os.path.relpath(path, root)):
        raise CheckpointError(f"{path} leads to {real}: a checkpoint's files must be its own"
                              " (no symlinks)")


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
                array = require_zarr().open_array(store=array_dir, mode="r")
                return _typed(array[slices], array.attrs.get("pathways"), array_dir)
            except (ImportError, CheckpointError):
                raise
            except Exception as exc:
                raise CheckpointError(f"array {array_dir} cannot be read: {exc!r}") from None
        return self._read_plain(array_dir, slices)

    def _read_plain(self, array_dir: str, slices) -> np.ndarray:
        shape, chunk = self.layout.shape, self.layout.chunk
        dtype = stored_dtype(self.layout.dtype)
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
        stored = stored_dtype(layout.dtype).newbyteorder(layout.endian)
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


def _typed(values: np.ndarray, ours, array_dir: str) -> np.ndarray:
    """``values`` zarr-python read, as their real type: raw bytes (a void type) as the
    ml_dtypes type our attributes name, checked to be of their size."""
    if values.dtype.kind != "V":
        return values
    name = ours.get("dtype") if isinstance(ours, dict) else None
    dtype = stored_dtype(name) if name is not None else None
    if dtype is None or dtype.itemsize != values.dtype.itemsize:
        raise CheckpointError(f"array {array_dir} holds raw bytes of {values.dtype.itemsize}"
                              f" bytes but names its type {name!r}")
    return values.view(dtype)


def _read_file(path: str, size: int, checked: int) -> tuple[np.ndarray, int]:
    """Up to ``size`` bytes of a file (fewer if it shrank meanwhile) and the CRC32C of its
    first ``checked``, computed a block at a time, while the block is still in cache."""
    buf = np.empty(size, np.uint8)
    got, crc, view = 0, 0, memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while got < size and (n := f.readinto(view[got:got + BLOCK])):
            if got < checked:
                crc = crc32c(buf[got:min(got + n, checked)], crc)
            got += n
    return buf[:got], crc
