"""Pathways' errors: one base class, one class per thing that went wrong."""

from __future__ import annotations

import builtins


class PathwaysError(Exception):
    """Base class of every error the Pathways runtime raises."""


class ShardingError(PathwaysError, ValueError):
    """A partition spec, mesh axis name or shape does not fit the array or the mesh."""


class ResourceError(PathwaysError):
    """The resource manager cannot satisfy a request (too many devices, unknown island...)."""


class DeviceOutOfMemory(PathwaysError):
    """An allocation is larger than a device's whole HBM, or (a generate or load) found no
    room beside the live arrays within its timeout."""


class CollectiveTimeout(PathwaysError):
    """A collective waited too long for its peers (a deadlock, or a lost peer)."""


class ProgramError(PathwaysError, ValueError):
    """A traced program or a call is malformed: wrong shapes, specs, meshes or arguments."""


class RemoteError(PathwaysError):
    """A computation failed on a host; carries the remote traceback and where it happened.

    When the failure was a kernel's own exception, ``function``, ``device``, ``host``,
    ``traceback`` (the remote one, as text) and ``exc_type`` (its ``(module, name)``) say so;
    each is None for a failure of the runtime itself (a lost transfer, a failed run), which
    carries its message only. ``origin`` is the same as one dict. The client raises such an
    error as an exception of the original class too when that is a standard one
    (``as_raised``): ``except ValueError`` and ``except pw.RemoteError`` both catch it.

    >>> try:
    ...     step(x).result()
    ... except pw.RemoteError as err:
    ...     print(err.function, err.device, err.host)
    """

    def __init__(self, message: str = "", origin: dict | None = None):
        super().__init__(message)
        self.origin = origin

    def _field(self, name: str):
        return (self.origin or {}).get(name)

    function = property(lambda self: self._field("function"), doc="the kernel's function")
    device = property(lambda self: self._field("device"), doc="the device it failed on")
    host = property(lambda self: self._field("host"), doc="that device's host")
    traceback = property(lambda self: self._field("traceback"), doc="the remote traceback")
    exc_type = property(lambda self: self._field("type"), doc="(module, name) of its exception")

    def __reduce__(self):  # keeps ``origin`` across processes
        return (type(self), (str(self), self.origin))

    @classmethod
    def from_origin(cls, origin: dict) -> RemoteError:
        """The error a kernel's exception becomes: where it happened, then its remote
        traceback as lines."""
        name = origin["type"][1]
        return cls(f"{origin['function']} failed on device {origin['device']}"
                   f" ({origin['host']}): {name}: {origin['message']}\n--- remote traceback"
                   f" ---\n{origin['traceback'].rstrip()}", origin)


class HostLost(PathwaysError):
    """A host stopped answering; its devices are gone."""


class SliceSuspended(PathwaysError):
    """The slice was suspended (by ``client.suspend`` or by the coordinator for a client of
    higher priority); ``client.resume(mesh)`` maps it and its arrays onto devices again."""


class CheckpointError(PathwaysError):
    """A checkpoint on disk is missing, damaged or not what its metadata says (a chunk file
    absent, of the wrong size or failing its checksum; metadata that does not parse; an array
    name that leaves the checkpoint's directory); the message names the file."""


class ClientClosed(PathwaysError):
    """The client was closed while a call was using it."""


class ClientGone(PathwaysError):
    """The client that owned a buffer or a run closed or stopped answering."""


class CoordinatorLost(PathwaysError):
    """The coordinator stopped answering; start the cluster again and reconnect."""


class KernelTimeout(PathwaysError):
    """A kernel's body ran longer than its time limit and was interrupted."""


_RAISED: dict[type, type] = {}  # standard exception class -> Remote<class>(RemoteError, class)


def received(err, of_run: bool) -> BaseException:
    """The one boundary where an error that came over the wire (from the coordinator or a
    host) becomes what the client raises. A Pathways error keeps its class, a kernel's own
    exception its standard class too (``as_raised``); the failure of a run for any other
    reason becomes a ``RemoteError``; a refused request keeps its exception (a bad argument's
    ``ValueError``...); anything that is no exception at all is said as a ``PathwaysError``."""
    if isinstance(err, PathwaysError) or (isinstance(err, Exception) and not of_run):
        return as_raised(err)
    return RemoteError(str(err)) if of_run else PathwaysError(str(err))


def as_raised(err: BaseException) -> BaseException:
    """``err`` as the client raises it: a RemoteError whose kernel raised a standard
    exception (``ValueError``, ``ZeroDivisionError``, ``KeyError``...) becomes an instance of
    a class deriving from both, so either ``except`` catches it."""
    origin = getattr(err, "origin", None)
    if not isinstance(err, RemoteError) or not origin or origin["type"][0] != "builtins":
        return err
    cls = getattr(builtins, origin["type"][1], None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)) or \
            issubclass(cls, PathwaysError):
        return err
    try:
        raised = _RAISED.get(cls)
        if raised is None:
            raised = _RAISED[cls] = type(f"Remote{cls.__name__}", (RemoteError, cls), {
                "__module__": __name__, "__doc__": f"A kernel raised {cls.__name__} on a host.",
                "__str__": RemoteError.__str__,
                "__reduce__": lambda e: (RemoteError, (str(e), e.origin))})  # made here only
        return raised(str(err), origin)
    except TypeError:  # a class that cannot be combined or built from a message alone
        return err
