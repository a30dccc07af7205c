"""Preemption: a client of higher priority takes devices from lower-priority clients, and keeps
them. No I/O: the control plane (``pathways.control.plane``) hands requests in and sends the
replies these methods return, as ``(connection, message)`` pairs.

``client.mesh(..., preempt=True)`` wants the devices the allocation rule would give; every live
slice of a lower-priority client on them is a victim. The allocation waits (``Preemption``)
until every victim's client has suspended it (the plane sends each a ``SuspendNotice``; the
client saves its arrays, then suspends), then is granted; if they have not within ``timeout``
it is refused. From then on the preempting slice holds those devices against its victims: a
victim's ``Resume`` goes onto other devices of its island if there are enough, else waits (up
to the ``wait`` its client gives) until the preempting slice is gone (its client suspended it
or left), else is refused naming the preempting client. A suspension that a preemption
waits for, or that made room for a slice still holding the devices, stands: ``CancelSuspend``
cannot undo it. The promise is about the
victims only: other slices, new ones included, share devices with the preempting slice as in
any multi-tenant island.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import protocol as m
from ..errors import ResourceError
from .resource_manager import ResourceManager


@dataclass
class Preemption:
    """An allocation waiting for lower-priority clients to suspend the slices in its way."""
    ident: bytes
    msg: m.AllocateMesh
    victims: set  # slice ids not yet suspended
    wanted: frozenset  # every slice it asked for
    deadline: float


@dataclass
class ParkedResume:
    """A victim's ``Resume`` waiting for its preempting slice to give the devices up."""
    ident: bytes
    msg: m.Resume
    wait: float
    deadline: float


class Preemptions:
    """Preempting allocations waiting, which slice holds each victim's devices, and the
    victims' resumes waiting for them."""

    def __init__(self, rm: ResourceManager, timeout: float):
        self.rm, self.timeout = rm, timeout
        self.waiting: list[Preemption] = []
        self.holders: dict[int, tuple] = {}  # victim slice -> (client, slice) that preempted it
        self.parked: list[ParkedResume] = []

    def ask(self, ident, msg: m.AllocateMesh, now: float, priority) -> list:
        """A preempting allocation: the victim slices it waits for (none: allocate at once).
        ``priority(client)`` ranks clients."""
        _, devices = self.rm.plan(tuple(msg.shape), msg.island, hosts=msg.hosts)
        mine = priority(msg.client)
        victims = [s for s in self.rm.slices_on(devices)
                   if s.client != msg.client and priority(s.client) < mine]
        if victims:
            ids = frozenset(s.slice_id for s in victims)
            self.waiting.append(Preemption(ident, msg, set(ids), ids, now + self.timeout))
        return victims

    def stands(self, slice_id: int) -> bool:
        """Whether the suspension of ``slice_id`` made room for a slice that still holds the
        devices, or a preemption waits for it: then it cannot be undone."""
        return bool(self._held(slice_id)) or any(slice_id in p.wanted for p in self.waiting)

    def resume(self, ident, msg: m.Resume, now: float) -> list:
        """A ``Resume``: the slice on devices its preempting slice does not hold, at once;
        else parked for ``msg.wait`` seconds; else refused naming the preempting client."""
        reply = self._try_resume(ident, msg)
        if reply is not None:
            return [reply]
        wait = float(msg.wait)
        if wait > 0:
            self.parked.append(ParkedResume(ident, msg, wait, now + wait))
            return []
        return [(ident, m.Refused(msg.req, self._held_error(msg.slice_id, None)))]

    def slices_freed(self) -> list:
        """A slice was suspended or released: grant the preemptions whose victims are all
        gone, and the parked resumes whose devices are free of their preemptor."""
        return self._grant() + self._unpark()

    def expire(self, now: float) -> list:
        """Refuse the preemptions and parked resumes whose time is up."""
        out = []
        for p in [p for p in self.waiting if now > p.deadline]:
            self.waiting.remove(p)
            owners = sorted({self.rm.client_of(sid) for sid in p.victims} - {None})
            out.append((p.ident, m.Refused(p.msg.req, ResourceError(
                f"clients {owners} did not suspend slices {sorted(p.victims)} within"
                f" {self.timeout:g} s: no room was made"))))
        for r in [r for r in self.parked if now > r.deadline]:
            self.parked.remove(r)
            out.append((r.ident, m.Refused(r.msg.req, self._held_error(r.msg.slice_id,
                                                                         r.wait))))
        return out

    def forget(self, client) -> list:
        """``client`` left (its slices are already released): drop what it waited for."""
        self.waiting = [p for p in self.waiting if p.msg.client != client]
        self.parked = [r for r in self.parked if r.msg.client != client]
        self.holders = {v: h for v, h in self.holders.items()
                        if self.rm.client_of(v) is not None}
        return self.slices_freed()

    # ---- private ----------------------------------------------------------------------------
    def _grant(self) -> list:
        out = []
        for p in list(self.waiting):
            p.victims = {sid for sid in p.victims if self.rm.is_live(sid)}
            if p.victims:
                continue
            self.waiting.remove(p)
            try:
                sl = self.rm.allocate(p.msg.client, tuple(p.msg.shape), island=p.msg.island,
                                      hosts=p.msg.hosts)
            except ResourceError as exc:
                out.append((p.ident, m.Refused(p.msg.req, exc)))
                continue
            for sid in p.wanted:
                if self.rm.is_suspended(sid):
                    self.holders[sid] = (p.msg.client, sl.slice_id)
            out.append((p.ident, m.Answer(p.msg.req, sl)))
        return out

    def _unpark(self) -> list:
        out = []
        for r in list(self.parked):
            reply = self._try_resume(r.ident, r.msg)
            if reply is not None:
                self.parked.remove(r)
                out.append(reply)
        return out

    def _try_resume(self, ident, msg: m.Resume):
        """The reply to a resume now, or None while its preempting slice is in the way."""
        avoid = self._held(msg.slice_id)
        try:
            sl = self.rm.resume(msg.slice_id, avoid)
        except ResourceError as exc:
            return None if avoid else (ident, m.Refused(msg.req, exc))
        self.holders.pop(msg.slice_id, None)
        return ident, m.Answer(msg.req, sl)

    def _held(self, slice_id: int) -> frozenset:
        """The devices the slice that preempted ``slice_id`` holds now (none once it is
        gone: suspended or released)."""
        holder = self.holders.get(slice_id)
        if holder is None:
            return frozenset()
        if not self.rm.is_live(holder[1]):
            del self.holders[slice_id]
            return frozenset()
        return frozenset(self.rm.slice(holder[1]).devices)

    def _held_error(self, slice_id: int, waited) -> ResourceError:
        client, holder = self.holders.get(slice_id, (None, None))
        devices = sorted(self._held(slice_id))
        after = "" if waited is None else f" (waited {waited:g} s)"
        return ResourceError(
            f"slice {slice_id} was preempted by client {client}, whose slice {holder} still"
            f" holds devices {devices}, and its island has too few others{after}: resume"
            " again once that client suspends its slice or leaves")
