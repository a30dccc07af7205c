"""The single controller (§4.1), in the user's process: ``Client`` (the session with the
coordinator, the program cache, futures), ``Array`` (a future for a sharded array on the hosts)
and ``trace`` (device timelines as Chrome traces).
"""

from .array import Array, NamedSharding
from .client import Client, connect

__all__ = ["Array", "Client", "NamedSharding", "connect"]
