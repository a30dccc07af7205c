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
  A loop held up by its own work (a worker's long operator) is busy, not stalled, yet its
  ticks come late too: where a thread that the loop's work does not hold up measures the
  process's stalls (``StallMeter``), the tick takes those (``stalled``) instead, so a worker
  busy in back-to-back operators still notices a dead coordinator within its timeout.

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
        self._stalled: float | None = None  # the meter's reading at the previous tick

    def tick(self, now: float, heard_until: float | None = None,
             stalled: float | None = None) -> tuple[float, float]:
        """``(blind, listened)`` at this tick: ``blind`` seconds since the previous tick that
        we were not running (add them to every peer's last-seen time); silence counts up to
        ``listened`` (``heard_until``, at most ``grace`` behind ``now``; ``now`` if None).
        ``stalled``: the process's stalled seconds so far by a ``StallMeter`` (None: this
        tick's own lateness says)."""
        blind = 0.0
        if stalled is not None:
            blind = max(stalled - self._stalled, 0.0) if self._stalled is not None else 0.0
            self._stalled = stalled if self._stalled is None else max(stalled, self._stalled)
        elif self._last_tick is not None:
            late = now - self._last_tick - self.interval
            if late > self.stall:
                blind = late
        self._last_tick = now
        if heard_until is None:
            return blind, now
        return blind, max(min(heard_until, now), now - self.grace)


class StallMeter:
    """Seconds the process was not running, from the wake-ups of a thread that nothing else
    holds up (a worker's heartbeat thread, which naps ``interval`` seconds at a time): a
    wake-up more than ``stall`` seconds late means the whole process was stopped or starved
    for that long, while a loop merely busy in its own work leaves the thread on time.

    ``woke`` runs on that thread, ``stalled`` on any other: the state is one tuple, replaced
    in one store. A stall still under way (the thread not woken yet) counts already, so a
    loop that resumes before the thread does still forgives it.
    """

    def __init__(self, start: float, interval: float, stall: float = STALL):
        self.interval, self.stall = interval, stall
        self._seen = (0.0, start)  # (stalled seconds counted, the last wake-up)

    def woke(self, now: float) -> None:
        self._seen = (self.stalled(now), now)

    def stalled(self, now: float) -> float:
        counted, last = self._seen
        late = now - last - self.interval
        return counted + late if late > self.stall else counted
