"""Data types on the wire: a name for every numpy dtype, ml_dtypes' too, and an array's bytes.

JAX's narrow types (bfloat16, the float8, float6 and float4 variants, int4, ...) are numpy
dtypes of ``ml_dtypes``, but numpy describes them badly for a wire: ``dtype.str`` of bfloat16
is ``'<V2'``, a void type (``np.dtype('<V2')`` is not bfloat16), several share a type
character, and an array of them exports no buffer (``memoryview`` raises "cannot include dtype
'E' in a buffer"; numpy pickles them by copying their bytes into the pickle). So:

- ``wire_name(dtype)``: ml_dtypes types by ``dtype.name`` ("bfloat16"), every other type by
  ``dtype.str`` ("<f4", "|b1", "<M8[ns]", "|O"); ``wire_dtype(name)`` is its inverse and
  refuses a name it does not know, naming it. Structured dtypes have no wire name (their
  ``str`` is a plain void type).
- ``raw_bytes(array)``: the array's bytes in C order as a ``uint8`` memoryview, with no copy
  when it is C-contiguous (not for objects: they have no bytes to send);
  ``from_bytes(buffer, dtype, shape)`` reads them back, checked.
- ``RawArray(array)``: pickles as ``(wire name, shape, bytes)`` with the bytes as a protocol-5
  buffer (out of band on our wire, never copied into the pickle) and unpickles as a plain
  ndarray; ``shippable(value)`` wraps a value numpy would copy into a pickle (an ml_dtypes
  array) and leaves any other as it is; ``unwrap`` undoes it where a value may arrive without
  being pickled (a Plaque tuple for a shard of the same worker). What leaves a host is
  numpy: ``shippable`` copies a device-resident ``jax.Array`` (``is_device_array``: a buffer
  a host whose devices are JAX's keeps on its device) to the host first.

ml_dtypes is imported on first use; without it only numpy's own types exist.
"""

from __future__ import annotations

import functools
import math
import pickle

import numpy as np

from .errors import ProgramError
from .program.ir import is_device_array

__all__ = ["RawArray", "from_bytes", "is_ml_dtype", "ml_dtypes_by_name", "raw_bytes",
           "shippable", "unwrap", "wire_dtype", "wire_name"]

CACHED = 1024  # dtypes and names whose answers are remembered (a wire brings few)


@functools.cache
def ml_dtypes_by_name() -> dict[str, np.dtype]:
    """Every numpy dtype ``ml_dtypes`` exposes (bfloat16, float8_e4m3fn, int4, ...) by name;
    empty without ml_dtypes."""
    try:
        import ml_dtypes
    except ImportError:
        return {}
    out = {}
    for attr in ml_dtypes.__all__:
        t = getattr(ml_dtypes, attr, None)
        if isinstance(t, type) and issubclass(t, np.generic):
            out[np.dtype(t).name] = np.dtype(t)
    return out


def is_ml_dtype(dtype) -> bool:
    """Whether ``dtype`` is one of ml_dtypes' types (in any byte order)."""
    dtype = np.dtype(dtype)
    ml = ml_dtypes_by_name().get(dtype.name)
    return ml is not None and ml.type is dtype.type


def wire_name(dtype) -> str:
    """The name ``dtype`` travels by: ``wire_dtype(wire_name(d)) == d``. ProgramError for a
    dtype no name stands for (structured records, a byte-swapped ml_dtypes type)."""
    return _wire_name(np.dtype(dtype))


@functools.lru_cache(maxsize=CACHED)
def _wire_name(dtype: np.dtype) -> str:
    if is_ml_dtype(dtype):
        if not dtype.isnative:
            raise ProgramError(f"dtype {dtype} in non-native byte order cannot travel; convert"
                               " it to native order first")
        return dtype.name
    if dtype.names is not None or dtype.subdtype is not None:
        raise ProgramError(f"dtype {dtype} has no wire name: only numeric, bool, string, time"
                           " and object types (numpy's and ml_dtypes') have")
    return dtype.str


def wire_dtype(name) -> np.dtype:
    """The dtype ``wire_name`` named ``name``; ProgramError naming ``name`` if it names none
    (only the exact names ``wire_name`` gives are accepted: "<f4", not "float32")."""
    if not isinstance(name, str):
        raise ProgramError(f"unknown data type {name!r} on the wire: not a name")
    return _wire_dtype(name)


@functools.lru_cache(maxsize=CACHED)
def _wire_dtype(name: str) -> np.dtype:
    ml = ml_dtypes_by_name().get(name)
    if ml is not None:
        return ml
    try:
        dtype = np.dtype(name)
    except Exception:  # numpy raises TypeError, but a parser may raise others on odd text
        dtype = None
    if dtype is None or is_ml_dtype(dtype) or dtype.str != name or dtype.names is not None \
            or dtype.subdtype is not None:
        known = ", ".join(sorted(ml_dtypes_by_name())) or "none: ml_dtypes is not installed"
        raise ProgramError(f"unknown data type {name!r} on the wire: a numpy dtype string"
                           f" such as '<f4' or an ml_dtypes name ({known}) was expected")
    return dtype


def raw_bytes(array) -> memoryview:
    """The bytes of ``array`` in C order, a ``uint8`` memoryview: a view of its memory when
    it is C-contiguous, else of a C-ordered copy. Works for every dtype, ml_dtypes' too, but
    objects (ProgramError: an object array holds pointers, not values)."""
    a = np.asarray(array)
    if a.dtype.hasobject:
        raise ProgramError(f"an array of {a.dtype} has no bytes to send, only pointers")
    if not a.flags.c_contiguous:
        a = a.copy()  # (ascontiguousarray would make a 0-d array 1-d)
    if a.nbytes == 0:
        return memoryview(b"")
    return a.reshape(-1).view(np.uint8).data


def from_bytes(buffer, dtype: np.dtype, shape) -> np.ndarray:
    """An array of ``dtype`` and ``shape`` on ``buffer``'s bytes (no copy: read-only if the
    buffer is); ValueError if the buffer does not hold exactly that many bytes."""
    shape = tuple(shape)
    if shape and min(shape) < 0:
        raise ValueError(f"negative dimension in shape {shape}")
    view = memoryview(buffer)
    want = math.prod(shape) * dtype.itemsize
    if view.nbytes != want:
        raise ValueError(f"{view.nbytes} bytes for a {dtype}{list(shape)} array of {want}")
    if want == 0:
        return np.empty(shape, dtype)
    return np.frombuffer(view.cast("B"), dtype).reshape(shape)


class RawArray:
    """``array`` for pickling: it pickles as its wire name, shape and bytes, the bytes as a
    protocol-5 buffer (so ``plaque.wire`` sends a large one as its own frame, uncopied), and
    unpickles as a plain ndarray (writable when the bytes came inside the pickle).

    Where a value may also arrive unpickled (a Plaque tuple to a shard of the same worker),
    the receiver calls ``unwrap``."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __reduce_ex__(self, protocol):
        a = np.asarray(self.array)
        data = raw_bytes(a)
        buffer = pickle.PickleBuffer(data) if protocol >= 5 else data.tobytes()
        return _rebuild, (wire_name(a.dtype), a.shape, buffer)


def _rebuild(name: str, shape: tuple, buffer) -> np.ndarray:
    return from_bytes(buffer, wire_dtype(name), shape)


def shippable(value):
    """``value`` ready to pickle without copying its bytes: an ml_dtypes array as a
    ``RawArray`` (numpy would copy it into the pickle), a device-resident ``jax.Array`` as
    numpy (what leaves a host needs no JAX), anything else as it is (numpy ships its own
    types' bytes out of band already)."""
    if type(value) is not np.ndarray and is_device_array(value):
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and is_ml_dtype(value.dtype) and value.dtype.isnative:
        return RawArray(value)
    return value


def unwrap(value):
    """What ``shippable`` was given: a ``RawArray`` that arrived unpickled as its array,
    anything else (an array pickling made already) as it is."""
    return value.array if isinstance(value, RawArray) else value
