"""How long a peer has been silent, counted only over time we were able to hear it.

A peer is declared dead when nothing from it was handled for a timeout. But a message that
waits unread in our own inbox is not the peer's silence: when every core is saturated, our
event loop can be starved or stalled for seconds (or busy with a backlog) while the peer's
heartbeats queue up, and a timer that fires before the inbox is read would then declare a
healthy peer dead exactly when the machine is busiest. So silence is counted only over time we
were listening:

- up to ``heard_until``, the latest time our inbox was found empty (everything that had
  reached us was handled), not up to ``now``; the adapter, which owns the sockets, tells us.
  ``grace`` bounds how far behind ``now`` that may lag, so a dead peer is still declared dead
  within ``timeout + grace`` of running time even if the inbox never empties;
- not over our own stalls: when a tick comes more than ``stall`` seconds late (after
  ``interval`` plus ``stall``), we were not running, and the whole delay is forgiven to every
  peer (``blind``), so that a message our I/O thread has not yet moved into the inbox when we
  wake up does not count as silence either. A tick merely late (busy, not stalled) counts.

Pure: the caller passes times in (``tick``) and keeps each peer's last-seen time.
"""

from __future__ import annotations

STALL = 1.0  # seconds a tick may be late before we take it that we were not running
GRACE_TIMEOUTS = 10  # the grace the cores give: this many of their timeouts


class Listening:
    """When we were able to hear our peers: feed it every tick's time."""

    def __init__(self, grace: float, interval: float = 0.1, stall: float = STALL):
        self.grace, self.interval, self.stall = grace, interval, stall
        self._last_tick: float | None = None

    def tick(self, now: float, heard_until: float | None = None) -> tuple[float, float]:
        """``(blind, listened)`` at this tick: ``blind`` seconds since the previous tick that
        we were not running (add them to every peer's last-seen time); silence counts up to
        ``listened`` (``heard_until``, at most ``grace`` behind ``now``; ``now`` if None)."""
        blind = 0.0
        if self._last_tick is not None:
            late = now - self._last_tick - self.interval
            if late > self.stall:
                blind = late
        self._last_tick = now
        if heard_until is None:
            return blind, now
        return blind, max(min(heard_until, now), now - self.grace)
