"""A mesh: a virtual slice of devices with a shape and axis names, as a client sees it.

The resource manager maps each virtual device (a position in the mesh, row-major) to one
physical device; ``devices[i]`` is the physical id of flat position i. A mesh is cheap to pass
around and hashable, so compiled functions and traced programs can be cached by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ShardingError


@dataclass(frozen=True)
class Mesh:
    """A virtual slice of devices with a shape and axis names; ``devices[i]`` is the
    physical id of flat (row-major) position i. Get one from ``client.mesh``.

    >>> mesh = client.mesh((2, 4), ("data", "model"))
    >>> mesh.size, mesh.axis_size("model")              # (8, 4)
    >>> pw.Mesh.abstract((2, 4), ("data", "model"))     # placeholder devices, no client
    """

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    devices: tuple[int, ...]  # physical device id of each flat (row-major) position
    slice_id: int | None = None
    island: int | None = None
    version: int = 0
    client: object = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        shape, names = tuple(int(n) for n in self.shape), tuple(self.axis_names)
        if len(shape) != len(names):
            raise ShardingError(f"mesh shape {shape} has {len(shape)} axes but"
                                f" {len(names)} axis names {names}")
        if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise ShardingError(f"mesh axis names must be distinct strings, got {names}")
        if any(n < 1 for n in shape):
            raise ShardingError(f"mesh shape entries must be positive, got {shape}")
        size = 1
        for n in shape:
            size *= n
        if len(self.devices) != size:
            raise ShardingError(f"mesh {shape} needs {size} devices, got {len(self.devices)}")
        if len(set(self.devices)) != len(self.devices):
            raise ShardingError(f"mesh devices must be distinct, got {self.devices}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))

    def __reduce__(self):  # never ship the client (sockets, threads) along with a mesh
        return (Mesh, (self.shape, self.axis_names, self.devices, self.slice_id, self.island,
                       self.version))

    @property
    def size(self) -> int:
        return len(self.devices)

    def axis_size(self, name: str) -> int:
        if name not in self.axis_names:
            raise ShardingError(f"unknown mesh axis {name!r}; this mesh has {self.axis_names}")
        return self.shape[self.axis_names.index(name)]

    @classmethod
    def abstract(cls, shape, axis_names) -> Mesh:
        """A mesh with placeholder devices, for tracing and the reference interpreter."""
        size = 1
        for n in shape:
            size *= int(n)
        return cls(tuple(shape), tuple(axis_names), tuple(range(size)))

    def __repr__(self):
        axes = ", ".join(f"{a}={n}" for a, n in zip(self.axis_names, self.shape))
        return f"Mesh({axes}; devices={list(self.devices)})"
