"""The single controller (§4.1), in the user's process: ``Client`` (the session with the
coordinator, the program cache, futures), ``Array`` (a future for a sharded array on the hosts)
and ``trace`` (device timelines as Chrome traces).

A ``Client`` is composed of parts, each in its own module, that the client's other modules
(checkpoints, suspension, traces, arrays) use in its place: ``session`` (``Session``: the I/O),
``cluster_view`` (``ClusterView``: devices, hosts, each slice's newest mapping), ``runs``
(``RunBook`` of ``Run``: the runs in flight), ``program_cache`` (``ProgramCache``), ``ledger``
(``ArrayLedger``: arrays alive, held, freed), ``shards`` (``Shards``: put, generate, fetch,
delete) and ``suspension`` (``Suspensions``: the suspended slices and their lock). ``put`` and
``device_put`` are ``placing``'s (a value or a tree of them onto meshes, each leaf checked
first; trees are read by ``pytrees``).
"""

from .array import Array, NamedSharding
from .client import Client, connect

__all__ = ["Array", "Client", "NamedSharding", "connect"]
