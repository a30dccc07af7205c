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
- **HBM.** ``device.hbm`` enforces capacity. An allocation that does not fit waits for
  frees (back-pressure); one larger than the whole HBM fails at once.

A failing kernel is recorded and the device carries on with the next seq. Time comes from its
executor's ``Clock`` (``pathways.host.clock``), so tests check the accounting on fake time.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple

from ..errors import DeviceOutOfMemory, PathwaysError
from ..program.cost import DeviceSpec
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


class HbmAccount:
    """Bytes allocated in one device's HBM. Thread-safe; a full HBM makes allocations wait."""

    def __init__(self, capacity: int, name: str = "device"):
        if capacity < 0:
            raise ValueError(f"HBM capacity must be >= 0, got {capacity!r}")
        self.capacity = int(capacity)
        self.name = name
        self._used = 0
        self._peak = 0
        self._waiting = 0
        self._closed = False
        self._cond = threading.Condition(threading.Lock())  # not re-entered: a plain lock
        self.on_free: Callable[[], object] | None = None  # told after every free
        self.frees = 0  # how many frees so far (lets a failed try_allocate see one it missed)

    def try_allocate(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit now; False if not. DeviceOutOfMemory if ``nbytes``
        exceeds the whole capacity (it never fits)."""
        nbytes = self._check_fits(nbytes)
        with self._cond:
            if self._closed or self._used + nbytes > self.capacity:
                return False
            self._used += nbytes
            self._peak = max(self._peak, self._used)
            return True

    def _check_fits(self, nbytes) -> int:
        nbytes = _check_nbytes(nbytes)
        if nbytes > self.capacity:
            raise DeviceOutOfMemory(f"{self.name}: cannot allocate {nbytes} bytes, more than "
                                    f"its whole HBM capacity of {self.capacity} bytes")
        return nbytes

    def allocate(self, nbytes: int, timeout: float | None = None) -> None:
        """Take ``nbytes``, waiting up to ``timeout`` seconds (None: forever) for room.

        Raises DeviceOutOfMemory at once if ``nbytes`` exceeds the whole capacity, or when
        the wait times out. Waiters are served first-fit, not first-come: a small request
        that fits goes ahead of a large one still waiting, which avoids head-of-line
        deadlocks but can starve a large request while small ones keep coming.
        """
        nbytes = self._check_fits(nbytes)
        with self._cond:
            if not self._closed and self._used + nbytes <= self.capacity:  # room: no wait
                self._used += nbytes
                self._peak = max(self._peak, self._used)
                return
            self._waiting += 1
            try:
                fits = self._cond.wait_for(
                    lambda: self._closed or self._used + nbytes <= self.capacity, timeout)
            finally:
                self._waiting -= 1
            if self._closed:
                raise PathwaysError(f"{self.name} is closed; cannot allocate {nbytes} bytes")
            if not fits:
                raise DeviceOutOfMemory(
                    f"{self.name}: timed out waiting {timeout}s for {nbytes} bytes of HBM "
                    f"({self._used} of {self.capacity} bytes in use)")
            self._used += nbytes
            self._peak = max(self._peak, self._used)

    def free(self, nbytes: int) -> None:
        """Give back ``nbytes`` and wake waiting allocations. Freeing more than used is a bug."""
        nbytes = _check_nbytes(nbytes)
        with self._cond:
            if nbytes > self._used:
                raise AssertionError(f"{self.name}: freeing {nbytes} bytes but only "
                                     f"{self._used} are allocated (double free?)")
            self._used -= nbytes
            self.frees += 1
            if self._waiting:
                self._cond.notify_all()
        if self.on_free is not None:
            self.on_free()

    def close(self) -> None:
        """Fail every waiting and future allocation; frees still work (for clean-up)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def used(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        return self._peak

    @property
    def waiting(self) -> int:
        """Number of allocations blocked for room right now (lets tests wait for the wait)."""
        return self._waiting


class HbmGrant:
    """HBM taken on one device (by ``ObjectStore.admit``) for buffers still to be put:
    ``put(..., grant=)`` charges a value to it instead of allocating again. What is not spent
    stays taken until ``give_back``."""

    __slots__ = ("device_id", "nbytes", "_hbm")

    def __init__(self, device_id: int, nbytes: int, hbm):
        self.device_id, self.nbytes, self._hbm = device_id, nbytes, hbm

    def __repr__(self) -> str:
        return f"HbmGrant(device={self.device_id}, nbytes={self.nbytes})"

    def check(self, key: tuple, nbytes: int) -> None:
        """ValueError unless ``nbytes`` for ``key`` can be charged to this grant."""
        if key[1] != self.device_id:
            raise ValueError(f"object {key!r}: HBM granted on device {self.device_id}")
        if nbytes > self.nbytes:
            raise ValueError(f"object {key!r}: {nbytes} bytes, but only {self.nbytes} of the"
                             " granted HBM are left")

    def spend(self, nbytes: int) -> None:
        self.nbytes -= nbytes

    def give_back(self, nbytes: int | None = None) -> None:
        """Free ``nbytes`` of the grant (all that is left by default)."""
        nbytes = self.nbytes if nbytes is None else nbytes
        self.nbytes -= nbytes
        self._hbm.free(nbytes)


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
        if not isinstance(kernel, DeviceWork):
            raise TypeError(f"kernel {kernel!r} is not DeviceWork")
        with self._lock:
            late = self._skips.pop(seq, None)  # why it was skipped, if it was
            if late is None:
                self._check_new_seq(seq)
                self.lane.dispatch(seq, kernel, self._clock())
                if seq > self._max_enqueued:
                    self._max_enqueued = seq
        if late is not None:
            report_error(kernel, self._skipped_error(seq, late))
        elif seq == self.lane.next_seq:
            self.executor.wake()

    def skip(self, seq: int, reason: str = "") -> bool:
        """Cancel ``seq`` so the device does not wait for it; False if it already ran or was
        skipped. A kernel already queued at ``seq`` is dropped and told via ``on_error``, with
        ``reason`` (why its run failed: the error its caller should see)."""
        reason = str(reason)
        with self._lock:
            skipped, dropped = self.lane.skip(seq)
            if not skipped:
                return False
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

    def finished(self, shard, record: KernelRecord) -> None:
        """The executor is done with the current kernel: record it, free the device."""
        with self._lock:
            self._timeline.append(record)
            self._busy += record.end - record.start
            self.lane.release(shard)
            if self.executor.idle_waiters:
                self.executor.idle.notify_all()

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


def _check_nbytes(nbytes) -> int:
    """``nbytes`` as a plain int (numpy integers welcome); ValueError unless an int >= 0."""
    try:
        value = operator.index(nbytes)
    except TypeError:
        value = -1
    if isinstance(nbytes, bool) or value < 0:
        raise ValueError(f"a byte count must be an int >= 0, got {nbytes!r}")
    return value
