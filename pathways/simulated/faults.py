"""Faults for a simulated cluster, written as text: what ``pathways simulate --faults`` takes.

A plan is a comma-separated list of:

- ``kill:host-N@T``: the host with id N dies at T virtual seconds after the cluster is up;
- ``freeze:ROLE@T+S``: role ROLE (``host-1``: the host with id 1; ``coordinator``,
  ``client-0``) stops for S virtual seconds from T, as a stopped process;
- ``drop:P``: each message is lost with probability P, as a TCP segment is: it is sent again
  after the retransmission timeout (0.2 s, doubling while its copies are lost too), so it
  arrives late and holds back those behind it on its connection, as over ZeroMQ on TCP;
- ``delay:P:MAX``: each message is late, with probability P, by up to MAX seconds.

Host ids are those ``pathways status`` prints and ``Device.host`` holds (a simulated cluster's
hosts join in start order, so the role of host N is also named ``host-N``). Message faults are
drawn from the cluster's seeded ``random`` as each message leaves, so a
seed and a plan replay the same run.

>>> plan = parse_faults("kill:host-1@2.5, freeze:coordinator@1+0.5, drop:0.001")
>>> plan.kills, plan.freezes, plan.drop
([(1, 2.5)], [('coordinator', 1.0, 0.5)], 0.001)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..sim import RTO, RandomFaults

__all__ = ["FaultPlan", "parse_faults"]

_KILL = re.compile(r"kill:host-(\d+)@([0-9.eE+-]+)$")
_FREEZE = re.compile(r"freeze:([\w-]+)@([0-9.eE-]+)\+([0-9.eE-]+)$")
_HOST = re.compile(r"host-(\d+)$")
_DROP = re.compile(r"drop:([0-9.eE-]+)$")
_DELAY = re.compile(r"delay:([0-9.eE-]+):([0-9.eE-]+)$")


@dataclass
class FaultPlan:
    """Kills ``(host id, time)``, freezes ``(role, time, seconds)`` and message faults;
    times in virtual seconds after the cluster is up."""

    kills: list[tuple[int, float]] = field(default_factory=list)
    freezes: list[tuple[str, float, float]] = field(default_factory=list)
    drop: float = 0.0
    delay: float = 0.0
    max_delay: float = 0.0

    def messages(self) -> RandomFaults | None:
        """The hook that draws the message faults (None: none)."""
        if not (self.drop or self.delay):
            return None
        return RandomFaults(self.drop, self.delay, self.max_delay, retransmit=RTO)

    def apply(self, cluster) -> None:
        """Schedule the kills and freezes on ``cluster`` (a ``SimCluster`` that is up)."""
        start = cluster.clock()
        for host, t in self.kills:
            try:
                cluster.kill_host(host, at=start + t)
            except ValueError as exc:
                raise ValueError(f"kill:host-{host}: {exc}") from None
        for role, t, seconds in self.freezes:
            cluster.freeze(_role(cluster, role), seconds, at=start + t)


def _role(cluster, role: str) -> str:
    """The name of the role ``role`` of a fault plan names: ``host-N`` is the host with id
    N's; others as they are."""
    if m := _HOST.match(role):
        try:
            return f"host-{cluster.host_index(int(m[1]))}"
        except ValueError as exc:
            raise ValueError(f"freeze:{role}: {exc}") from None
    if role not in cluster.roles and not role.startswith("client-"):
        raise ValueError(f"freeze:{role}: no such role (roles: coordinator, host-N, client-N)")
    return role


def parse_faults(text: str) -> FaultPlan:
    """The ``FaultPlan`` written in ``text`` (see the module's text); ``ValueError`` naming
    the part it cannot read."""
    plan = FaultPlan()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            if m := _KILL.match(part):
                plan.kills.append((int(m[1]), _time(m[2])))
            elif m := _FREEZE.match(part):
                plan.freezes.append((m[1], _time(m[2]), _time(m[3])))
            elif m := _DROP.match(part):
                plan.drop = _probability(m[1])
                if plan.drop == 1:  # every copy lost: it would be sent again forever
                    raise ValueError("a message lost every time it is sent never arrives:"
                                     " P < 1")
            elif m := _DELAY.match(part):
                plan.delay, plan.max_delay = _probability(m[1]), _time(m[2])
            else:
                raise ValueError("expected kill:host-N@T, freeze:ROLE@T+S, drop:P or"
                                 " delay:P:MAX")
        except ValueError as exc:
            raise ValueError(f"fault {part!r}: {exc}") from None
    return plan


def _time(text: str) -> float:
    t = float(text)
    if not t >= 0:
        raise ValueError(f"a time must be >= 0, not {text}")
    return t


def _probability(text: str) -> float:
    p = float(text)
    if not 0 <= p <= 1:
        raise ValueError(f"a probability is in [0, 1], not {text}")
    return p
