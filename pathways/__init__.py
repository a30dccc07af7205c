"""Pathways, open: a single-controller runtime for sharded programs on emulated TPU islands.

>>> with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as cluster:
...     with pw.connect(cluster.address) as client:
...         mesh = client.mesh((2, 4), ("data", "model"))
...         step = pw.shard_map(lambda x: pw.psum(x, "data") + 1.0, mesh, P("data"), P("data"))
...         y = step(client.put(np.ones((4, 4)), mesh, P("data")))   # a future, at once
...         print(y.result())
"""

from .client.array import Array, NamedSharding
from .client.client import Client, connect
from .cluster import local_cluster
from .errors import (
    CheckpointError,
    ClientClosed,
    ClientGone,
    CollectiveTimeout,
    CoordinatorLost,
    DeviceOutOfMemory,
    HostLost,
    PathwaysError,
    ProgramError,
    RemoteError,
    ResourceError,
    ShardingError,
    SliceSuspended,
)
from .lib import moe
from .lib.pipeline import Pipeline, Stage
from .program import compiled as compiled  # as before: pw.compiled.Aval
from .program import jax_body as jax_body  # as before: pw.jax_body.INSTALL_HINT
from .program.collectives import (
    all_gather,
    all_to_all,
    axis_index,
    pmax,
    pmean,
    pmin,
    ppermute,
    psum,
    psum_scatter,
)
from .program.compiled import CompiledFunction, shard_map
from .program.cost import DeviceSpec
from .program.mesh import Device, Mesh
from .program.routing import RoutedFunction, expert_map
from .program.sharding import P
from .program.tracer import program, reference

__all__ = [
    "Array", "CheckpointError", "Client", "ClientClosed", "ClientGone", "CollectiveTimeout",
    "CompiledFunction", "CoordinatorLost", "Device",
    "DeviceOutOfMemory", "DeviceSpec", "HostLost", "Mesh", "NamedSharding", "P", "PathwaysError",
    "Pipeline", "ProgramError", "RemoteError", "ResourceError", "RoutedFunction",
    "ShardingError", "SliceSuspended", "Stage", "all_gather", "all_to_all", "axis_index", "connect",
    "expert_map", "local_cluster", "moe", "pmax", "pmean", "pmin", "ppermute", "program", "psum",
    "psum_scatter", "reference",
    "shard_map",
]
