"""One emulated device's HBM: ``HbmAccount`` (bytes in use against the capacity: an
allocation takes them if they fit now, and one larger than the whole HBM fails) and
``HbmGrant`` (HBM taken ahead for buffers still to be put). A buffer that must wait for room
waits without blocking a thread, in ``pathways.host.admission``, which hands it a grant."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable

from ..errors import DeviceOutOfMemory

__all__ = ["HBM_WAIT", "HbmAccount", "HbmGrant", "check_nbytes", "no_room"]

# seconds a buffer waits for HBM room before it fails (a host's default; its kernel limit
# when it has one): memory is a resource with a bounded wait, never a wedge
HBM_WAIT = 30.0


class HbmAccount:
    """Bytes allocated in one device's HBM. Thread-safe; nothing here waits (a full HBM is
    waited for by ``pathways.host.admission``, told by ``on_free``)."""

    def __init__(self, capacity: int, name: str = "device"):
        if capacity < 0:
            raise ValueError(f"HBM capacity must be >= 0, got {capacity!r}")
        self.capacity = int(capacity)
        self.name = name
        self._used = 0
        self._peak = 0
        self._closed = False
        self._lock = threading.Lock()
        self.on_free: Callable[[], object] | None = None  # told after every free
        self.frees = 0  # how many frees so far (lets a failed try_allocate see one it missed)

    def try_allocate(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit now; False if not. DeviceOutOfMemory if ``nbytes``
        exceeds the whole capacity (it never fits)."""
        nbytes = self._check_fits(nbytes)
        with self._lock:
            if self._closed or self._used + nbytes > self.capacity:
                return False
            self._used += nbytes
            self._peak = max(self._peak, self._used)
            return True

    def _check_fits(self, nbytes) -> int:
        nbytes = check_nbytes(nbytes)
        if nbytes > self.capacity:
            raise DeviceOutOfMemory(f"{self.name}: cannot allocate {nbytes} bytes, more than "
                                    f"its whole HBM capacity of {self.capacity} bytes")
        return nbytes

    def free(self, nbytes: int) -> None:
        """Give back ``nbytes`` and tell ``on_free``. Freeing more than used is a bug."""
        nbytes = check_nbytes(nbytes)
        with self._lock:
            if nbytes > self._used:
                raise AssertionError(f"{self.name}: freeing {nbytes} bytes but only "
                                     f"{self._used} are allocated (double free?)")
            self._used -= nbytes
            self.frees += 1
        if self.on_free is not None:
            self.on_free()

    def close(self) -> None:
        """Refuse every future allocation (``try_allocate`` says False); frees still work
        (for clean-up)."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def used(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        return self._peak


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


def check_nbytes(nbytes) -> int:
    """``nbytes`` as a plain int (numpy integers welcome); ValueError unless an int >= 0."""
    try:
        value = operator.index(nbytes)
    except TypeError:
        value = -1
    if isinstance(nbytes, bool) or value < 0:
        raise ValueError(f"a byte count must be an int >= 0, got {nbytes!r}")
    return value


def no_room(device, nbytes: int, waited: float, what: str = "",
            longer: str = "pass a longer timeout") -> DeviceOutOfMemory:
    """What a buffer that waited ``waited`` seconds for ``nbytes`` of ``device``'s HBM says:
    what it wanted, what is free and held, and what makes room (``longer``: how to wait
    longer)."""
    hbm = device.hbm
    return DeviceOutOfMemory(
        f"{device.name}: {what}waited {waited:g} s for {nbytes} bytes of HBM, but only"
        f" {max(hbm.capacity - hbm.used, 0)} of its {hbm.capacity} bytes are free"
        f" ({hbm.used} held by live arrays and running kernels); deleting arrays that are"
        f" no longer needed (array.delete()) frees room, or {longer}")
