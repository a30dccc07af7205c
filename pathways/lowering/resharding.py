"""Resharding plans: which block of which source shard each destination shard needs.

A value produced on one placement (devices + spec) and consumed on another must move. The
source spec cuts the global array into tiles; replicas of a tile (devices that differ only on
mesh axes the spec does not use) hold the same data, so each tile is sent from one canonical
replica only (the lowest flat index). A destination shard receives, from each tile that
overlaps its own block, exactly the overlap. Pure: shapes in, plan out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..program.sharding import device_slices


@dataclass(frozen=True)
class Piece:
    """Send ``src[src_slices]`` from source flat index ``src`` into ``dst[dst_slices]``."""

    src: int
    dst: int
    src_slices: tuple[slice, ...]
    dst_slices: tuple[slice, ...]


def _bounds(slices, shape):
    return tuple((s.start or 0, shape[d] if s.stop is None else s.stop)
                 for d, s in enumerate(slices))


def plan(global_shape, src_mesh, src_spec, dst_mesh, dst_spec) -> list[Piece]:
    """Every piece to send; meshes are (shape, axis_names) pairs."""
    shape = tuple(global_shape)
    tiles: dict[tuple, int] = {}  # tile bounds -> canonical source flat index
    n_src = 1
    for n in src_mesh[0]:
        n_src *= n
    for i in range(n_src):
        b = _bounds(device_slices(shape, *src_mesh, src_spec, i), shape)
        tiles.setdefault(b, i)
    n_dst = 1
    for n in dst_mesh[0]:
        n_dst *= n
    pieces = []
    for j in range(n_dst):
        dst_b = _bounds(device_slices(shape, *dst_mesh, dst_spec, j), shape)
        for src_b, i in tiles.items():
            lo = [max(a[0], b[0]) for a, b in zip(src_b, dst_b)]
            hi = [min(a[1], b[1]) for a, b in zip(src_b, dst_b)]
            if any(low >= high for low, high in zip(lo, hi)) and shape:
                continue
            src_sl = tuple(slice(low - a[0], high - a[0]) for low, high, a in zip(lo, hi, src_b))
            dst_sl = tuple(slice(low - b[0], high - b[0]) for low, high, b in zip(lo, hi, dst_b))
            pieces.append(Piece(i, j, src_sl, dst_sl))
    return pieces
