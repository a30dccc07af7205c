"""A mesh: a virtual slice of devices with axis names and sizes, as a client sees it.

The resource manager maps each virtual device (a position in the mesh, row-major) to one
physical device; ``ids[i]`` is the physical id of flat position i. As in
``jax.sharding.Mesh``, ``mesh.shape`` maps axis name to size and ``mesh.devices`` is an array
of device objects shaped like the mesh. A mesh is cheap to pass around and hashable, so
compiled functions and traced programs can be cached by it.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field

import numpy as np

from ..errors import ShardingError

Device = namedtuple("Device", "id island host kind")
Device.__doc__ = "An emulated device: physical id, island, host id and kind (None if unknown)."


def device_of(info: dict) -> Device:
    """The device a coordinator's device record (``client.devices()``' source) describes."""
    return Device(info["id"], info["island"], info["host"], info["kind"])


@dataclass(frozen=True)
class Mesh:
    """A virtual slice of devices with axis names and sizes; ``ids[i]`` is the physical id
    of flat (row-major) position i. Get one from ``client.mesh``.

    >>> mesh = client.mesh((2, 4), ("data", "model"))
    >>> mesh.shape, mesh.size                           # {'data': 2, 'model': 4}, 8
    >>> mesh.devices[1, 0].host                         # device objects, shaped like the mesh
    >>> pw.Mesh.abstract((2, 4), ("data", "model"))     # placeholder devices, no client
    """

    axis_sizes: tuple[int, ...]
    axis_names: tuple[str, ...]
    ids: tuple[int, ...]  # physical device id of each flat (row-major) position
    slice_id: int | None = None
    island: int | None = None
    version: int = 0
    client: object = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        sizes, names = tuple(int(n) for n in self.axis_sizes), tuple(self.axis_names)
        if len(sizes) != len(names):
            raise ShardingError(f"mesh shape {sizes} has {len(sizes)} axes but"
                                f" {len(names)} axis names {names}")
        if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise ShardingError(f"mesh axis names must be distinct strings, got {names}")
        if any(n < 1 for n in sizes):
            raise ShardingError(f"mesh shape entries must be positive, got {sizes}")
        size = int(np.prod(sizes, dtype=np.int64))
        if len(self.ids) != size:
            raise ShardingError(f"mesh {sizes} needs {size} devices, got {len(self.ids)}")
        if len(set(self.ids)) != len(self.ids):
            raise ShardingError(f"mesh devices must be distinct, got {self.ids}")
        object.__setattr__(self, "axis_sizes", sizes)
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "ids", tuple(int(d) for d in self.ids))

    def __reduce__(self):  # never ship the client (sockets, threads) along with a mesh
        return (Mesh, (self.axis_sizes, self.axis_names, self.ids, self.slice_id, self.island,
                       self.version))

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size, in axis order (``jax.sharding.Mesh.shape``)."""
        return dict(zip(self.axis_names, self.axis_sizes))

    @property
    def devices(self) -> np.ndarray:
        """The devices as an object array shaped like the mesh (``jax.sharding.Mesh.devices``);
        each has ``.id``, ``.island``, ``.host`` and ``.kind`` (None where this mesh has no
        client to ask, as for an abstract mesh), as the client last listed them (no round
        trip: ``client.cluster.listed()``)."""
        known = {} if self.client is None else {d.id: d for d in self.client.cluster.listed()}
        out = np.empty(len(self.ids), dtype=object)
        for i, d in enumerate(self.ids):
            out[i] = known.get(d) or Device(d, self.island, None, None)
        return out.reshape(self.axis_sizes)

    @property
    def device_ids(self) -> np.ndarray:
        """Physical device ids shaped like the mesh (``jax.sharding.Mesh.device_ids``)."""
        return np.array(self.ids, dtype=np.int64).reshape(self.axis_sizes)

    @property
    def size(self) -> int:
        return len(self.ids)

    # What ``jax.sharding.NamedSharding(mesh, spec)`` reads of a mesh, as of JAX's
    # ``AbstractMesh`` (no device list: its devices are the cluster's, not this process's),
    # so a JAX user's own spelling holds a pathways mesh and ``client.put`` and
    # ``client.device_put`` take it (``pathways.client.placing``).
    _internal_device_list = None

    @property
    def axis_types(self) -> tuple:
        """JAX's axis types (``jax.sharding.AxisType.Auto`` for every axis); JAX asks for
        them, so it is loaded."""
        from jax.sharding import AxisType

        return (AxisType.Auto,) * len(self.axis_names)

    def axis_size(self, name: str) -> int:
        if name not in self.axis_names:
            raise ShardingError(f"unknown mesh axis {name!r}; this mesh has {self.axis_names}")
        return self.axis_sizes[self.axis_names.index(name)]

    @classmethod
    def abstract(cls, shape, axis_names) -> Mesh:
        """A mesh with placeholder devices, for tracing and the reference interpreter."""
        return cls(tuple(shape), tuple(axis_names), tuple(range(int(np.prod(shape)))))

    def __repr__(self):
        axes = ", ".join(f"{a}={n}" for a, n in zip(self.axis_names, self.axis_sizes))
        return f"Mesh({axes}; devices={list(self.ids)})"
