"""The emulated devices' timelines in virtual time: a pure core (no threads, greenlets or clock
reads; ``now`` is always passed in).

This is where the emulation keeps the paper's semantics. A kernel starts at
``max(device free, dispatch arrival, inputs ready)``, one at a time per device, in the
device's seq order (a skipped seq is passed over), non-preemptibly; it occupies the device
for ``max(real body time, modelled time)`` plus the modelled time it waited for peers in
collectives, from when its host's own work for it (compiling its program) is done; nothing
it produces is published before the clock passes its modelled end; and a full HBM makes it
hold its device until its outputs are admitted.

One ``Lane`` per device holds its kernels by seq, the one that left the queue (``current``,
a ``Slot``) and when the device is free again (``free_at``); it has no lock (the device
calls it under its own, since kernels are dispatched from any thread). One ``Timeline`` per
executor says when each slot may start and when it ends. The caller feeds it events and
carries out the actions it returns:

    Lane.dispatch / Lane.skip                     a kernel's dispatch arrived / its seq dropped
    Lane.take()                -> Slot            the device is idle: its next seq leaves the queue
    Timeline.ready(slot, at)   -> now?            its inputs are ready (modelled time ``at``)
    Timeline.begin / ended                        its body went on the thread / returned
    Timeline.host_work                            its body compiled: the device was idle
    Timeline.reach_collective / leave_collective  its body waits for peers in a collective
    Timeline.leave_batch                          its host ran a segment for several devices
    Timeline.finish(slot)      -> now?            its body is done for good
    Timeline.hold / admitted                      its outputs wait for HBM / got it
    Lane.release(slot)                            published: the device is free at its end
    Timeline.due(now)          -> [Start | End]   what was deferred and whose time has come
    Timeline.next_wake()       -> float | None    when to call ``due`` next

``ready`` and ``finish`` say True when their action is due at once (run the body now; the
modelled end has passed: take HBM for the outputs, then publish), else they keep it for
``due`` as a ``Start`` or an ``End`` (no object is made for the common case: this runs for
every kernel). The executor (``pathways.host.executor``) is the thin layer that does so.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

__all__ = ["End", "Lane", "Slot", "Start", "Timeline"]


class Slot:
    """A kernel that left its lane's queue, and its times (seconds of the executor's clock).

    ``start`` is fixed by ``Timeline.ready``; while the body runs, ``cursor`` is its virtual
    time (the start, plus real time on the thread since ``segment``, plus the modelled waits
    of its collectives, which move ``cursor`` and add to ``waited``); ``end`` is fixed by
    ``Timeline.ended`` and moved on by a wait for HBM (``held``)."""

    __slots__ = ("lane", "seq", "work", "arrived", "start", "end", "cursor", "segment",
                 "waited", "held", "hosted")

    def __init__(self, lane: Lane, seq: int, work, arrived: float):
        self.lane, self.seq, self.work, self.arrived = lane, seq, work, arrived
        self.start = self.end = self.cursor = self.segment = 0.0
        self.waited = 0.0  # modelled time spent waiting for peers in collectives
        self.held = False  # past its end, but its outputs did not fit: it keeps the device
        self.hosted = 0.0  # its body's time on host work (compiling): not on its device

    @property
    def began(self) -> float:
        """When its device began to work on it: its start, after the host work its body did
        (compiling its program), which leaves the device idle."""
        return self.start + self.hosted


class Lane:
    """One device's kernels in seq order (see the module docstring); not thread-safe."""

    __slots__ = ("queue", "skipped", "next_seq", "current", "free_at")

    def __init__(self):
        self.queue: dict[int, tuple] = {}  # seq -> (work, dispatch arrival)
        self.skipped: set[int] = set()  # seqs to pass over
        self.next_seq = 0  # the lowest seq not finished
        self.current: Slot | None = None
        self.free_at = float("-inf")  # modelled end of the previous kernel

    def dispatch(self, seq: int, work, arrived: float) -> None:
        self.queue[seq] = (work, arrived)

    def skip(self, seq: int):
        """Pass over ``seq``: (False, None) if it ran, runs or was skipped already, else
        (True, the work dropped from the queue or None if it was not dispatched yet)."""
        if seq < self.next_seq or self.runs(seq) or seq in self.skipped:
            return False, None
        self.skipped.add(seq)
        dropped = self.queue.pop(seq, None)
        return True, None if dropped is None else dropped[0]

    def runs(self, seq: int) -> bool:
        return self.current is not None and self.current.seq == seq

    def take(self, make=Slot) -> Slot | None:
        """The next seq leaves the queue as ``make(lane, seq, work, arrived)`` (a ``Slot``),
        once the device is idle and that seq was dispatched; skipped seqs are passed over."""
        if self.current is not None:
            return None
        self.pass_skipped()
        item = self.queue.pop(self.next_seq, None)
        if item is None:
            return None
        self.current = make(self, self.next_seq, *item)
        return self.current

    def pass_skipped(self) -> None:
        """Move ``next_seq`` past skipped seqs (the device is idle)."""
        while self.next_seq in self.skipped:
            self.skipped.discard(self.next_seq)
            self.next_seq += 1

    def release(self, slot: Slot) -> None:
        """``slot`` was published: the device is free from its end, for the next seq."""
        self.free_at = slot.end
        self.current = None
        self.next_seq = slot.seq + 1

    def drain(self) -> list[tuple[int, object]]:
        """Empty the queue: [(seq, work)] in seq order (the device closes)."""
        dropped = sorted((seq, work) for seq, (work, _) in self.queue.items())
        self.queue.clear()
        return dropped


class Start(NamedTuple):
    """Run ``slot``'s body now: real time has reached its start."""

    slot: Slot


class End(NamedTuple):
    """``slot``'s modelled end has passed: admit its outputs' HBM, then publish."""

    slot: Slot


class Timeline:
    """When the slots of every lane of one executor start and end (see the module
    docstring): events in, ``Start``/``End`` out, deferred ones kept on one heap."""

    def __init__(self):
        self._heap: list = []
        self._tick = itertools.count()  # ties: first scheduled, first due

    def ready(self, slot: Slot, inputs_at: float, now: float) -> bool:
        """Its inputs are ready at modelled time ``inputs_at``: it starts at the latest of
        that, its dispatch arrival and its device's free time -- now (True), or later (a
        ``Start`` from ``due``)."""
        slot.start = max(slot.lane.free_at, slot.arrived, inputs_at)
        return self._at(slot.start, Start, slot, now)

    def failed(self, slot: Slot) -> End:
        """It failed before it could start (a missing input): it takes no device time."""
        slot.start = slot.end = max(slot.lane.free_at, slot.arrived)
        return End(slot)

    def begin(self, slot: Slot, now: float) -> None:
        """Its body goes on the thread at real time ``now``."""
        slot.cursor = slot.start
        slot.segment = now

    def ended(self, slot: Slot, now: float, modelled: float) -> None:
        """Its body returned (or raised) at real time ``now``, its modelled time being
        ``modelled``: it occupies the device for the longer of the two, plus its waits,
        from ``began``."""
        slot.cursor += now - slot.segment
        slot.end = max(slot.cursor, slot.began + slot.waited + modelled)

    def host_work(self, slot: Slot, seconds: float, now: float) -> float:
        """Its body spent ``seconds`` of its time on the thread, until real time ``now``, on
        host work (compiling its program): the device waited for it, idle, so its kernel
        begins that much later. (A body compiles before its first collective; host work later
        on is counted the same way, as if it came first.) Returns its virtual time at the
        end of that work (when the program was ready)."""
        slot.hosted += max(seconds, 0.0)
        return slot.cursor + now - slot.segment

    def host_work_until(self, slot: Slot, ready_at: float, now: float) -> None:
        """Its body, on the thread at real time ``now``, needs its program, which its host
        compiled (for another kernel) until virtual time ``ready_at``: if that is later than
        its own time there, it waited for the compile, idle, as if it had compiled itself."""
        gap = ready_at - (slot.cursor + now - slot.segment)
        if gap > 0:
            slot.hosted += gap
            slot.cursor += gap

    def reach_collective(self, slot: Slot, now: float) -> float:
        """Its body reached a collective at real time ``now``: its virtual time there (the
        real time on the thread since it last went on, added)."""
        slot.cursor += now - slot.segment
        return slot.cursor

    def leave_collective(self, slot: Slot, at: float, last: float, now: float) -> None:
        """It reached a collective at virtual time ``at`` and its peers' values were all there
        at ``last``: it goes on from the later of the two (the difference counts as waiting,
        which occupies its device), back on the thread at real time ``now``."""
        slot.cursor = max(at, last)
        slot.waited += slot.cursor - at
        slot.segment = now

    def leave_batch(self, slot: Slot, at: float, share: float, now: float) -> None:
        """It reached a computation its host ran once for several devices at virtual time
        ``at``; its share of that computation's real time was ``share``: it goes on from
        ``at + share`` (its wait for the others to arrive is not its device's: they ran side
        by side), back on the thread at real time ``now``."""
        slot.cursor = at + share
        slot.segment = now

    def finish(self, slot: Slot, now: float) -> bool:
        """Its body is done for good: True if its modelled end has passed, else an ``End``
        from ``due`` later."""
        return self._at(slot.end, End, slot, now)

    def hold(self, slot: Slot) -> None:
        """Its outputs do not fit in HBM yet: it keeps its device until ``admitted``."""
        slot.held = True

    def admitted(self, slot: Slot, now: float) -> None:
        """Its outputs got their HBM at ``now``: a held slot occupied its device until then."""
        if slot.held:
            slot.end, slot.held = max(slot.end, now), False

    def due(self, now: float) -> list:
        """The deferred ``Start``s and ``End``s whose time has come, in time order."""
        heap, out = self._heap, []
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        return out

    def next_wake(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def _at(self, when: float, action, slot: Slot, now: float) -> bool:
        if when <= now:
            return True
        heapq.heappush(self._heap, (when, next(self._tick), action(slot)))
        return False
