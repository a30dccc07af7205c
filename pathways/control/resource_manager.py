"""The resource manager: islands of devices, and virtual slices mapped onto them. No I/O.

The coordinator keeps one ``ResourceManager``. Hosts join (``add_host``) and leave
(``remove_host``) at run time; each brings ``num_devices`` devices of one kind to one island (a
set of devices joined by fast ICI links). Device ids are global, assigned in sequence and never
reused, so a stale id can never silently name a device that joined later.

A client asks for a virtual slice: a mesh shape such as (2, 4), optionally an island and a device
kind. ``allocate`` maps the slice's n = prod(shape) virtual devices one to one onto n alive
physical devices of a single island, by this rule:

1. Island: the one given; else, among the islands with at least n alive devices (of the kind),
   the one with the most devices of load 0. Ties go to the lowest island id.
2. Devices: the load of a device is the number of live slices mapped to it. The least loaded
   devices are taken first, a whole load level at a time while it fits, so while every slice
   has the same size the loads of an island's devices never differ by more than one. Among
   the devices of the last level needed, hosts are used whole before one is split: the hosts
   with the most such devices first, as long as each fits whole in what is still needed;
   the rest from the host with the fewest such devices that still holds it (best fit, so
   other hosts stay whole), preferring a host the slice already uses, then the lowest id.
3. Layout: the chosen devices are sorted by (host, index) and laid out in the mesh's row-major
   order, so the last mesh axis varies fastest within a host. When a slice covers whole
   hosts this is the TPU layout: shape (2, 4) on hosts A and B of 4 devices each gets row 0 =
   A's devices 0..3 and row 1 = B's devices 0..3.
4. Hosts asked for: a slice given ``hosts=H`` takes n / H devices on each of H hosts: on each
   host its least loaded (then lowest index), on the hosts whose share is least loaded (then
   lowest id), laid out as in 3. It keeps that on resume, and a remap puts each lost host's
   share onto a host the slice does not use.

A slice can be suspended (its devices freed, its shape and island kept) and resumed later onto
devices chosen by the same rule, possibly others, and never onto the devices it is told to
``avoid`` (those a preempting slice holds); its ``version`` goes up as after a remap. A
suspension can also be undone (``restore``): the slice goes back onto the very devices it
left, version unchanged, as if it had never been suspended.

Losing a host breaks the slices that use its devices (``broken_slices``); they keep their load on
the lost devices until remapped or released. ``remap`` keeps a broken slice's healthy devices in
place and fills each lost position by the same rule (least loaded, whole hosts first, same
island and kind, not already in the slice), then bumps the slice's ``version`` so the client knows to re-lower
programs built on the old mapping.
"""

from __future__ import annotations

import math
import operator
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..errors import ResourceError

DEFAULT_KIND = "tpu-emu"


@dataclass(frozen=True)
class DeviceInfo:
    """One physical device: global id, island, the id of its host and its position there."""

    id: int
    island: int
    host: int
    index: int
    kind: str


@dataclass(frozen=True)
class Slice:
    """A virtual slice: a mesh of ``shape`` mapped onto ``devices`` in row-major order."""

    slice_id: int
    client: object
    shape: tuple[int, ...]
    island: int
    devices: tuple[int, ...]
    version: int
    kind: str | None = None  # the device kind asked for (None: any), kept for remap
    hosts: int | None = None  # the hosts asked for (None: as rule 2 packs them), kept likewise


class ResourceManager:
    """Hosts, devices and islands, and the virtual slices clients allocate on them."""

    def __init__(self) -> None:
        self._devices: dict[int, DeviceInfo] = {}  # every device ever added, alive or not
        self._alive: set[int] = set()
        self._hosts: dict[int, tuple[int, ...]] = {}  # alive hosts -> their device ids
        self._known_hosts: set[int] = set()
        self._islands: set[int] = set()  # every island that ever had a host
        self._slices: dict[int, Slice] = {}
        self._suspended: dict[int, Slice] = {}  # suspended slices: no devices until resumed
        self._load: Counter[int] = Counter()
        self._next_device = 0
        self._next_slice = 0

    # -- hosts and devices --------------------------------------------------------------

    def add_host(
        self, host: int, island: int, num_devices: int, kind: str = DEFAULT_KIND
    ) -> list[DeviceInfo]:
        """Register an alive host with ``num_devices`` new devices; returns them by index.

        A host id that left may join again; its devices get new ids.
        """
        if host in self._hosts:
            raise ResourceError(f"host {host} is already registered (island {island} requested)")
        if num_devices < 1:
            raise ResourceError(f"host {host} must bring at least one device, not {num_devices}")
        first = self._next_device
        infos = [DeviceInfo(first + i, island, host, i, kind) for i in range(num_devices)]
        self._next_device += num_devices
        for info in infos:
            self._devices[info.id] = info
            self._alive.add(info.id)
        self._hosts[host] = tuple(info.id for info in infos)
        self._known_hosts.add(host)
        self._islands.add(island)
        return infos

    def remove_host(self, host: int) -> list[int]:
        """Mark a host's devices lost and return their ids; slices using them become broken.

        Removing a host that already left returns [] (failure detection may report it twice).
        """
        lost = self._hosts.pop(host, None)
        if lost is None:
            if host in self._known_hosts:
                return []
            raise ResourceError(f"unknown host {host}; alive hosts: {sorted(self._hosts)}")
        self._alive.difference_update(lost)
        return list(lost)

    def devices(self, island: int | None = None, alive: bool | None = True) -> list[DeviceInfo]:
        """Devices by id, of one island or all; alive=True alive only, False lost only, None all."""
        return [
            d
            for d in self._devices.values()
            if (island is None or d.island == island)
            and (alive is None or (d.id in self._alive) == alive)
        ]

    def islands(self) -> dict[int, list[DeviceInfo]]:
        """Every island that ever had a host, with its alive devices (possibly none)."""
        found: dict[int, list[DeviceInfo]] = {i: [] for i in sorted(self._islands)}
        for d in self.devices():
            found[d.island].append(d)
        return found

    def hosts(self) -> dict[int, list[DeviceInfo]]:
        """Alive hosts, each with its devices in index order."""
        return {h: [self._devices[d] for d in ids] for h, ids in sorted(self._hosts.items())}

    def load(self, device_id: int) -> int:
        """The number of live slices mapped to a device (lost devices included)."""
        if device_id not in self._devices:
            raise ResourceError(f"unknown device {device_id}; ids 0..{self._next_device - 1}")
        return self._load[device_id]

    # -- slices -------------------------------------------------------------------------

    def allocate(
        self,
        client: object,
        shape: Iterable[int],
        island: int | None = None,
        kind: str | None = None,
        hosts: int | None = None,
    ) -> Slice:
        """Map a virtual slice of mesh ``shape`` onto alive devices of one island (module
        rule); ``hosts``: on exactly that many hosts, an equal share on each (rule 4)."""
        shape = _check_shape(shape)
        island, devices = self.plan(shape, island, kind, hosts=hosts)
        new = Slice(self._next_slice, client, shape, island, devices, 0, kind, hosts)
        self._next_slice += 1
        self._slices[new.slice_id] = new
        self._load.update(new.devices)
        return new

    def plan(self, shape, island: int | None = None, kind: str | None = None,
             avoid=frozenset(), hosts: int | None = None) -> tuple[int, tuple[int, ...]]:
        """The island and devices ``allocate`` would give a slice of ``shape`` now; none of
        ``avoid`` (the island must have enough others)."""
        shape = _check_shape(shape)
        n = math.prod(shape)
        of_kind = "" if kind is None else f" of kind {kind!r}"
        what = f"slice of shape {shape} ({n} devices{of_kind})"  # names the request in errors
        if hosts is not None:
            hosts = _check_hosts(what, hosts, n)
        if island is None:
            island = self._choose_island(what, n, kind)
        pool = self._island_pool(what, n, island, kind, frozenset(avoid))
        if hosts is None:
            chosen = _choose(pool, n, self._load, Counter())
        else:
            chosen = self._on_hosts(what, pool, hosts, n // hosts)
        return island, tuple(d.id for d in sorted(chosen, key=_layout_key))

    def _on_hosts(self, what: str, pool: list[DeviceInfo], hosts: int,
                  each: int) -> list[DeviceInfo]:
        """``each`` devices on each of ``hosts`` hosts of ``pool`` (rule 4)."""
        on: dict[int, list[DeviceInfo]] = defaultdict(list)
        for d in sorted(pool, key=lambda d: (self._load[d.id], d.index)):
            on[d.host].append(d)
        shares = sorted((sum(self._load[d.id] for d in devs[:each]), h)
                        for h, devs in on.items() if len(devs) >= each)
        if len(shares) < hosts:
            raise ResourceError(f"{what} on {hosts} hosts of {each} devices each: only"
                                f" {len(shares)} hosts can give {each}")
        return [d for _, h in shares[:hosts] for d in on[h][:each]]

    def client_of(self, slice_id: int):
        """The client of a live or suspended slice; None if there is no such slice."""
        s = self._slices.get(slice_id) or self._suspended.get(slice_id)
        return None if s is None else s.client

    def is_live(self, slice_id: int) -> bool:
        """Whether the slice is mapped to devices (allocated, not released or suspended)."""
        return slice_id in self._slices

    def is_suspended(self, slice_id: int) -> bool:
        """Whether the slice is suspended (kept without devices until ``resume``)."""
        return slice_id in self._suspended

    def slices_on(self, devices) -> list[Slice]:
        """The live slices that use any of ``devices``."""
        devices = set(devices)
        return [s for s in self._slices.values() if devices.intersection(s.devices)]

    def suspend(self, slice_id: int) -> None:
        """Free a slice's devices but keep the slice (shape, island, kind) to ``resume``."""
        self._suspended[slice_id] = self.slice(slice_id)
        self.release(slice_id)

    def resume(self, slice_id: int, avoid=frozenset()) -> Slice:
        """Map a suspended slice onto devices of its island again (by the allocation rule,
        so possibly other devices than before, but none of ``avoid``); bumps its version.
        ResourceError if the island has too few devices: the slice stays suspended."""
        old = self._suspended_slice(slice_id)
        _, devices = self.plan(old.shape, old.island, old.kind, avoid, old.hosts)
        return self._unsuspend(replace(old, devices=devices, version=old.version + 1))

    def restore(self, slice_id: int) -> Slice:
        """Undo a suspension: the slice back on the devices it left, its version unchanged
        (what was on them is still valid). ResourceError if one of them was lost."""
        old = self._suspended_slice(slice_id)
        lost = [d for d in old.devices if d not in self._alive]
        if lost:
            raise ResourceError(f"slice {slice_id} cannot go back onto its devices: {lost}"
                                " were lost")
        return self._unsuspend(old)

    def _suspended_slice(self, slice_id: int) -> Slice:
        old = self._suspended.get(slice_id)
        if old is None:
            raise ResourceError(f"slice {slice_id} is not suspended")
        return old

    def _unsuspend(self, new: Slice) -> Slice:
        del self._suspended[new.slice_id]
        self._slices[new.slice_id] = new
        self._load.update(new.devices)
        return new

    def slice(self, slice_id: int) -> Slice:
        """The current mapping of a live slice."""
        try:
            return self._slices[slice_id]
        except KeyError:
            raise ResourceError(f"unknown slice {slice_id}; live: {sorted(self._slices)}") from None

    def release(self, slice_id: int) -> None:
        """Free a slice: its devices' loads drop by one."""
        released = self.slice(slice_id)
        del self._slices[slice_id]
        self._load.subtract(released.devices)

    def devices_of(self, client: object) -> set[int]:
        """The devices of every live slice of ``client``."""
        return {d for s in self._slices.values() if s.client == client for d in s.devices}

    def release_client(self, client: object) -> int:
        """Free every slice of a client (it closed or was lost); returns how many."""
        ids = [s.slice_id for s in self._slices.values() if s.client == client]
        for slice_id in ids:
            self.release(slice_id)
        for slice_id in [i for i, s in self._suspended.items() if s.client == client]:
            del self._suspended[slice_id]
        return len(ids)

    def broken_slices(self) -> list[int]:
        """Ids of live slices mapped to at least one lost device."""
        return [sid for sid, s in sorted(self._slices.items()) if not self._healthy(s)]

    def remap(self, slice_id: int) -> Slice:
        """Replace a broken slice's lost devices, keeping healthy ones in place; bumps version.

        A healthy slice is returned unchanged. If the island has too few healthy devices
        outside the slice, raises ResourceError and leaves the slice as it was.
        """
        old = self.slice(slice_id)
        lost = [pos for pos, d in enumerate(old.devices) if d not in self._alive]
        if not lost:
            return old
        pool = [
            d for d in self._pool(old.island, old.kind) if d.id not in old.devices
        ]
        if len(pool) < len(lost):
            raise ResourceError(
                f"cannot remap slice {slice_id} of shape {old.shape}: {len(lost)} devices lost, "
                f"island {old.island} has only {len(pool)} healthy devices outside the slice"
            )
        kept_hosts = Counter(self._devices[d].host for d in old.devices if d in self._alive)
        if old.hosts is None:
            spares = sorted(_choose(pool, len(lost), self._load, kept_hosts), key=_layout_key)
        else:  # hosts are lost whole: each lost share goes to a host the slice does not use
            each = len(old.devices) // old.hosts
            spares = sorted(self._on_hosts(
                f"cannot remap slice {slice_id} of shape {old.shape}",
                [d for d in pool if d.host not in kept_hosts], len(lost) // each, each),
                key=_layout_key)
        devices = list(old.devices)
        for pos, spare in zip(lost, spares):
            self._load[devices[pos]] -= 1
            self._load[spare.id] += 1
            devices[pos] = spare.id
        new = replace(old, devices=tuple(devices), version=old.version + 1)
        self._slices[slice_id] = new
        return new

    def snapshot(self) -> dict:
        """Plain data for a status command: islands, hosts, devices with loads, slices."""
        return {
            "islands": {i: [d.id for d in devs] for i, devs in self.islands().items()},
            "hosts": {
                h: {"island": devs[0].island, "devices": [d.id for d in devs]}
                for h, devs in self.hosts().items()
            },
            "devices": {d.id: self._device_status(d) for d in self._devices.values()},
            "slices": {s.slice_id: self._slice_status(s) for s in self._slices.values()},
            "suspended": {s.slice_id: {"client": s.client, "shape": s.shape,
                                       "island": s.island} for s in self._suspended.values()},
        }

    # -- private ------------------------------------------------------------------------

    def _device_status(self, d: DeviceInfo) -> dict:
        alive = d.id in self._alive
        return {
            "island": d.island,
            "host": d.host,
            "index": d.index,
            "kind": d.kind,
            "alive": alive,
            "load": self._load[d.id],
        }

    def _slice_status(self, s: Slice) -> dict:
        return {
            "client": s.client,
            "shape": s.shape,
            "island": s.island,
            "devices": list(s.devices),
            "version": s.version,
            "broken": not self._healthy(s),
        }

    def _healthy(self, s: Slice) -> bool:
        return all(d in self._alive for d in s.devices)

    def _pool(self, island: int, kind: str | None) -> list[DeviceInfo]:
        """Alive devices of an island that a request for ``kind`` may use."""
        return [d for d in self.devices(island) if kind is None or d.kind == kind]

    def _island_pool(self, what: str, n: int, island: int, kind: str | None,
                     avoid: frozenset = frozenset()) -> list[DeviceInfo]:
        """The devices a request may use on ``island`` (none of ``avoid``); ResourceError if
        they cannot fit it."""
        if island not in self._islands:
            raise ResourceError(
                f"{what}: unknown island {island}; islands: {sorted(self._islands)}"
            )
        pool = self._pool(island, kind)
        if kind is not None and not pool:
            kinds = sorted({d.kind for d in self.devices(island)})
            raise ResourceError(
                f"{what}: island {island} has no alive device of that kind; "
                f"alive kinds there: {kinds}"
            )
        pool = [d for d in pool if d.id not in avoid]
        if len(pool) < n:
            besides = f" besides {sorted(avoid)}" if avoid else ""
            raise ResourceError(
                f"{what}: island {island} has only {len(pool)} alive devices{besides}")
        return pool

    def _choose_island(self, what: str, n: int, kind: str | None) -> int:
        """The island that can fit n devices with the most unloaded ones; ties: lowest id."""
        pools = {i: self._pool(i, kind) for i in sorted(self._islands)}
        if kind is not None and not any(pools.values()):
            kinds = sorted({d.kind for d in self.devices()})
            raise ResourceError(f"{what}: no alive device of that kind; kinds: {kinds}")
        fits = [i for i, pool in pools.items() if len(pool) >= n]
        if not fits:
            alive = {i: len(pool) for i, pool in pools.items()}
            raise ResourceError(
                f"{what}: no island has that many; alive devices per island: {alive}"
            )
        return max(fits, key=lambda i: (sum(self._load[d.id] == 0 for d in pools[i]), -i))


def _check_shape(shape: Iterable[int]) -> tuple[int, ...]:
    try:
        dims = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ResourceError(f"slice shape {shape!r} must be a tuple of integers") from None
    if not dims or any(s < 1 for s in dims):
        raise ResourceError(f"slice shape {dims} must be a non-empty tuple of positive integers")
    return dims


def _check_hosts(what: str, hosts, n: int) -> int:
    """``hosts`` as an int, if a slice of ``n`` devices can have an equal share on each."""
    try:
        count = operator.index(hosts)
    except TypeError:
        count = 0
    if isinstance(hosts, bool) or count < 1 or n % count:
        raise ResourceError(f"{what} on {hosts!r} hosts: an equal share on each needs a"
                            f" number of hosts that divides {n}")
    return count


def _layout_key(d: DeviceInfo) -> tuple[int, int]:
    return (d.host, d.index)


def _choose(
    pool: list[DeviceInfo], n: int, load: Counter[int], taken: Counter[int]
) -> list[DeviceInfo]:
    """The n devices of ``pool`` the module's rule 2 takes: least loaded levels first, whole
    while they fit; the last level needed is packed by host (``_packed``).

    ``taken`` counts devices already held per host (a remapped slice's healthy ones).
    """
    taken = Counter(taken)  # and the hosts of the levels taken before
    levels: dict[int, list[DeviceInfo]] = defaultdict(list)
    for d in pool:
        levels[load[d.id]].append(d)
    chosen: list[DeviceInfo] = []
    for level in sorted(levels):
        need = n - len(chosen)
        if need <= 0:
            break
        group = levels[level]
        picked = group if len(group) <= need else _packed(group, need, taken)
        taken.update(d.host for d in picked)
        chosen += picked
    return chosen


def _packed(group: list[DeviceInfo], need: int, taken: Counter[int]) -> list[DeviceInfo]:
    """``need`` devices of ``group``, hosts used whole before one is split: hosts with the
    most devices of ``group`` first while each fits whole; the rest from the smallest host
    left (one the slice already uses first, then the lowest id), its lowest indices."""
    on: dict[int, list[DeviceInfo]] = defaultdict(list)
    for d in sorted(group, key=_layout_key):
        on[d.host].append(d)
    picked: list[DeviceInfo] = []
    for host in sorted(on, key=lambda h: (-len(on[h]), -taken[h], h)):
        if len(on[host]) <= need - len(picked):
            picked += on.pop(host)
    left = need - len(picked)
    if left:  # every host left was passed over for having more than that: all hold it
        host = min(on, key=lambda h: (len(on[h]), -taken[h], h))
        picked += on[host][:left]
    return picked
