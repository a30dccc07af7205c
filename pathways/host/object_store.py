"""A host's object store: the buffers that live in its devices' emulated HBM.

Every buffer is one shard of a logical array on one device, keyed ``(array_id, device_id)``;
``array_id`` is whatever hashable the client chose (e.g. ``(client_id, n)``), so a client can
name outputs before the host has seen the program that makes them.
Each entry has an owner ``(client_id, program_id or None)`` so that everything a lost client
held can be collected at once. A value shared by several users of one run is freed by the
last of them (``release_use``).

An entry's life::

    reserve ──► PENDING ──put──► READY ──┐
    (HBM taken)     └──fail──► FAILED ───┴─delete──► gone (HBM freed)

``put`` on an unreserved key reserves first. Neither waits: HBM is taken if it fits now, else
``DeviceOutOfMemory``. A buffer that must wait for room (a kernel's outputs, a client's data,
a transfer) takes its HBM with ``admit`` first (``pathways.host.admission``), which calls
back once frees make room, without blocking a thread, and hands over an ``HbmGrant`` that
later ``put(..., grant=)`` calls spend.

Deleting a PENDING entry leaves a tombstone: the key disappears for readers at once, and the
HBM is freed as soon as the producer resolves it (the producing kernel still owns the memory
it is writing).

With asynchronous dispatch a consumer can ask for a buffer before its producer has reached
this host, so ``get`` and ``add_done_callback`` on a key nobody has created yet wait for it:
they leave an *awaited* placeholder that the producer's ``reserve``/``put``/``fail`` takes
over. Placeholders hold no HBM and are invisible to ``state`` and ``delete``. A key deleted
after it existed is remembered (a bounded number of them): a reader that asks for it later
gets KeyError at once, so a kernel whose input was deleted fails instead of holding its device.

A host's executor and event loop share one thread, but input functions run on worker threads
(and a device made on its own has an executor thread), so the store is thread-safe: one lock
guards the bookkeeping, and done-callbacks run outside it, in the thread that resolves the
entry. The store keeps references to the arrays it is given; it does not copy them. A value is
a numpy array, or a ``jax.Array`` on its device where the host's devices are JAX's (``pathways
host --backend jax``): kernels pass them on without a round trip through the host's memory,
and what leaves the host is made numpy on the way (``dtypes.shippable``).
"""

from __future__ import annotations

import enum
import logging
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from ..errors import DeviceOutOfMemory
from ..program.ir import is_device_array
from ..protocol import key_client
from .admission import Admission, Admissions
from .clock import MONOTONIC, Clock
from .device import EmulatedDevice
from .hbm import HbmGrant

log = logging.getLogger("pathways.host.object_store")

Key = tuple[Hashable, int]  # (array_id, device_id)
Owner = tuple[Hashable, Hashable]  # (client_id, program_id or None)


EARLY_DELETES_KEPT = 100_000


class BufferState(enum.Enum):
    """Where a buffer is in its life: being produced, holding a value, or holding an error."""

    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


@dataclass(eq=False, slots=True)
class _Entry:
    """One key's bookkeeping: owner, HBM, state, value or error, and who waits for it."""

    owner: Owner | None = None
    nbytes: int = 0
    state: BufferState = BufferState.PENDING
    value: object = None
    error: BaseException | None = None
    callbacks: list | None = None
    awaited: bool = False  # a placeholder: someone waits, no producer has claimed it yet
    waiters: int = 0  # get() calls blocked on it, so a timed-out placeholder can be dropped
    deleted: bool = False  # a tombstone: gone for readers, freed once resolved
    allocating: bool = False  # reserve() or put() is taking its HBM
    allocated: bool = False
    arrival: float = 0.0  # when the data is available on its device (perf_counter)
    # made only when a reader must wait: most buffers are resolved before anyone asks
    done: threading.Event | None = None


class ObjectStore:
    """Buffers of one host, in the emulated HBM of its ``devices`` (device_id -> device).

    ``devices`` is kept by reference: a host may add devices to the dict later. ``clock``
    dates a buffer put without an ``arrival``.
    """

    def __init__(self, devices: dict[int, EmulatedDevice], clock: Clock = MONOTONIC):
        self._devices = devices
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[Key, _Entry] = {}
        # keys deleted before their producer created them (a client may drop an output of a
        # failed run while other shards are still being written): freed as soon as they come
        self._deleted_early: OrderedDict[Key, None] = OrderedDict()
        self._gone: OrderedDict[Key, None] = OrderedDict()  # deleted after they existed
        self._doomed: OrderedDict[Key, BaseException] = OrderedDict()  # never to be made
        self._retired: set = set()  # clients gone: whatever they still produce is dropped
        self._uses: dict = {}  # buffer key -> users done with it so far
        self.admissions = Admissions(devices)  # waits for HBM that must not block a thread

    # -- HBM admission ---------------------------------------------------------------------

    def admit(self, device_id: int, nbytes: int,
              then: Callable[[HbmGrant | BaseException], object],
              urgent: bool = False) -> Admission:
        """Take ``nbytes`` of HBM on ``device_id`` without blocking: ``then(grant)`` once
        they fit (``pathways.host.admission.Admissions.admit``; ``urgent``: a kernel's)."""
        return self.admissions.admit(device_id, nbytes, then, urgent)

    # -- producing -------------------------------------------------------------------------

    def reserve(self, key: Key, nbytes: int, owner: Owner) -> None:
        """Take ``nbytes`` of HBM on the key's device and create a PENDING entry (readers
        wait on it, ``delete_owner`` finds it) for a ``put`` later. If they do not fit now
        (``DeviceOutOfMemory``: no room, or more than the whole HBM) the entry becomes FAILED
        with that error, so readers do not hang, and the error is raised here too. ValueError
        if the key already exists. (What must wait for room waits in ``admit``.)"""
        entry = self._claim(key, nbytes, owner)
        self._allocate(key, entry)

    def put(self, key: Key, value, owner: Owner, arrival: float | None = None,
            grant: HbmGrant | None = None) -> None:
        """Make ``key`` READY with ``value`` (a numpy array, or a ``jax.Array`` kept on its
        device; anything else is made a numpy array), reserving first if needed.

        Without a ``grant`` its HBM is taken now, or ``DeviceOutOfMemory`` (as ``reserve``).
        For a reserved key, ``owner`` and ``value.nbytes`` must match the reservation. Putting
        into a tombstone (deleted while pending) resolves it, and its memory is freed.
        ``arrival``: when the data is available on its device (the store's clock): a
        kernel output's modelled end, a transfer's modelled arrival; now by default. Kernels
        start no earlier (``arrival``). ``grant``: HBM the caller took with ``admit``; the
        value's bytes are charged to it instead of allocating (nothing is charged if the
        put raises). ValueError if the key is already READY or FAILED.
        """
        value = _stored(value)
        if grant is not None:
            grant.check(key, value.nbytes)
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry.awaited:
            entry = self._claim(key, value.nbytes, owner, granted=grant is not None)
            if grant is None:
                self._allocate(key, entry)
            else:
                grant.spend(value.nbytes)
        elif entry.owner != owner:
            raise ValueError(f"object {key!r} is owned by {entry.owner!r}, not {owner!r}")
        elif entry.nbytes != value.nbytes:
            raise ValueError(f"object {key!r} was reserved with {entry.nbytes} bytes but the "
                             f"value has {value.nbytes}")
        elif grant is not None:  # the reservation holds the memory already: give it back
            grant.give_back(value.nbytes)
        entry.arrival = self.clock.time() if arrival is None else arrival
        self._resolve(key, entry, BufferState.READY, value=value)

    def put_all(self, batches, owner: Owner) -> None:
        """``put(key, value, owner, arrival=arrival, grant=grant)`` of each ``(key, value)`` of
        each ``(items, arrival, grant)`` of ``batches`` -- the outputs of a gang's kernels on
        this host, each kernel's on its device with its grant: new keys -- under one lock.
        All are stored, or none (ValueError: a key exists already or twice, or a grant is
        short; KeyError: no such device) and nothing is charged; readers and callbacks are
        told once all are."""
        batches = [([(key, v if type(v) is np.ndarray else _stored(v)) for key, v in items],
                    arrival, grant) for items, arrival, grant in batches]
        totals, keys, n = [], set(), 0
        for items, _, grant in batches:
            total = 0
            for key, value in items:
                total += value.nbytes
                if key[1] != grant.device_id or total > grant.nbytes:
                    grant.check(key, total)  # raises, saying which
                keys.add(key)
            totals.append(total)
            n += len(items)
        if keys:
            _check_owner(next(iter(keys)), owner)
        told = []
        entries, devices = self._entries, self._devices
        with self._lock:
            for key in keys:
                if key[1] not in devices:
                    self._device(key)  # raises, naming the host's devices
                entry = entries.get(key)
                if entry is not None and not entry.awaited:
                    self._check_new_locked(key)  # raises
            if len(keys) != n:
                raise ValueError(f"outputs put twice: "
                                 f"{[key for items, _, _ in batches for key, _ in items]}")
            # a new key nobody waits for, not deleted early, of a live client: made ready at
            # once (the usual case); any other goes the whole way
            early, live = self._deleted_early, owner[0] not in self._retired
            for (items, arrival, grant), total in zip(batches, totals):
                for key, value in items:  # (every key checked new above)
                    if live and key not in entries and key not in early:
                        entries[key] = _Entry(owner=owner, nbytes=value.nbytes,
                                              state=BufferState.READY, value=value,
                                              allocated=True, arrival=arrival)
                        continue
                    entry = self._own_locked(key, value.nbytes, owner)
                    entry.allocated, entry.arrival = True, arrival
                    told.append((key, self._resolve_locked(key, entry, BufferState.READY,
                                                           value)))
                grant.spend(total)
        for key, callbacks in told:
            for fn in callbacks:
                _call(fn, key)

    def ready_at(self, keys) -> float | None:
        """If every key is resolved (READY or FAILED), the latest of their ``arrival``
        times; None if one is not (unknown, awaited, pending or deleted). One lock."""
        latest = 0.0
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None or entry.state is BufferState.PENDING or entry.deleted:
                    return None
                if entry.arrival > latest:
                    latest = entry.arrival
        return latest

    def arrival(self, key: Key) -> float:
        """When ``key``'s data is available on its device (0: unknown or gone)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.arrival if entry is not None else 0.0

    def fail(self, key: Key, error: BaseException, owner: Owner | None = None) -> None:
        """Make ``key`` FAILED: readers and callbacks get ``error`` instead of a value.

        A key nobody reserved (a producer that failed before allocating) becomes a FAILED
        entry of no bytes, owned by ``owner`` (None: only ``delete`` collects it).
        ValueError if the key is already READY or FAILED.
        """
        if not isinstance(error, BaseException):
            raise TypeError(f"fail() needs an exception, got {error!r}")
        if owner is not None:
            _check_owner(key, owner)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.awaited:
                self._device(key)
                entry = self._adopt_locked(key, 0, owner)
        self._resolve(key, entry, BufferState.FAILED, error=error)

    # -- consuming -------------------------------------------------------------------------

    def get(self, key: Key, timeout: float | None = None):
        """The value of ``key``, waiting until it exists and is resolved.

        Raises the stored error if FAILED; KeyError if the key was deleted (also while
        waiting); TimeoutError if it is not resolved after ``timeout`` seconds.
        """
        with self._lock:
            entry = self._watch_locked(key)
            entry.waiters += 1
            if entry.state is BufferState.PENDING and entry.done is None:
                entry.done = threading.Event()
            done = entry.done if entry.state is BufferState.PENDING else None
        resolved = done is None or done.wait(timeout)
        with self._lock:
            entry.waiters -= 1
            if not resolved:
                self._drop_placeholder_locked(key, entry)
                raise TimeoutError(f"object {key!r} still "
                                   f"{'awaited' if entry.awaited else 'pending'} after {timeout}s")
            if entry.state is BufferState.FAILED:
                raise entry.error  # also when deleted since: the reason beats "deleted"
            if entry.deleted:
                raise KeyError(f"object {key!r} was deleted")
            return entry.value

    def get_all(self, keys) -> list:
        """``get(key, 0)`` of each key: under one lock when all are READY (a kernel's inputs,
        the usual case), else one by one (raising what ``get`` raises)."""
        values = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None or entry.state is not BufferState.READY or entry.deleted:
                    break
                values.append(entry.value)
            else:
                return values
        return [self.get(key, 0) for key in keys]

    def add_done_callback(self, key: Key, fn: Callable[[Key], object]) -> None:
        """Call ``fn(key)`` once ``key`` is READY or FAILED (now, in this thread, if it is).

        A key nobody created yet is awaited. Callbacks run outside the store's lock, in the
        thread that resolves the entry; one that raises is logged and does not stop the
        others. A callback registered before a pending entry is deleted still runs when the
        entry resolves. KeyError for a deleted key.
        """
        with self._lock:
            entry = self._watch_locked(key)
            if entry.state is BufferState.PENDING:
                if entry.callbacks is None:
                    entry.callbacks = []
                entry.callbacks.append(fn)
                return
        _call(fn, key)

    def state(self, key: Key) -> BufferState | None:
        """The entry's state, or None for an unknown, merely awaited or deleted key."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.deleted or entry.awaited:
                return None
            return entry.state

    # -- collecting ------------------------------------------------------------------------

    def delete(self, key: Key) -> bool:
        """Forget ``key`` and free its HBM (at once, or when a pending producer resolves it).

        Returns False for an unknown, merely awaited or already deleted key. An unknown key is
        remembered (a bounded number of them) and freed as soon as it is produced; an awaited
        one is left alone, since a reader (a kernel) still needs it.
        """
        with self._lock:
            return self._delete_locked(key)

    def _delete_locked(self, key: Key, frees: dict | None = None) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            self._deleted_early[key] = None
            while len(self._deleted_early) > EARLY_DELETES_KEPT:
                self._deleted_early.popitem(last=False)
            return False
        if entry.deleted or entry.awaited:
            return False
        entry.deleted = True
        self._release_if_done_locked(key, entry, frees)
        self._gone[key] = None  # a reader that comes later is told, never left waiting
        while len(self._gone) > EARLY_DELETES_KEPT:
            self._gone.popitem(last=False)
        return True

    def delete_all(self, keys) -> None:
        """``delete`` each key, under one lock, each device's HBM freed at once."""
        frees: dict = {}
        with self._lock:
            for key in keys:
                self._delete_locked(key, frees)
        for device, nbytes in frees.items():
            self._devices[device].hbm.free(nbytes)

    def release_uses(self, items) -> None:
        """For each ``(key, uses)`` of ``items``, under one lock: one user of ``key`` is done
        with it, and the last of its ``uses`` users deletes it (1: the only user deletes)."""
        with self._lock:
            for key, uses in items:
                n = self._uses.get(key, 0) + 1
                if n < uses:
                    self._uses[key] = n
                    continue
                self._uses.pop(key, None)
                self._delete_locked(key)  # its last user: deleted under the same lock

    def delete_owner(self, client_id: Hashable) -> int:
        """Delete every entry owned by ``client_id`` (any program); returns how many."""
        with self._lock:
            doomed = [(key, entry) for key, entry in self._entries.items()
                      if entry.owner is not None and entry.owner[0] == client_id
                      and not entry.deleted]
            for key, entry in doomed:
                entry.deleted = True
                self._release_if_done_locked(key, entry)
            return len(doomed)

    def fail_awaited(self, match: Callable[[Key], bool], error: BaseException) -> int:
        """Fail the readers waiting for keys nobody has produced yet, where ``match(key)``;
        returns how many keys. A producer that comes later finds a deleted key."""
        with self._lock:
            orphans = [(k, e) for k, e in self._entries.items() if e.awaited and match(k)]
        n = 0
        for key, entry in orphans:
            with self._lock:
                if self._entries.get(key) is not entry or not entry.awaited:
                    continue
                entry.awaited, entry.owner, entry.nbytes = False, None, 0
                entry.deleted = True
            self._resolve(key, entry, BufferState.FAILED, error=error, check=False)
            n += 1
        return n

    def doom(self, keys, error: BaseException) -> int:
        """Nobody will make these keys (the run that would have failed): fail the readers
        waiting for them, and tell a reader that comes later at once (a bounded number of
        keys are remembered). Keys already made are left as they are; a producer that comes
        after all stores its key as usual. Returns how many waiting keys were failed."""
        keys = set(keys)
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None or entry.awaited:
                    self._doomed[key] = error
            while len(self._doomed) > EARLY_DELETES_KEPT:
                self._doomed.popitem(last=False)
        return self.fail_awaited(keys.__contains__, error)

    def retire_client(self, client_id: Hashable, error: BaseException) -> int:
        """A client is gone: delete what it owns, drop whatever is still produced for it, and
        fail readers waiting for its buffers that nobody has produced yet (a kernel of its
        last runs must not hold a device waiting for input that will never come)."""
        with self._lock:
            self._retired.add(client_id)
        self.fail_awaited(lambda key: key_client(key) == client_id, error)
        return self.delete_owner(client_id)

    def used_bytes(self, device_id: int) -> int:
        """HBM bytes the store holds on ``device_id``, tombstones awaiting their producer too."""
        with self._lock:
            return self._devices[device_id].hbm.used if device_id in self._devices else 0

    def stats(self) -> dict:
        """``{"entries": {state or "deleting" or "awaited": count}, "bytes": {device: n}}``."""
        with self._lock:
            counts = {state.value: 0 for state in BufferState}
            counts.update(deleting=0, awaited=0)
            for entry in self._entries.values():
                kind = "awaited" if entry.awaited else "deleting" if entry.deleted else None
                counts[kind or entry.state.value] += 1
            devices = list(self._devices)  # the host may be adding devices meanwhile
            return {"entries": counts, "bytes": {d: self._devices[d].hbm.used for d in devices}}

    def __len__(self) -> int:
        """Number of live entries (not deleted, not merely awaited)."""
        with self._lock:
            return sum(not (e.deleted or e.awaited) for e in self._entries.values())

    # -- internals -------------------------------------------------------------------------

    def _claim(self, key: Key, nbytes: int, owner: Owner, granted: bool = False) -> _Entry:
        """Create the producer's entry (taking over a placeholder): its HBM still to be
        allocated, or already ``granted`` to the caller."""
        self._device(key)
        nbytes = operator.index(nbytes)
        if nbytes < 0:
            raise ValueError(f"object {key!r}: cannot reserve {nbytes} bytes")
        _check_owner(key, owner)
        with self._lock:
            entry = self._adopt_locked(key, nbytes, owner)
            entry.allocating, entry.allocated = not granted, granted
            return entry

    def _check_new_locked(self, key: Key) -> None:
        """ValueError unless ``key`` is new (unknown, or only awaited by readers)."""
        entry = self._entries.get(key)
        if entry is not None and not entry.awaited:
            raise ValueError(f"object {key!r} already exists "
                             f"({'deleting' if entry.deleted else entry.state.value})")

    def _adopt_locked(self, key: Key, nbytes: int, owner: Owner | None) -> _Entry:
        self._check_new_locked(key)
        return self._own_locked(key, nbytes, owner)

    def _own_locked(self, key: Key, nbytes: int, owner: Owner | None) -> _Entry:
        """The entry of a new key (checked already), made this owner's."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.awaited, entry.owner, entry.nbytes = False, owner, nbytes
        if self._deleted_early.pop(key, 0) is None:
            entry.deleted = True  # deleted before it existed: a tombstone from the start
        if owner is not None and owner[0] in self._retired:
            entry.deleted = True  # produced for a client that is gone: freed once written
        return entry

    def _watch_locked(self, key: Key) -> _Entry:
        """The entry a reader waits on: the real one, or a placeholder until it exists."""
        entry = self._entries.get(key)
        if entry is None:
            self._device(key)
            if key_client(key) in self._retired:
                raise KeyError(f"object {key!r} belongs to a client that is gone")
            if key in self._gone:
                raise KeyError(f"object {key!r} was deleted before this reader asked for it")
            if key in self._doomed:
                raise self._doomed[key]
            entry = self._entries[key] = _Entry(awaited=True)
        elif entry.deleted:
            raise KeyError(f"object {key!r} was deleted")
        return entry

    def _drop_placeholder_locked(self, key: Key, entry: _Entry) -> None:
        if entry.awaited and not entry.waiters and not entry.callbacks:
            if self._entries.get(key) is entry:
                del self._entries[key]

    def _allocate(self, key: Key, entry: _Entry) -> None:
        """Take the entry's HBM now, outside the lock (a delete meanwhile leaves it to free),
        or fail the entry and raise ``DeviceOutOfMemory``."""
        try:
            device = self._device(key)
            hbm = device.hbm
            if not hbm.try_allocate(entry.nbytes):
                raise DeviceOutOfMemory(
                    f"{device.name} is closed" if hbm.closed else
                    f"{device.name}: no room for {entry.nbytes} bytes of HBM now: only"
                    f" {max(hbm.capacity - hbm.used, 0)} of its {hbm.capacity} bytes are free")
        except Exception as exc:
            with self._lock:
                entry.allocating = False
                pending = entry.state is BufferState.PENDING
                self._release_if_done_locked(key, entry)
            if pending:  # a concurrent fail() may have resolved it already
                self._resolve(key, entry, BufferState.FAILED, error=exc, check=False)
            raise
        with self._lock:
            entry.allocating = False
            entry.allocated = True
            self._release_if_done_locked(key, entry)

    def _resolve(self, key: Key, entry: _Entry, state: BufferState, value=None, error=None,
                 check: bool = True) -> None:
        with self._lock:
            if entry.state is not BufferState.PENDING:
                if check:
                    raise ValueError(f"object {key!r} is already {entry.state.value}")
                return
            callbacks = self._resolve_locked(key, entry, state, value, error)
        for fn in callbacks:
            _call(fn, key)

    def _resolve_locked(self, key: Key, entry: _Entry, state: BufferState, value=None,
                        error=None):
        """Resolve a PENDING entry: its readers wake, a tombstone is freed; returns the
        callbacks to call once the lock is let go."""
        entry.state, entry.value, entry.error = state, value, error
        callbacks, entry.callbacks = entry.callbacks or (), None
        if entry.done is not None:
            entry.done.set()
        self._release_if_done_locked(key, entry)
        return callbacks

    def _release_if_done_locked(self, key: Key, entry: _Entry, frees: dict | None = None):
        """Drop a deleted entry and free its HBM once nobody is still writing or allocating
        (``frees``: add the bytes to its device's there instead, to free them later)."""
        if not entry.deleted or entry.state is BufferState.PENDING or entry.allocating:
            return
        if self._entries.get(key) is entry:
            del self._entries[key]
        entry.value = None
        if entry.allocated:
            entry.allocated = False
            if frees is None:
                self._devices[key[1]].hbm.free(entry.nbytes)
            else:
                frees[key[1]] = frees.get(key[1], 0) + entry.nbytes

    def _device(self, key: Key) -> EmulatedDevice:
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ValueError(f"an object key is (array_id, device_id), got {key!r}")
        device = self._devices.get(key[1])
        if device is None:
            raise KeyError(f"object {key!r}: no device {key[1]!r} on this host "
                           f"(devices: {sorted(self._devices)})")
        return device


def _stored(value):
    """What the store keeps of ``value``: a numpy array, or a ``jax.Array`` as it is."""
    return value if type(value) is np.ndarray or is_device_array(value) else np.asarray(value)


def _check_owner(key: Key, owner) -> None:
    if not (isinstance(owner, tuple) and len(owner) == 2):
        raise ValueError(f"object {key!r}: owner must be (client_id, program_id), got {owner!r}")


def _call(fn: Callable[[Key], object], key: Key) -> None:
    try:
        fn(key)
    except Exception:
        log.exception("done-callback %r for object %r raised", fn, key)
