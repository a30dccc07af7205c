"""Emulated TPUs: a device is a queue of kernels in scheduler order, an HBM and a timeline.

There are no real TPUs here, so each device is emulated faithfully in the ways that matter to
Pathways: order, non-preemption, modelled time and HBM. What a device runs is ``DeviceWork``
(a kernel). The kernels of every device of a host are run by one ``Executor``
(``pathways.host.executor``), in virtual time; a device made on its own gets an executor of
its own.

- **Order.** The island scheduler gives every kernel a per-device sequence number. Hosts may
  ``enqueue`` kernels from any thread in any order; the device runs seq 0, 1, 2, ...
  strictly, waiting for the next one even when later ones are already queued. ``skip(seq)``
  cancels a seq (a dropped gang) so the device does not wait for it forever.
- **Non-preemptive.** A kernel runs to completion before the next starts. While it waits for
  peers in a collective the device stays occupied, so an inconsistent gang order across
  devices deadlocks exactly as on TPUs; collectives time out (``CollectiveTimeout``).
- **Modelled time.** ``execute(device)`` returns the kernel's modelled duration; the device
  is occupied for ``max(real elapsed, modelled)`` from its start, and the kernel's optional
  ``on_done()`` runs once real time has reached that end: a kernel that publishes its outputs
  there makes them visible at the modelled end, not before.
- **HBM.** ``device.hbm`` (``pathways.host.hbm``) enforces capacity. An allocation that does
  not fit waits for frees (back-pressure); one larger than the whole HBM fails at once.

A failing kernel is recorded and the device carries on with the next seq. Time comes from its
executor's ``Clock`` (``pathways.host.clock``), so tests check the accounting on fake time.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from typing import NamedTuple

from ..errors import PathwaysError
from ..program.cost import DeviceSpec
from .hbm import HbmAccount, HbmGrant
from .timeline import Lane, Slot

log = logging.getLogger("pathways.host.device")

TIMELINE_LENGTH = 10_000
SKIPS_KEPT = 10_000  # skipped sequence numbers remembered, for kernels dispatched after


class KernelRecord(NamedTuple):
    """One kernel's occupation of a device, in the device's clock (a tuple: one is made
    per kernel, so it is cheap to build)."""

    seq: int
    name: str
    labels: dict
    start: float
    end: float
    error: bool
    arrived: float = 0.0  # real time its dispatch reached the host (start >= arrived)
    published: float = 0.0  # real time its outputs were published (>= end)


class Finish(NamedTuple):
    """What a kernel's ``on_done`` is told: its modelled end (when its outputs are
    available), and the HBM taken for them (``output_bytes()``), to ``put(..., grant=)``."""

    end: float
    grant: HbmGrant


class DeviceWork:
    """What a device runs: one kernel shard. ``execute`` is required; every other member has
    a default here, so a kernel subclasses this and overrides what it has.

    The executor calls, in this order: ``input_keys()`` (object-store keys to wait for),
    ``execute(device)`` once it may start (in a greenlet, on the executor's thread; returns
    its modelled seconds), ``output_bytes()`` (HBM its outputs need, taken before
    ``on_done``), then ``on_done(finish)`` at its modelled end, or ``on_error(exc)`` if it
    failed, was skipped or dropped at any point.
    """

    __slots__ = ()  # kernels are made per shard per run: keep theirs small

    name: object = None  # for its KernelRecord (the class's name when None)
    labels: dict | None = None  # for its KernelRecord
    not_before: float = 0.0  # modelled arrival of data pushed to it: it starts no earlier
    limit: float | None = None  # seconds its body may run (None: the executor's default)
    calls: int = 1  # program calls it runs (a fused kernel: several), each the default
    # kernels sharing a gang (its shards on one host) whose ends come together are
    # published by one ``gang.on_done_all([(kernel, finish)])`` instead of each ``on_done``
    gang: object = None

    def input_keys(self) -> list:
        return []

    def execute(self, device: EmulatedDevice) -> float:
        raise NotImplementedError

    def output_bytes(self) -> int:
        return 0

    def on_done(self, finish: Finish) -> None:
        pass

    def on_error(self, exc: BaseException) -> None:
        pass


def device_name(spec: DeviceSpec, device_id: int, name: str | None = None) -> str:
    return name if name is not None else f"{spec.kind}:{device_id}"


class EmulatedDevice:
    """One emulated accelerator: kernels run strictly by seq, by its host's executor."""

    def __init__(self, device_id: int, spec: DeviceSpec | None, name: str | None, executor,
                 own_executor: bool = False):
        """A device run by ``executor`` (``Executor.add_device``, or ``standalone_device`` for
        one with an executor of its own, which ``close`` then stops)."""
        self.device_id = device_id
        self.spec = spec if spec is not None else DeviceSpec()
        self.name = device_name(self.spec, device_id, name)
        self.hbm = HbmAccount(self.spec.hbm_bytes, self.name)
        self._own = own_executor
        self.executor = executor
        self._clock = executor.now
        self._lock = executor.lock
        self.lane = Lane()  # its kernels by seq, in virtual time (pathways.host.timeline)
        self._skips: OrderedDict[int, str] = OrderedDict()  # skipped before their kernel came: why
        self._max_enqueued = -1
        self._closing = False
        self._busy = 0.0
        self._timeline: deque[KernelRecord] = deque(maxlen=TIMELINE_LENGTH)

    def __repr__(self) -> str:
        return f"EmulatedDevice({self.name}, next_seq={self.lane.next_seq})"

    @property
    def current(self) -> Slot | None:
        """The executor's record of the kernel that left the queue (the shard running now)."""
        return self.lane.current

    @property
    def free_at(self) -> float:
        """Modelled end of the previous kernel."""
        return self.lane.free_at

    def __enter__(self) -> EmulatedDevice:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the scheduler's side --------------------------------------------------------------

    def enqueue(self, seq: int, kernel) -> None:
        """Queue ``kernel`` to run as this device's ``seq``-th kernel. Any thread, any order.

        A kernel whose ``seq`` was skipped already (its run failed, and the coordinator's skip
        overtook the kernel's late dispatch) is dropped and told via ``on_error``, as one
        queued when the skip came is."""
        enqueue_all([(self, seq, kernel)])

    def _check(self, seq: int, kernel) -> None:
        """Under the executor's lock: ``kernel`` may be queued at ``seq`` (or was skipped)."""
        if not isinstance(kernel, DeviceWork):
            raise TypeError(f"kernel {kernel!r} is not DeviceWork")
        if seq not in self._skips:
            self._check_new_seq(seq)

    def _queue(self, seq: int, kernel, now: float) -> str | None:
        """Under the executor's lock: queue ``kernel`` at ``seq`` (checked); why it was
        skipped instead, if it was."""
        late = self._skips.pop(seq, None)
        if late is None:
            self.lane.dispatch(seq, kernel, now)
            if seq > self._max_enqueued:
                self._max_enqueued = seq
        return late

    def skip(self, seq: int, reason: str = "") -> bool:
        """Cancel ``seq`` so the device does not wait for it; False if it already ran or was
        skipped. A kernel already queued at ``seq`` is dropped and told via ``on_error``, with
        ``reason`` (why its run failed: the error its caller should see)."""
        reason = str(reason)
        with self._lock:
            skipped, dropped = self.lane.skip(seq)
            if not skipped:
                return False
            self.executor.changed_lane(self)
            if dropped is None:  # its kernel may still come: drop it then
                self._skips[seq] = reason
                if len(self._skips) > SKIPS_KEPT:
                    self._skips.popitem(last=False)
            self._max_enqueued = max(self._max_enqueued, seq)
        self.executor.wake()
        if dropped is not None:
            report_error(dropped, self._skipped_error(seq, reason))
        return True

    def _skipped_error(self, seq: int, reason: str) -> PathwaysError:
        return PathwaysError(f"{self.name}: seq {seq} was skipped"
                             + (f" because {reason}" if reason else ""))

    def close(self, timeout: float = 5.0) -> bool:
        """Stop taking kernels; kernels still queued are told via ``on_error``. Idempotent.

        A device made on its own stops its executor too, waiting up to ``timeout`` for its
        thread, and returns whether it has stopped.
        """
        if self._own:
            return self.executor.close(timeout)
        self.close_queue()
        return True

    def close_queue(self) -> None:
        with self._lock:
            self._closing = True
            dropped = self.lane.drain()
            self.executor.changed_lane(self)
            self.executor.idle.notify_all()
        self.hbm.close()
        for seq, kernel in dropped:
            report_error(kernel, PathwaysError(f"{self.name} closed before seq {seq} ran"))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every seq enqueued (or skipped) so far has run; False on timeout."""
        ex = self.executor
        with ex.idle:
            target = self._max_enqueued
            ex.idle_waiters += 1
            try:
                return ex.idle.wait_for(lambda: self.lane.next_seq > target or
                                        (self._closing and self.current is None), timeout)
            finally:
                ex.idle_waiters -= 1

    # -- the executor's side ---------------------------------------------------------------

    def take_next(self, make=Slot) -> Slot | None:
        """The next seq's kernel leaves the queue as ``make(lane, seq, kernel, enqueued
        at)`` (``Lane.take``), or None if it is not queued (or the device is busy)."""
        lane = self.lane
        with self._lock:
            before = lane.next_seq
            if self._closing:
                lane.pass_skipped()
                slot = None
            else:
                slot = lane.take(make)
            if lane.next_seq != before and self.executor.idle_waiters:
                self.executor.idle.notify_all()
            return slot

    # -- what can be observed --------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The lowest seq that has not finished (the one running now, or the one awaited)."""
        return self.lane.next_seq

    @property
    def busy_seconds(self) -> float:
        """Total occupied time of every finished kernel (not bounded like the timeline)."""
        return self._busy

    @property
    def timeline(self) -> list[KernelRecord]:
        """The last ``TIMELINE_LENGTH`` finished kernels, oldest first."""
        with self._lock:
            return list(self._timeline)

    def records_since(self, since: float | None) -> list[KernelRecord]:
        """The kept kernels that ended after ``since`` (all if None), oldest first; read from
        the newest back, so a frequent reader (the dashboard) costs what is new, not the
        whole timeline (kernels end in order: one runs at a time)."""
        with self._lock:
            if since is None:
                return list(self._timeline)
            out = []
            for record in reversed(self._timeline):
                if record.end <= since:
                    break
                out.append(record)
        out.reverse()
        return out

    def utilization(self, since: float | None = None, until: float | None = None) -> float:
        """Fraction of [since, until] the device was occupied, from the kept timeline.

        ``since`` defaults to the first kept record's start and ``until`` to now. A kernel
        still running is not counted yet.
        """
        records = self.timeline
        if since is None:
            since = records[0].start if records else 0.0
        if until is None:
            until = self._clock()
        if until < since:
            raise ValueError(f"utilization window ends ({until}) before it starts ({since})")
        if until == since:
            return 0.0
        busy = sum(max(0.0, min(r.end, until) - max(r.start, since)) for r in records)
        return busy / (until - since)

    def _check_new_seq(self, seq: int) -> None:
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise ValueError(f"{self.name}: seq must be an int >= 0, got {seq!r}")
        if self._closing:
            raise PathwaysError(f"{self.name} is closed; cannot enqueue seq {seq}")
        lane = self.lane
        if seq < lane.next_seq or lane.runs(seq):
            raise ValueError(f"{self.name}: seq {seq} already ran (next is {lane.next_seq})")
        if seq in lane.queue or seq in lane.skipped:
            raise ValueError(f"{self.name}: seq {seq} is already enqueued or skipped")


def report_error(kernel, error: BaseException) -> None:
    """Tell the kernel it failed (so it can fail its outputs); its own errors are only logged."""
    log.debug("kernel %r failed: %r", kernel, error)
    try:
        kernel.on_error(error)
    except Exception:
        log.exception("on_error of kernel %r raised", kernel)


def finished_all(executor, done) -> None:
    """The executor is done with the current kernel of each ``(device, slot, record)`` of
    ``done`` (devices it runs): record it and free the device, under one lock."""
    with executor.lock:
        for device, slot, record in done:
            device._timeline.append(record)
            device._busy += record.end - record.start
            device.lane.release(slot)
            executor.changed_lane(device)
        if executor.idle_waiters:
            executor.idle.notify_all()


def enqueue_all(items) -> None:
    """Queue each ``(device, seq, kernel)`` of ``items`` (devices of one executor: a gang's
    kernels on one host) under one lock, read of the clock and wake. Any thread. Every item
    is checked before any is queued (a bad seq raises and queues nothing); kernels whose seq
    was skipped already are dropped and told via ``on_error`` (``EmulatedDevice.enqueue``)."""
    executor = items[0][0].executor
    late = []
    wake = False
    with executor.lock:
        for device, seq, kernel in items:
            device._check(seq, kernel)
        now = executor.now()
        for device, seq, kernel in items:
            executor.changed_lane(device)
            reason = device._queue(seq, kernel, now)
            if reason is not None:
                late.append((device, seq, kernel, reason))
            elif seq == device.lane.next_seq:
                wake = True
    for device, seq, kernel, reason in late:
        report_error(kernel, device._skipped_error(seq, reason))
    if wake:
        executor.wake()
