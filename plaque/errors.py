"""Plaque's errors: one base class, one class per thing that went wrong."""

from __future__ import annotations


class PlaqueError(Exception):
    """Base class of every error Plaque raises."""


class GraphError(PlaqueError):
    """The graph is malformed: unknown node, cycle, mismatched shard counts, bad placement."""


class SinkError(PlaqueError):
    """A sink could not write or publish a run's output (see ``plaque.sinks``)."""


class SourceError(PlaqueError):
    """An input file could not be read as planned: it changed since its parts were made, or
    it cannot be opened or decoded (see ``plaque.readers``). ``path`` names the file and
    ``where`` the place in it (``"byte N"``, ``"row group N"``), when known."""

    def __init__(self, path: str, detail: str, where: str | None = None):
        self.path, self.detail, self.where = path, detail, where
        at = f" at {where}" if where else ""
        super().__init__(f"{path}{at}: {detail}")

    def __reduce__(self):  # pickle as its fields, not as the formatted message
        return (SourceError, (self.path, self.detail, self.where))


class OperatorError(PlaqueError):
    """An operator raised on a worker; carries where it happened and the remote traceback."""

    def __init__(self, node: str, shard: int, worker: int, timestamp, message: str, remote_tb: str,
                 origin=None):
        self.node, self.shard, self.worker, self.timestamp = node, shard, worker, timestamp
        self.remote_traceback = remote_tb
        self.origin = origin  # what the operator's exception said of its own origin, if any
        super().__init__(
            f"operator {node!r} shard {shard} on worker {worker} failed at t={timestamp}:"
            f" {message}\n--- remote traceback ---\n{remote_tb}"
        )

    def __reduce__(self):
        args = (self.node, self.shard, self.worker, self.timestamp, "", self.remote_traceback,
                self.origin)
        return (_rebuild_operator_error, (args, str(self)))


def _rebuild_operator_error(args, text):
    err = OperatorError(*args)
    err.args = (text,)
    return err


class WorkerLost(PlaqueError):
    """A worker stopped answering (crashed, killed or partitioned)."""

    def __init__(self, worker: int, detail: str = ""):
        self.worker, self.detail = worker, detail
        super().__init__(f"worker {worker} lost{': ' + detail if detail else ''}")

    def __reduce__(self):  # pickle as (worker, detail), not as the formatted message
        return (WorkerLost, (self.worker, self.detail))


class CoordinatorLost(PlaqueError):
    """The coordinator stopped answering; the worker or driver cannot go on."""


class ProtocolError(PlaqueError):
    """A message on the wire is malformed, truncated or of an unknown version."""


class ClusterClosed(PlaqueError):
    """The cluster was closed while a call was waiting on it."""
