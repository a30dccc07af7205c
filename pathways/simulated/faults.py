"""Faults for a simulated cluster, written as text: what ``pathways simulate --faults`` takes.

A plan is a comma-separated list of:

- ``kill:host-N@T``: host N (in start order) dies at T virtual seconds after the cluster is up;
- ``freeze:ROLE@T+S``: role ROLE (``host-1``, ``coordinator``, ``client-0``) stops for S
  virtual seconds from T, as a stopped process;
- ``drop:P``: each message is lost with probability P;
- ``delay:P:MAX``: each message is late, with probability P, by up to MAX seconds.

Message faults are drawn from the cluster's seeded ``random`` as each message leaves, so a
seed and a plan replay the same run.

>>> plan = parse_faults("kill:host-1@2.5, freeze:coordinator@1+0.5, drop:0.001")
>>> plan.kills, plan.freezes, plan.drop
([(1, 2.5)], [('coordinator', 1.0, 0.5)], 0.001)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..sim import RandomFaults

__all__ = ["FaultPlan", "parse_faults"]

_KILL = re.compile(r"kill:host-(\d+)@([0-9.eE+-]+)$")
_FREEZE = re.compile(r"freeze:([\w-]+)@([0-9.eE-]+)\+([0-9.eE-]+)$")
_DROP = re.compile(r"drop:([0-9.eE-]+)$")
_DELAY = re.compile(r"delay:([0-9.eE-]+):([0-9.eE-]+)$")


@dataclass
class FaultPlan:
    """Kills ``(host index, time)``, freezes ``(role, time, seconds)`` and message faults;
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
        return RandomFaults(self.drop, self.delay, self.max_delay)

    def apply(self, cluster) -> None:
        """Schedule the kills and freezes on ``cluster`` (a ``SimCluster`` that is up)."""
        start = cluster.clock()
        for index, t in self.kills:
            if not 0 <= index < len(cluster.hosts):
                raise ValueError(f"kill:host-{index}: the cluster has hosts 0 to"
                                 f" {len(cluster.hosts) - 1}")
            cluster.kill_host(index, at=start + t)
        for role, t, seconds in self.freezes:
            if role not in cluster.roles and not role.startswith("client-"):
                raise ValueError(f"freeze:{role}: no such role (roles: coordinator, host-N,"
                                 " client-N)")
            cluster.freeze(role, seconds, at=start + t)


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
