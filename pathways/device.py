"""Emulated TPUs: one thread per device runs kernels one at a time, in scheduler order.

There are no real TPUs here, so each device is emulated faithfully in the ways that matter to
Pathways (DESIGN.md, mechanism 8):

- **Order.** The island scheduler gives every kernel a per-device sequence number. Hosts may
  ``enqueue`` kernels from any thread in any order; the device thread runs seq 0, 1, 2, ...
  strictly, waiting for the next one even when later ones are already queued. ``skip(seq)``
  cancels a seq (a dropped gang) so the device does not wait for it forever.
- **Non-preemptive.** A kernel runs to completion before the next starts. Its ``execute``
  may block (waiting for inputs, or for peers in a collective) and the device stays occupied
  meanwhile, so an inconsistent gang order across devices deadlocks exactly as on TPUs;
  collectives time out (``CollectiveTimeout``) rather than hang.
- **Modelled time.** ``execute(device)`` returns the kernel's modelled duration; the device
  is occupied for ``max(real elapsed, modelled)``, sleeping the remainder, then calls the
  kernel's optional ``on_done()``: a kernel that publishes its outputs there makes them
  visible at the modelled end, not before.
- **HBM.** ``device.hbm`` enforces capacity. An allocation that does not fit waits for
  frees (back-pressure); one larger than the whole HBM fails at once.

A kernel is any object with ``execute(device) -> float`` and attributes ``name`` and
``labels`` (a dict such as ``{"client": 3, "program": 7}``, copied into the timeline);
``on_error(exc)`` and ``on_done()`` are optional; if ``on_done`` raises, the kernel counts as
failed. A failing kernel is recorded and the
device carries on with the next seq: the device thread never dies of a kernel's error.

Time comes from an injectable ``clock`` and ``sleep`` so tests can check the accounting with a
fake clock instead of wall time.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .cost import DeviceSpec, check_seconds
from .errors import DeviceOutOfMemory, PathwaysError

log = logging.getLogger("pathways.device")

# Remainders shorter than this are not slept: OS sleeps overshoot by tens of microseconds, so
# sleeping them would make the device slower than modelled. The skipped time is not lost: the
# next kernel's record starts no earlier than this one's modelled end, and the debt is slept
# once it grows past the threshold.
MIN_SLEEP = 50e-6
TIMELINE_LENGTH = 10_000


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One kernel's occupation of a device, in the device's clock."""

    seq: int
    name: str
    labels: dict = field(hash=False)
    start: float
    end: float
    error: bool


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

    def allocate(self, nbytes: int, timeout: float | None = None) -> None:
        """Take ``nbytes``, waiting up to ``timeout`` seconds (None: forever) for room.

        Raises DeviceOutOfMemory at once if ``nbytes`` exceeds the whole capacity, or when
        the wait times out. Waiters are served first-fit, not first-come: a small request
        that fits goes ahead of a large one still waiting, which avoids head-of-line
        deadlocks but can starve a large request while small ones keep coming.
        """
        nbytes = _check_nbytes(nbytes)
        if nbytes > self.capacity:
            raise DeviceOutOfMemory(f"{self.name}: cannot allocate {nbytes} bytes, more than "
                                    f"its whole HBM capacity of {self.capacity} bytes")
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
            if self._waiting:
                self._cond.notify_all()

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


class EmulatedDevice:
    """One emulated accelerator: a thread that runs enqueued kernels strictly by seq."""

    def __init__(self, device_id: int, spec: DeviceSpec | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 name: str | None = None, sleep: Callable[[float], object] | None = None):
        self.device_id = device_id
        self.spec = spec if spec is not None else DeviceSpec()
        self.name = name if name is not None else f"{self.spec.kind}:{device_id}"
        self.hbm = HbmAccount(self.spec.hbm_bytes, self.name)
        self._clock = clock
        self._closing = threading.Event()
        # Default sleep is a real sleep that close() interrupts, so closing a device in the
        # middle of a long modelled kernel does not wait out the model.
        self._sleep = sleep if sleep is not None else self._closing.wait
        self._cond = threading.Condition(threading.Lock())  # not re-entered: a plain lock
        self._queue: dict[int, object] = {}
        self._skipped: set[int] = set()
        self._next_seq = 0
        self._running: int | None = None
        self._max_enqueued = -1
        self._free_at = float("-inf")  # modelled end of the previous kernel
        self._busy = 0.0
        self._timeline: deque[KernelRecord] = deque(maxlen=TIMELINE_LENGTH)
        self._thread = threading.Thread(target=self._loop, name=f"device-{self.name}",
                                         daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"EmulatedDevice({self.name}, next_seq={self._next_seq})"

    def __enter__(self) -> EmulatedDevice:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the scheduler's side --------------------------------------------------------------

    def enqueue(self, seq: int, kernel) -> None:
        """Queue ``kernel`` to run as this device's ``seq``-th kernel. Any thread, any order."""
        if not callable(getattr(kernel, "execute", None)):
            raise TypeError(f"kernel {kernel!r} has no execute(device) method")
        with self._cond:
            self._check_new_seq(seq)
            self._queue[seq] = kernel
            self._max_enqueued = max(self._max_enqueued, seq)
            self._cond.notify_all()

    def skip(self, seq: int) -> bool:
        """Cancel ``seq`` so the device does not wait for it; False if it already ran or was
        skipped. A kernel already queued at ``seq`` is dropped and told via ``on_error``."""
        with self._cond:
            if seq < self._next_seq or seq == self._running or seq in self._skipped:
                return False
            dropped = self._queue.pop(seq, None)
            self._skipped.add(seq)
            self._max_enqueued = max(self._max_enqueued, seq)
            self._cond.notify_all()
        if dropped is not None:
            _report_error(dropped, PathwaysError(f"{self.name}: seq {seq} was skipped"))
        return True

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the device thread; kernels still queued are told via ``on_error``. Idempotent.

        Waits up to ``timeout`` for the thread. A kernel blocked inside ``execute`` is the
        kernel's business (collectives time out on their own): close returns after
        ``timeout`` regardless, and the thread exits once that kernel returns. Returns
        whether the thread has stopped.
        """
        with self._cond:
            self._closing.set()
            dropped = list(self._queue.items())
            self._queue.clear()
            self._cond.notify_all()
        self.hbm.close()
        for seq, kernel in sorted(dropped, key=lambda item: item[0]):
            _report_error(kernel, PathwaysError(f"{self.name} closed before seq {seq} ran"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every seq enqueued (or skipped) so far has run; False on timeout."""
        with self._cond:
            target = self._max_enqueued
            return self._cond.wait_for(lambda: self._next_seq > target, timeout)

    # -- what can be observed --------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The lowest seq that has not finished (the one running now, or the one awaited)."""
        return self._next_seq

    @property
    def busy_seconds(self) -> float:
        """Total occupied time of every finished kernel (not bounded like the timeline)."""
        return self._busy

    @property
    def timeline(self) -> list[KernelRecord]:
        """The last ``TIMELINE_LENGTH`` finished kernels, oldest first."""
        with self._cond:
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

    # -- the device thread -----------------------------------------------------------------

    def _check_new_seq(self, seq: int) -> None:
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise ValueError(f"{self.name}: seq must be an int >= 0, got {seq!r}")
        if self._closing.is_set():
            raise PathwaysError(f"{self.name} is closed; cannot enqueue seq {seq}")
        if seq < self._next_seq or seq == self._running:
            raise ValueError(f"{self.name}: seq {seq} already ran (next is {self._next_seq})")
        if seq in self._queue or seq in self._skipped:
            raise ValueError(f"{self.name}: seq {seq} is already enqueued or skipped")

    def _take_next(self):
        """Block until the next seq's kernel is queued; (seq, kernel), or None once closing."""
        with self._cond:
            while not self._closing.is_set():
                seq = self._next_seq
                if seq in self._skipped:
                    self._skipped.discard(seq)
                    self._next_seq += 1
                    self._cond.notify_all()
                elif seq in self._queue:
                    self._running = seq
                    return seq, self._queue.pop(seq)
                else:
                    self._cond.wait()
            return None

    def _loop(self) -> None:
        while (item := self._take_next()) is not None:
            seq, kernel = item
            try:
                record = self._run(seq, kernel)
            except BaseException:  # a bug in the device itself; keep serving the queue
                log.exception("%s: internal error running seq %d", self.name, seq)
                record = None
            with self._cond:
                if record is not None:
                    self._timeline.append(record)
                    self._busy += record.end - record.start
                    self._free_at = record.end
                self._running = None
                self._next_seq = seq + 1
                self._cond.notify_all()

    def _run(self, seq: int, kernel) -> KernelRecord:
        """Execute one kernel, occupy the device for its modelled time, and record it."""
        error: BaseException | None = None
        modelled = 0.0
        prepare = getattr(kernel, "prepare", None)
        try:
            if prepare is not None:
                prepare(self)  # e.g. wait for inputs: the device waits, it does not compute
        except Exception as exc:
            error = exc
        begin = self._clock()
        try:
            if error is None:
                modelled = check_seconds(kernel.execute(self),
                                         f"duration returned by {kernel!r}")
        except Exception as exc:
            error = exc
        # Never start before the previous kernel's modelled end: see MIN_SLEEP.
        start = max(begin, self._free_at)
        end = start + max(self._clock() - begin, modelled)
        if error is None:
            self._occupy_until(end)
            error = _done(kernel)
        if error is not None:
            _report_error(kernel, error)
        return KernelRecord(seq, str(getattr(kernel, "name", type(kernel).__name__)),
                            dict(getattr(kernel, "labels", None) or {}), start, end,
                            error is not None)

    def _occupy_until(self, end: float) -> None:
        remaining = end - self._clock()
        if remaining >= MIN_SLEEP and not self._closing.is_set():
            self._sleep(remaining)


def _done(kernel) -> Exception | None:
    on_done = getattr(kernel, "on_done", None)
    if on_done is None:
        return None
    try:
        on_done()
    except Exception as exc:
        return exc
    return None


def _report_error(kernel, error: BaseException) -> None:
    """Tell the kernel it failed (so it can fail its outputs); its own errors are only logged."""
    log.debug("kernel %r failed: %r", kernel, error)
    on_error = getattr(kernel, "on_error", None)
    if on_error is None:
        return
    try:
        on_error(error)
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
