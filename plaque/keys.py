"""Stable keys: which shard a key goes to, the same in every process.

Python's ``hash`` of a ``str`` or ``bytes`` changes with ``PYTHONHASHSEED``, which differs
between processes unless set, so ``shard=hash(word) % n`` can send one word to different shards
from different workers. ``emit(value, key=k)`` routes by ``stable_hash(k) % n`` instead: a hash
of the key's value only (CRC-32 of the bytes of text, a multiplicative mix of integers), the same
on every machine and in every run.

Keys may be ``int`` (and ``bool`` and numpy integers, as their value), ``float``, ``str``,
``bytes``, ``None`` or tuples of these; equal keys hash equally (``1``, ``1.0`` and ``True`` are
one key, as in a dict). Anything else is refused with a ``TypeError``: an object without a
stable value (a class instance hashed by identity, say) would scatter silently.
A numpy integer array of keys is hashed at once by ``stable_shards``; any other batch of keys
has each distinct key hashed once.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: Fibonacci hashing spreads near keys apart
_STR, _BYTES, _FLOAT, _TUPLE = 0x5354, 0x4259, 0x464C, 0x5455  # tags: "a" and b"a" differ


def _mix(x: int) -> int:
    """The top 32 bits of x * golden ratio (mod 2^64): near integers land far apart."""
    return (x * _GOLDEN & _MASK64) >> 32  # Python's & of any int, negative too, is mod 2^64


def stable_hash(key) -> int:
    """A 32-bit hash of ``key`` that depends on its value only (see the module docstring)."""
    kind = type(key)
    if kind is int or kind is bool:  # _mix inlined, constants folded: the common case
        return (key * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF) >> 32  # & is mod 2^64, even < 0
    if kind is str:
        return _mix(zlib.crc32(key.encode("utf-8", "surrogatepass")) ^ _STR << 32)
    if kind is bytes:
        return _mix(zlib.crc32(key) ^ _BYTES << 32)
    if kind is tuple:
        h = _TUPLE
        for item in key:
            h = (h * 1_000_003 & _MASK64) ^ stable_hash(item)
        return _mix(h)
    if key is None:
        return 0
    if kind is float or isinstance(key, (float, np.floating)):
        f = float(key)
        if f.is_integer():
            return _mix(int(f))
        return _mix(zlib.crc32(struct.pack("<d", f)) ^ _FLOAT << 32)
    if isinstance(key, (int, np.integer)):  # int subclasses (IntEnum), numpy integers
        return _mix(int(key))
    if isinstance(key, (str, np.str_)):
        return stable_hash(str(key))
    if isinstance(key, (bytes, np.bytes_)):
        return stable_hash(bytes(key))
    raise TypeError(f"a key of type {kind.__name__} has no stable hash; use an int, float, str,"
                    " bytes, None or a tuple of these (its value, not its identity, must say"
                    " where it goes)")


def stable_shard(key, num_shards: int) -> int:
    """The shard of ``num_shards`` that ``key`` goes to."""
    return stable_hash(key) % num_shards


def stable_shards(keys, num_shards: int) -> np.ndarray:
    """The shard of each key, as an int64 array; integer arrays are hashed without a loop."""
    if not isinstance(keys, np.ndarray) and set(map(type, keys)) <= {int, bool}:
        try:  # plain ints that fit in 64 bits: as an array (same hash, no loop)
            keys = np.fromiter(keys, dtype=np.int64, count=len(keys))
        except OverflowError:
            pass
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iub":
        with np.errstate(over="ignore"):
            mixed = (keys.astype(np.int64).view(np.uint64) * np.uint64(_GOLDEN)) >> np.uint64(32)
        return (mixed % np.uint64(num_shards)).astype(np.int64)
    if isinstance(keys, np.ndarray):
        keys = keys.tolist()  # numpy str_ / bytes_ / floats as their Python values
    try:  # each distinct key hashed once: a batch of words repeats most of them
        shard_of = dict.fromkeys(keys)
    except TypeError:  # an unhashable key: stable_hash names it
        shard_of = None
    if shard_of is None or len(shard_of) == len(keys):
        return np.fromiter((stable_hash(k) % num_shards for k in keys), dtype=np.int64,
                           count=len(keys))
    for k in shard_of:  # equal keys (1, 1.0, True) share an entry: they hash equally
        shard_of[k] = stable_hash(k) % num_shards
    return np.fromiter(map(shard_of.__getitem__, keys), dtype=np.int64, count=len(keys))
