"""What a user writes and what the client makes of it, in the client's process: the
program representation. ``mesh`` and ``sharding`` (virtual slices, ``P`` specs), ``compiled``
(``shard_map`` functions and their signatures), ``collectives`` (psum & co., and the
threads-per-device reference environment with ``rendezvous``), ``tracer`` and ``ir`` (``@program``
traced into a dataflow program, §4.2 of the paper), ``cost`` (modelled kernel, ICI and DCN time),
``routing`` (``expert_map``), ``replication`` (``check_rep``), ``tree`` (pytrees), ``flat_call``
(a call on pytrees as a function of leaves, by JAX's spec prefixes), ``arguments`` (a call's
arguments checked), ``jax_body`` and ``jax_plan`` (JAX bodies cut at collectives). Imports nothing from the other packages.
"""

from .compiled import CompiledFunction, shard_map
from .cost import DeviceSpec
from .mesh import Device, Mesh
from .routing import RoutedFunction, expert_map
from .sharding import P
from .tracer import program, reference

__all__ = ["CompiledFunction", "Device", "DeviceSpec", "Mesh", "P", "RoutedFunction",
           "expert_map", "program", "reference", "shard_map"]
