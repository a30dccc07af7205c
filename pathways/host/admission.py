"""HBM admission: how a host's thread takes device memory without blocking.

A host's executor and event loop share one thread, which must never wait for HBM. So
outputs (a kernel's, or a transfer's landing buffers) take their HBM with ``admit``: the
callback gets an ``HbmGrant`` at once if the bytes fit, else later, in a turn of the device's
executor, once frees have made room (back-pressure without blocking). Waits are retried after
every free of their device (``HbmAccount.on_free``), so a small request may go ahead of a
larger one; a request larger than the whole HBM fails at once with ``DeviceOutOfMemory``.
``put(..., grant=)`` in the object store then spends the grant.

An *urgent* wait is a kernel's outputs: the kernel holds its device (and its gang's place in
the island's order) until they fit, and once they do it publishes and frees its inputs. So
urgent waits go first: while one waits on a device, other requests there (a client's put, a
transfer, a generated shard) wait behind it instead of taking the room it waits for. Nobody
waits without bound: the callers put a deadline on every wait and ``cancel`` it then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import DeviceOutOfMemory
from .device import EmulatedDevice
from .hbm import HbmGrant

__all__ = ["Admission", "Admissions"]


class Admission:
    """A wait for HBM (``Admissions.admit``); ``cancel()`` drops it if still waiting."""

    __slots__ = ("device", "nbytes", "then", "urgent", "cancelled", "retry")

    def __init__(self, device, nbytes: int, then, urgent: bool = False, retry=None):
        self.device, self.nbytes, self.then, self.urgent = device, nbytes, then, urgent
        self.cancelled = False
        self.retry = retry  # what retries the waits (those queued behind an urgent one)

    def cancel(self) -> None:
        self.cancelled = True
        if self.urgent and self.retry is not None:  # what waited behind it may fit now
            self.retry()


ADMITTED = Admission(None, 0, None)  # what an admission settled at once returns: nothing waits


class Admissions:
    """The waits for HBM on one host's ``devices`` (device_id -> device, kept by reference:
    a host may add devices later). Thread-safe."""

    def __init__(self, devices: dict[int, EmulatedDevice]):
        self._devices = devices
        self._waiting: list[Admission] = []  # retried when some HBM is freed
        # its own lock: the object store frees HBM (and so calls _hbm_freed) under its lock
        self._lock = threading.Lock()

    def admit(self, device_id: int, nbytes: int,
              then: Callable[[HbmGrant | BaseException], object],
              urgent: bool = False) -> Admission:
        """Take ``nbytes`` of HBM on ``device_id`` for buffers still to be put, never blocking
        the calling thread: ``then(grant)`` at once if they fit, else in a turn of the
        device's executor once frees have made room (waits are retried after every free, so
        a small request may go ahead of a larger one; ``urgent`` ones, a kernel's outputs,
        before any other). ``then(DeviceOutOfMemory)`` at once if ``nbytes`` exceeds the
        whole HBM. KeyError for a device this host does not have."""
        device = self._devices.get(device_id)
        if device is None:
            raise KeyError(f"no device {device_id!r} on this host "
                           f"(devices: {sorted(self._devices)})")
        hbm = device.hbm
        if urgent or not (self._waiting and self._urgent_waits(device)):
            try:
                fits = hbm.try_allocate(nbytes)
            except DeviceOutOfMemory as exc:  # larger than the whole HBM
                then(exc)
                return ADMITTED
            if fits:  # the common case, for every kernel's outputs: no wait to keep
                then(HbmGrant(device_id, nbytes, hbm))
                return ADMITTED
        admission = Admission(device, nbytes, then, urgent, self._hbm_freed)
        self._try(admission, behind=not urgent and self._urgent_waits(device))
        return admission

    def _urgent_waits(self, device) -> bool:
        """A kernel waits for HBM on ``device``: others queue behind it."""
        with self._lock:
            return any(a.urgent and a.device is device and not a.cancelled
                       for a in self._waiting)

    def _try(self, admission: Admission, behind: bool = False) -> None:
        """Take the admission's HBM if it fits, unless it is ``behind`` a kernel waiting on
        its device; else (re)join the waits."""
        if admission.cancelled:
            return
        device = admission.device
        hbm = device.hbm
        frees = hbm.frees
        try:
            fits = not behind and hbm.try_allocate(admission.nbytes)
        except DeviceOutOfMemory as exc:  # larger than the whole HBM
            admission.then(exc)
            return
        if fits:
            admission.then(HbmGrant(device.device_id, admission.nbytes, hbm))
            return
        with self._lock:
            self._waiting.append(admission)
        hbm.on_free = self._hbm_freed
        if hbm.frees != frees:  # a free came between the try and the wait: not lost
            self._hbm_freed()

    def _hbm_freed(self) -> None:
        """Some HBM was freed (any thread): retry the waiting admissions, each in a turn of
        its device's executor."""
        with self._lock:
            if not self._waiting:
                return
            executors = {id(a.device.executor): a.device.executor for a in self._waiting}
        for executor in executors.values():
            executor.call_soon(lambda ex=executor: self._retry(ex))

    def _retry(self, executor) -> None:
        with self._lock:
            mine = [a for a in self._waiting if a.device.executor is executor]
            self._waiting = [a for a in self._waiting if a.device.executor is not executor]
        mine.sort(key=lambda a: not a.urgent)  # kernels first (a stable sort: in order)
        blocked = set()  # devices where a kernel still waits: the rest wait behind it
        for admission in mine:
            self._try(admission, behind=id(admission.device) in blocked)
            if admission.urgent and self._waits(admission):
                blocked.add(id(admission.device))

    def _waits(self, admission: Admission) -> bool:
        with self._lock:
            return any(a is admission for a in self._waiting)
