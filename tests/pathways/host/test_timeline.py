"""The executor's pure core (``pathways.host.timeline``), driven without threads.

A small discrete-event driver plays what the executor does: dispatches arrive at random
times (some seqs skipped, before or after their dispatch), inputs become known at a random
real time with a random modelled ready time, bodies run for a random real time and return a
random modelled cost, HBM admission is granted after a random delay. The records of every
start, end and publication must keep the emulation's rules: a kernel never starts before its
dispatch arrived, nor before its inputs were ready, nor while its device is busy (and seqs run
in order), and nothing it produces is published before its modelled end.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.host.timeline import End, Lane, Slot, Start, Timeline

TIMES = st.floats(0, 5, allow_nan=False)
EPS = 1e-9
SHORT = st.one_of(st.just(0.0), st.floats(0, 2, allow_nan=False))


@dataclass
class Spec:
    """One kernel of the workload (all times in the clock's seconds)."""

    device: int
    seq: int
    dispatch: float  # real time its dispatch reaches the host
    known: float  # real time its inputs are known to be ready
    inputs_at: float  # modelled time they are ready (may be before ``known``)
    real: float  # real time its body takes
    modelled: float  # what its body returns
    admit_delay: float  # how long its outputs wait for HBM (0: room at once)
    skip_at: float | None  # real time its seq is skipped, if it is


@st.composite
def workloads(draw):
    specs = []
    for device in range(draw(st.integers(1, 3))):
        for seq in range(draw(st.integers(0, 6))):
            known = draw(TIMES)
            specs.append(Spec(
                device, seq, draw(TIMES), known, draw(st.floats(0, known + 2)), draw(SHORT),
                draw(SHORT), draw(st.one_of(st.just(0.0), SHORT)),
                draw(st.one_of(st.none(), TIMES))))
    return specs


@dataclass
class Record:
    seq: int
    start: float
    end: float
    began: float  # real time its body went on the thread
    published: float


class Driver:
    """What the executor does with the core's actions, on a simulated clock."""

    def __init__(self, specs: list[Spec]):
        self.specs = {(s.device, s.seq): s for s in specs}
        self.lanes = {s.device: Lane() for s in specs}
        self.timeline = Timeline()
        self.records: dict[int, list[Record]] = {d: [] for d in self.lanes}
        self.dropped: set = set()  # (device, seq) skipped before it ran
        self.early_skips: set = set()  # skipped before their dispatch came
        self.began: dict = {}
        self._events: list = []
        self._tick = itertools.count()
        self.now = 0.0
        for s in specs:
            self._after(s.dispatch, lambda s=s: self._dispatch(s))
            if s.skip_at is not None:
                self._after(s.skip_at, lambda s=s: self._skip(s))

    def _after(self, when, fn) -> None:
        heapq.heappush(self._events, (when, next(self._tick), fn))

    def run(self) -> None:
        while True:
            wake = self.timeline.next_wake()
            times = [self._events[0][0]] if self._events else []
            times += [wake] if wake is not None else []
            if not times:
                return
            self.now = max(self.now, min(times))
            while self._events and self._events[0][0] <= self.now:
                heapq.heappop(self._events)[2]()
            for action in self.timeline.due(self.now):
                self._act(action)
            self._take_all()

    def _dispatch(self, s: Spec) -> None:
        if (s.device, s.seq) in self.early_skips:
            self.dropped.add((s.device, s.seq))  # the device drops a late dispatch
            return
        self.lanes[s.device].dispatch(s.seq, s, self.now)

    def _skip(self, s: Spec) -> None:
        ok, work = self.lanes[s.device].skip(s.seq)
        if ok:
            self.dropped.add((s.device, s.seq))
            if work is None:
                self.early_skips.add((s.device, s.seq))

    def _take_all(self) -> None:
        for lane in self.lanes.values():
            slot = lane.take()
            if slot is not None:
                s = slot.work
                self._after(max(s.known, self.now), lambda slot=slot: self._ready(slot))

    def _ready(self, slot: Slot) -> None:
        if self.timeline.ready(slot, slot.work.inputs_at, self.now):
            self._act(Start(slot))

    def _act(self, action) -> None:
        if isinstance(action, Start):
            slot = action.slot
            self.began[id(slot)] = self.now
            self.timeline.begin(slot, self.now)
            self._after(self.now + slot.work.real, lambda: self._body_returned(slot))
        elif isinstance(action, End):
            slot = action.slot
            if slot.work.admit_delay:
                self.timeline.hold(slot)
                self._after(self.now + slot.work.admit_delay, lambda: self._admitted(slot))
            else:
                self._publish(slot)
        else:
            assert action is None, action

    def _body_returned(self, slot: Slot) -> None:
        self.timeline.ended(slot, self.now, slot.work.modelled)
        if self.timeline.finish(slot, self.now):
            self._act(End(slot))

    def _admitted(self, slot: Slot) -> None:
        self.timeline.admitted(slot, self.now)
        self._publish(slot)

    def _publish(self, slot: Slot) -> None:
        self.records[slot.work.device].append(Record(
            slot.seq, slot.start, slot.end, self.began[id(slot)], self.now))
        slot.lane.release(slot)


@settings(max_examples=300, deadline=None)
@given(specs=workloads())
def test_starts_ends_and_publications_keep_the_emulation_honest(specs):
    driver = Driver(specs)
    driver.run()
    for device, records in driver.records.items():
        ran = [s.seq for s in specs if s.device == device and (device, s.seq) not in
               driver.dropped]
        assert [r.seq for r in records] == ran  # in seq order, skipped ones passed over
        previous = Record(-1, -math.inf, -math.inf, -math.inf, -math.inf)
        for r in records:
            s = driver.specs[(device, r.seq)]
            assert r.start >= s.dispatch  # never before its dispatch arrived
            assert r.start >= s.inputs_at and r.began >= s.known  # nor its inputs were ready
            assert r.start >= previous.end  # nor while its device was busy...
            assert r.began >= previous.published  # ...one kernel at a time
            assert r.began >= r.start  # its body ran once real time reached its start
            assert r.published >= r.end  # nothing published before its modelled end
            # it occupies the device for max(real, modelled), and for a wait for HBM
            occupied = max(s.real, s.modelled)
            assert r.end >= r.start + occupied - EPS
            if not s.admit_delay:  # (real time is measured as a difference: rounding)
                assert math.isclose(r.end, r.start + occupied, abs_tol=EPS)
            # contiguous unless something else held it back: no time lost, none invented
            assert r.start == max(previous.end, s.dispatch, s.inputs_at)
            previous = r


def test_a_kernel_whose_inputs_failed_takes_no_device_time():
    lane, timeline = Lane(), Timeline()
    lane.dispatch(0, "w", 2.0)
    slot = lane.take()
    assert timeline.failed(slot) == End(slot) and slot.start == slot.end == 2.0
    lane.release(slot)
    assert (lane.free_at, lane.next_seq, lane.current) == (2.0, 1, None)


def test_a_skip_drops_a_queued_kernel_and_refuses_what_ran():
    lane = Lane()
    lane.dispatch(1, "one", 0.0)
    assert lane.skip(1) == (True, "one") and lane.skip(1) == (False, None)
    assert lane.skip(2) == (True, None)  # not dispatched yet: passed over when reached
    lane.dispatch(0, "zero", 0.0)
    slot = lane.take()
    assert slot.seq == 0 and lane.skip(0) == (False, None) and lane.take() is None
    slot.end = 1.0
    lane.release(slot)
    lane.dispatch(3, "three", 0.5)
    assert lane.take().seq == 3  # 1 and 2 passed over


def test_a_collective_moves_a_slot_to_its_last_peer_and_counts_the_wait():
    timeline, lane = Timeline(), Lane()
    lane.dispatch(0, "work", 0.0)
    slot = lane.take()
    assert timeline.ready(slot, 0.0, now=1.0)  # starts at 0.0 (dispatch), now is later
    timeline.begin(slot, now=10.0)  # on the thread at real 10.0
    at = timeline.reach_collective(slot, now=10.25)  # 0.25 s of body, real
    assert at == 0.25
    timeline.leave_collective(slot, at, last=1.0, now=10.5)  # peers' values at virtual 1.0
    assert (slot.cursor, slot.waited) == (1.0, 0.75)
    timeline.ended(slot, now=10.75, modelled=0.5)  # 0.25 s more on the thread
    assert slot.end == max(1.25, 0.0 + 0.75 + 0.5)
