"""What a host needs to run a JAX body's segments once for several of its devices.

``box_of`` finds whether a host's devices of a mesh form a box of it (every combination of
their coordinates is one of them), which is when ``pathways.program.jax_batch`` can run a
segment once for all of them; ``Box`` is that box as the host uses it, ``Batch`` one run of
a segment while its members arrive (``pathways.host.exchange.Exchanges.batch``).
``PATHWAYS_JAX_BATCH=off`` turns it off: every device runs its own segments (to compare).
"""

from __future__ import annotations

import math
import os

import numpy as np

__all__ = ["BATCHING", "Batch", "Box", "box_of", "same_boxes"]

BATCHING = os.environ.get("PATHWAYS_JAX_BATCH", "on") != "off"


class Box:
    """This host's devices of a mesh, when they form a box of it (``jax_batch.HostBatch``):
    the devices in box order (row-major over their coordinates), their mesh coordinates, and
    each one's place in that order."""

    __slots__ = ("batch", "members", "coords", "place")

    def __init__(self, batch, members: tuple, coords: np.ndarray):
        self.batch, self.members, self.coords = batch, members, coords
        self.place = {d: i for i, d in enumerate(members)}


class Batch:
    """One batched segment's run on this host: the members' arguments so far, then their
    results (``missing_sources`` is what the exchanges' watchdog reads, as of a reduction's
    group)."""

    __slots__ = ("key", "devs", "box", "parked", "results", "error", "share")

    def __init__(self, key, devs: tuple):
        self.key, self.devs = key, devs
        self.box: dict = {}  # member -> its arguments
        self.parked: list = []  # (member, shard) waiting for the rest
        self.results = self.error = None
        self.share = 0.0  # each member's part of the computation's real time

    def missing_sources(self) -> list:
        """The members that have not reached the batch yet (a timeout's message)."""
        return [d for d in self.devs if d not in self.box]


def same_boxes(devices: dict, mesh_shape, host_of) -> bool:
    """Whether every host's devices of a mesh (``devices``: flat index -> device;
    ``host_of(device)``: its host, or None if not known) form a box of it, all of the same
    extents. Only then does a host batch: every host then cuts a body's plan at the same
    collectives, so their exchanges are numbered alike. Where one host's devices form no box,
    or another box, its plan would cut at collectives that another host runs inside its
    segments, and their exchanges' numbers would differ (one host's psum over a row met
    another host's psum over a column, and failed)."""
    by_host: dict = {}
    for flat, device in devices.items():
        host = host_of(device)
        if host is None:
            return False
        by_host.setdefault(host, []).append(flat)
    shapes = set()
    for flats in by_host.values():
        coords = np.unravel_index(sorted(flats), mesh_shape)
        extents = tuple(len(set(c.tolist())) for c in coords)
        if math.prod(extents) != len(flats):
            return False
        shapes.add(extents)
    return len(shapes) == 1


def box_of(devices: dict, mesh_shape, axis_names, local, jax_of=None) -> Box | None:
    """The box of the mesh's devices (``devices``: flat index -> device) that are in
    ``local``, or None if there are fewer than two or they do not form a box. ``jax_of``:
    each local device's own JAX device, on a host whose devices are JAX's (its segments
    then run as one program over them)."""
    from ..program.jax_batch import HostBatch

    flats = sorted(f for f, d in devices.items() if d in local)
    if len(flats) < 2:
        return None
    coords = np.array(np.unravel_index(flats, mesh_shape), dtype=np.int32).T
    extents = tuple(len(set(coords[:, a])) for a in range(len(mesh_shape)))
    if math.prod(extents) != len(flats):
        return None
    members = tuple(devices[f] for f in flats)
    own = tuple(jax_of[d] for d in members) if jax_of else None
    return Box(HostBatch(tuple(mesh_shape), tuple(axis_names), extents, own), members, coords)
