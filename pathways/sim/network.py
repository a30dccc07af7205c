"""Modelled message times for the simulated cluster: links with latency, bandwidth and FIFO
order, and seeded faults (``pathways.sim.transport`` carries Plaque's messages over them).

A ``Link`` carries one message's bytes at a time, then the message travels ``latency`` more
(store and forward): a message of n bytes handed to the link at t goes on the wire when the
previous one is off it (the link is busy while bytes are on it), stays n / bandwidth, and
arrives ``latency`` later. Arrivals keep the order of sends: a message held up by a fault
holds back those behind it, as on one TCP connection (ZeroMQ over tcp) -- none overtakes.

Worked example, latency 0.5 s, 4 bytes/s: 2 bytes at t=0 are on the wire 0..0.5 and arrive at
1.0; 4 bytes at t=0.25 wait for the wire, are on it 0.5..1.5 and arrive at 2.0.

Faults are a hook, ``faults(src, dst, nbytes, rng) -> Fault``, drawn from the simulation's
seeded ``random`` when a message leaves: a dropped message never runs and does not occupy the
link; a delayed one arrives that much later. ``RandomFaults`` with
``retransmit`` models losses on a TCP connection instead (what ZeroMQ runs over): a lost
message is sent again after the retransmission timeout, so it arrives late, never not at all.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Fault", "FaultHook", "Link", "RandomFaults", "RTO"]

RTO = 0.2  # seconds TCP waits for an ack before it sends a segment again (Linux's minimum)


class Fault(NamedTuple):
    """What befalls one message: lost (``drop``), or ``delay`` extra seconds in transit."""

    drop: bool = False
    delay: float = 0.0


FaultHook = Callable[[str, str, int, random.Random], Fault]
NO_FAULT = Fault()


class Link:
    """One direction between two endpoints: latency (s), bandwidth (bytes/s), FIFO."""

    def __init__(self, latency: float, bandwidth: float = math.inf):
        if not (latency >= 0 and bandwidth > 0):
            raise ValueError(f"a link needs latency >= 0 and bandwidth > 0, not "
                             f"{latency!r} and {bandwidth!r}")
        self.latency, self.bandwidth = latency, bandwidth
        self.free_at = 0.0  # when the last message's bytes are off the wire
        self.last_arrival = 0.0
        self.messages = self.bytes = 0

    def transmit(self, t: float, nbytes: int, extra_delay: float = 0.0) -> float:
        """Put ``nbytes`` on the link at ``t``; the time they arrive at the other end."""
        start = max(t, self.free_at)
        self.free_at = start + nbytes / self.bandwidth
        arrival = max(self.free_at + self.latency + extra_delay, self.last_arrival)
        self.last_arrival = arrival
        self.messages += 1
        self.bytes += nbytes
        return arrival

    def __repr__(self) -> str:
        return f"Link(latency={self.latency!r}, bandwidth={self.bandwidth!r})"


class RandomFaults:
    """Seeded faults on every message: lost with probability ``drop``; else, with probability
    ``delay``, late by uniform(0, ``max_delay``) seconds. Draws nothing when both are 0, so a
    fault-free network leaves the random stream as it is.

    ``retransmit``: a lost message is not lost for good but sent again ``retransmit`` seconds
    later (TCP's retransmission timeout, ``RTO``), and again after twice that if that copy is
    lost too (with probability ``drop``), and so on: it is late by the sum."""

    def __init__(self, drop: float = 0.0, delay: float = 0.0, max_delay: float = 0.0, *,
                 retransmit: float | None = None):
        if not (0 <= drop <= 1 and 0 <= delay <= 1 and max_delay >= 0):
            raise ValueError(f"probabilities in [0, 1] and max_delay >= 0, not {drop!r}, "
                             f"{delay!r}, {max_delay!r}")
        if retransmit is not None and not (retransmit > 0 and drop < 1):
            raise ValueError(f"retransmit needs a timeout > 0 and drop < 1, not {retransmit!r}"
                             f" and {drop!r}")
        self.drop, self.delay, self.max_delay = drop, delay, max_delay
        self.retransmit = retransmit
        self.resent = 0  # messages lost and sent again

    def __call__(self, src: str, dst: str, nbytes: int, rng: random.Random) -> Fault:
        if not (self.drop or self.delay):
            return NO_FAULT
        # Always three draws, so changing one rate does not shift the others' stream.
        lost, late, amount = rng.random(), rng.random(), rng.random()
        if lost < self.drop:
            return Fault(drop=True) if self.retransmit is None else self._resent(rng)
        return Fault(delay=amount * self.max_delay) if late < self.delay else NO_FAULT

    def _resent(self, rng: random.Random) -> Fault:
        """The lost message's copies until one gets through, each timeout twice the last."""
        self.resent += 1
        wait = late = self.retransmit
        while rng.random() < self.drop:  # this copy is lost too
            wait *= 2
            late += wait
        return Fault(delay=late)
