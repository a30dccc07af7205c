"""The real Pathways roles on the simulator (``pathways.sim``): ``pw.local_cluster(simulate=True)``.

``SimCluster`` (``pathways.simulated.cluster``) runs the coordinator, hosts and clients of a
cluster as roles of one discrete-event simulation in virtual time; ``SimSession``
(``.session``) is a client's session on it and ``sockets`` its clients', data and ICI ports.
"""

from .cluster import HOST_NETWORK, SimCluster
from .session import InlineExecutor, SimSession, UserCpu

__all__ = ["HOST_NETWORK", "InlineExecutor", "SimCluster", "SimSession",
           "UserCpu"]
