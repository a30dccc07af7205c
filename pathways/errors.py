"""Pathways' errors: one base class, one class per thing that went wrong."""

from __future__ import annotations


class PathwaysError(Exception):
    """Base class of every error the Pathways runtime raises."""


class ShardingError(PathwaysError, ValueError):
    """A partition spec, mesh axis name or shape does not fit the array or the mesh."""


class ResourceError(PathwaysError):
    """The resource manager cannot satisfy a request (too many devices, unknown island...)."""


class DeviceOutOfMemory(PathwaysError):
    """An allocation is larger than a device's whole HBM."""


class CollectiveTimeout(PathwaysError):
    """A collective waited too long for its peers (a deadlock, or a lost peer)."""


class ProgramError(PathwaysError, ValueError):
    """A traced program or a call is malformed: wrong shapes, specs, meshes or arguments."""


class RemoteError(PathwaysError):
    """A computation failed on a host; carries the remote traceback and where it happened."""


class HostLost(PathwaysError):
    """A host stopped answering; its devices are gone."""


class ClientClosed(PathwaysError):
    """The client was closed while a call was using it."""


class ClientGone(PathwaysError):
    """The client that owned a buffer or a run closed or stopped answering."""


class CoordinatorLost(PathwaysError):
    """The coordinator stopped answering; start the cluster again and reconnect."""


class KernelTimeout(PathwaysError):
    """A kernel's body ran longer than its time limit and was interrupted."""
