"""The control plane, in the coordinator's process (§4.2, §4.4): the sans-IO ``plane``
(clients' requests, hosts' membership, program installation, runs, client liveness) behind the
thin ``coordinator`` adapter (sockets, the Plaque cluster, the clock), the
``resource_manager`` (virtual slices onto physical devices) and one gang ``scheduler`` per
island.
"""

from .coordinator import Coordinator
from .plane import ControlPlane

__all__ = ["ControlPlane", "Coordinator"]
