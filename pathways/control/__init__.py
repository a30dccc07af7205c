"""The control plane, in the coordinator's process (§4.2, §4.4): the ``coordinator``
(clients' requests, hosts' membership, program installation), the ``resource_manager`` (virtual
slices onto physical devices) and one gang ``scheduler`` per island.
"""

from .coordinator import Coordinator

__all__ = ["Coordinator"]
