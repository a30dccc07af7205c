"""What the coordinator tells its driver: the events of ``CoordinatorCore.take_events``.

The driver (``cluster.Cluster``) settles the futures of installs, runs and counter requests
from them, dispatching on the event's class, and hands every event to its listeners (an
embedding runtime such as the Pathways coordinator follows membership there).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CountersReceived", "Event", "Installed", "Membership", "RunDone", "RunFailed",
    "UserMessage",
]


class Event:
    """Base of every coordinator event."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Membership(Event):
    """The live workers changed (one joined or was lost): ``workers`` are the live ids."""

    workers: list[int]


@dataclass(frozen=True, slots=True)
class Installed(Event):
    """Graph ``gid`` is installed on all of its workers, or failed to (``error``)."""

    gid: int
    error: Exception | None


@dataclass(frozen=True, slots=True)
class RunDone(Event):
    """Run ``t`` of graph ``gid`` is over: nothing remains at ``t`` anywhere."""

    gid: int
    t: object
    result: object  # coordinator.RunResult


@dataclass(frozen=True, slots=True)
class RunFailed(Event):
    """Run ``t`` of graph ``gid`` failed: an operator raised, or a worker it needs was lost."""

    gid: int
    t: object
    error: Exception


@dataclass(frozen=True, slots=True)
class RunSettled(Event):
    """Failed run ``t`` of graph ``gid`` is over everywhere: no worker will run an operator
    for it any more (its progress completed, or the graph broke with a lost worker and was
    uninstalled). What the run left behind can be cleaned up now."""

    gid: int
    t: object


@dataclass(frozen=True, slots=True)
class CountersReceived(Event):
    """``worker``'s traffic counters, answering counters request ``request``."""

    request: int
    worker: int
    snapshot: dict


@dataclass(frozen=True, slots=True)
class UserMessage(Event):
    """A payload from worker ``sender`` for the embedding runtime (not for graphs)."""

    sender: int
    payload: object
