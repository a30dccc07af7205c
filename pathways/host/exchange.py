"""Collectives between the kernel shards one executor runs: mailboxes, parking, ICI sends.

A shard that reaches a collective hands its values to its local peers' mailboxes in memory,
queues the values for devices of other hosts on the executor's ICI link (which sends one
message per peer host per executor turn), and parks -- its greenlet, not a thread -- until
every source has delivered. Its virtual time then moves to when the last value was available:
a local peer's own arrival at the collective, or a remote value's real arrival less how far
its sender's virtual time was behind real time (``pathways.host.ici``). A parked
shard's device stays occupied, so an inconsistent gang order deadlocks as on TPUs; one
watchdog timer turns an exchange parked too long into ``CollectiveTimeout`` and aborts its
gang on this executor (no peer completes with values left behind).

Exchange keys are ``(gang key, seq)``: every collective call of a kernel takes the next seq,
so the members of a group agree on which exchange a value belongs to. Every group of a mesh
shares the key of the same call; mailboxes are per (key, destination device).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from ..errors import CollectiveTimeout, ProgramError
from ..program.collectives import KernelEnv, ordered_sum
from ..program.rendezvous import FAILED_GANGS_KEPT, Abandoned
from .batching import BATCHING, Batch, Box, box_of

log = logging.getLogger("pathways.host.exchange")

PLANS_KEPT = 4096  # collective groups whose local/remote split an executor remembers


class _Group:
    """This host's members of one group in one gather: the values so far, shared."""

    __slots__ = ("key", "devs", "members", "box", "missing", "parked", "left", "folded")

    def __init__(self, key, devs: tuple, members: tuple):
        self.key, self.devs, self.members = key, devs, members
        self.box: dict = {}  # source device -> (value, available at)
        self.missing = len(devs)
        self.parked: list = []  # (device, shard) waiting for the rest
        self.left = len(members)  # local members that have not taken their answer yet
        self.folded = None  # reduce's answer, worked out once


class Exchanges:
    """The collectives of the shards run by ``executor`` (its thread only, but for
    ``abort_gang``, which the executor forwards)."""

    def __init__(self, executor):
        self.ex = executor
        self._mail: dict = {}  # (key, dst) -> {src: (value, available at)}
        self._parked: dict = {}  # (key, dst) -> shard
        self._failed_gangs: OrderedDict = OrderedDict()
        self._plans: dict = {}  # gather_plan's answers
        self._groups: dict = {}  # (key, local member) -> its _Group, for gathers
        self._batches: dict = {}  # key -> its Batch, for batched segments
        self._boxes: dict = {}  # (id(devices), shape, names) -> (devices, Box or None)
        self._watchdog_armed = False  # one timer for every parked exchange's timeout

    def box(self, devices: dict, mesh_shape, axis_names) -> Box | None:
        """The box of this host's devices of a mesh (``devices``: flat index -> device, as
        the host keeps it per mesh), or None (see ``box_of``); worked out once per mesh."""
        k = (id(devices), mesh_shape, axis_names)  # meshes of the same devices share them
        hit = self._boxes.get(k)
        if hit is not None and hit[0] is devices:
            return hit[1]
        box = box_of(devices, mesh_shape, axis_names, self.ex.devices) if BATCHING else None
        if len(self._boxes) < PLANS_KEPT:
            self._boxes[k] = (devices, box)
        return box

    def batch(self, shard, key, box: Box, me, args, run):
        """In the shard's greenlet: ``me``'s results of a computation run once for every
        device of ``box`` (``run(coords, [each member's args]) -> [each one's results]``),
        when the last of them reaches it. Waiting for the others is not its device's time
        (they run side by side); each is booked an equal share of the computation's real
        time (``Timeline.leave_batch``)."""
        at = self._arrive(shard, key, me)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = Batch(key, box.members)
        batch.box[me] = args
        if len(batch.box) < len(box.members):
            shard.waiting = ["group", batch]
            self._park(shard, key, me)
            batch.parked.append((me, shard))
            try:
                self.ex.park()  # resumed when the last member has run the computation
            finally:
                shard.waiting = None
                self._parked.pop((key, me), None)
        else:
            del self._batches[key]
            began = self.ex.now()
            try:
                batch.results = run(box.coords, [batch.box[d] for d in box.members])
            except BaseException as exc:
                batch.error = exc
            batch.box = {}
            batch.share = (self.ex.now() - began) / len(box.members)
            for member, waiting in batch.parked:
                if self._parked.pop((key, member), None) is waiting:
                    self.ex.resume_later(waiting, None)
        if batch.error is not None:  # every member fails with the computation's error
            raise batch.error
        self.ex.timeline.leave_batch(shard, at, batch.share, self.ex.now())
        return batch.results[box.place[me]]

    def exchange(self, shard, key, me, outgoing: dict, sources: list) -> dict:
        """In the shard's greenlet: send ``outgoing`` {device: value}, wait for ``sources``;
        {source device: value}. The shard's virtual time moves to when the last value was
        available (a local peer's arrival at the exchange, or a remote value's real arrival)."""
        at = self._arrive(shard, key, me)
        remote: dict = {}
        copies: dict = {}  # one copy per value sent, however many local peers get it
        for dst, value in outgoing.items():
            if dst == me:
                continue
            if dst in self.ex.devices:
                c = copies.get(id(value))
                if c is None:
                    c = copies[id(value)] = _copy(value)
                self.deliver(key, me, dst, c, at)
            else:
                remote.setdefault(id(value), (value, []))[1].append(dst)
        for value, dsts in remote.values():
            self._queue_remote(key, me, dsts, value, at)
        return self._collect(shard, key, me, [s for s in sources if s != me], at)

    def gather(self, shard, key, plan, value) -> list:
        """The exchange in which every member sends ``value`` to every other (psum,
        all_gather): every member's value, in member order. ``plan`` is ``gather_plan``'s.
        The values are shared by this host's members: callers build new arrays from them."""
        group, values = self._gather(shard, key, plan, value)
        self._leave(group)
        return values

    def reduce(self, shard, key, plan, value, fold):
        """``fold(gather(...))``, worked out once for all of this host's members of the
        group (they receive the same values in the same order); each gets its own array."""
        group, values = self._gather(shard, key, plan, value)
        if group.folded is None:
            group.folded = fold(values)
        result = group.folded if group.left == 1 else group.folded.copy()
        self._leave(group)
        return result

    def _gather(self, shard, key, plan, value):
        """This host's members of a group wait together: one box per (exchange, group), one
        count of what is missing, so a value from another host is taken once, however many
        of this host's devices are in the group."""
        me, devs, _, remote, _ = plan
        at = self._arrive(shard, key, me)
        group = self._group_of(key, plan)
        if remote:
            self._queue_remote(key, me, remote, value, at)
        self._add(group, me, _copy(value), at)
        if group.missing:
            shard.waiting = ["group", group]
            self._park(shard, key, me)
            group.parked.append((me, shard))
            try:
                self.ex.park()  # resumed when the group has every value
            finally:
                shard.waiting = None
                self._parked.pop((key, me), None)
        got = [group.box[d] for d in devs]
        self.ex.timeline.leave_collective(shard, at, max((when for _, when in got), default=at),
                                          self.ex.now())
        return group, [v for v, _ in got]

    def _group_of(self, key, plan) -> _Group:
        me, devs, local_peers, _, _ = plan
        group = self._groups.get((key, me))
        if group is None:
            members = (me, *local_peers)
            group = _Group(key, devs, members)
            for m in members:
                self._groups[(key, m)] = group
                early = self._mail.pop((key, m), None)  # sent before any of us got here
                for src, item in (early or {}).items():
                    if src not in group.box:
                        group.box[src] = item
                        group.missing -= 1
        return group

    def _add(self, group: _Group, src, value, at: float) -> None:
        if src in group.box:
            log.warning("exchange %r: %r delivered twice; dropped", group.key, src)
            return
        group.box[src] = (value, at)
        group.missing -= 1
        if not group.missing:
            for me, shard in group.parked:
                if self._parked.pop((group.key, me), None) is shard:
                    self.ex.resume_later(shard, None)
            group.parked = []

    def _leave(self, group: _Group) -> None:
        group.left -= 1
        if not group.left:
            for m in group.members:
                self._groups.pop((group.key, m), None)

    def receive(self, key, src, dsts, value, at: float) -> None:
        """A value from another host for this host's devices ``dsts``."""
        if key[0] in self._failed_gangs:
            return
        group = self._groups.get((key, dsts[0]))
        if group is not None:
            self._add(group, src, value, at)
            return
        for dst in dsts:  # an exchange with per-destination values, or one nobody reached yet
            self.deliver(key, src, dst, value, at)

    def gather_plan(self, devices: dict, members: tuple, position: int):
        """For the group ``members`` (flat indices; ``devices`` maps them to devices) seen
        from ``position``: (me, member devices, local peers, remote devices, local members).
        Worked out once per group and position."""
        k = (id(devices), members, position)
        hit = self._plans.get(k)
        if hit is not None and hit[0] is devices:
            return hit[1]
        devs = tuple(devices[m] for m in members)
        me = devs[position]
        local = tuple(d for d in devs if d in self.ex.devices)
        plan = (me, devs, tuple(d for d in local if d != me),
                tuple(d for d in devs if d not in self.ex.devices), len(local))
        if len(self._plans) < PLANS_KEPT:
            self._plans[k] = (devices, plan)
        return plan

    def _arrive(self, shard, key, me) -> float:
        """The shard reaches an exchange: its virtual time there (it must not be failed)."""
        gang = key[0]
        if gang in self._failed_gangs:
            reason, root = self._failed_gangs[gang]
            raise Abandoned(f"exchange {key!r} at {me!r} abandoned: {reason}", root=root)
        return self.ex.timeline.reach_collective(shard, self.ex.now())

    def _queue_remote(self, key, me, dsts, value, at: float) -> None:
        if self.ex.link is None:
            raise ProgramError(f"devices {list(dsts)} are not on this host and it has no ICI"
                               " link")
        self.ex.link.queue(key, me, dsts, value, at - self.ex.now())

    def _collect(self, shard, key, me, need: list, at: float) -> dict:
        """Park until every device of ``need`` has delivered to ``me`` for ``key``; {source:
        value}. The shard's virtual time moves to when the last value was available."""
        box = self._mail.setdefault((key, me), {})
        missing = sum(s not in box for s in need)
        if missing:
            shard.waiting = [(key, me), frozenset(need), missing]
            self._park(shard, key, me)
            try:
                self.ex.park()  # parked; resumed when every source has delivered
            finally:
                shard.waiting = None
                self._parked.pop((key, me), None)
        got = {s: box.pop(s) for s in need}
        if not box:
            self._mail.pop((key, me), None)
        self.ex.timeline.leave_collective(shard, at, max((when for _, when in got.values()),
                                                         default=at), self.ex.now())
        return {s: v for s, (v, _) in got.items()}

    def _park(self, shard, key, me) -> None:
        """Register a shard about to park in exchange ``key``, with its timeout."""
        shard.deadline = self.ex.now() + self.ex.collective_timeout
        self._parked[(key, me)] = shard
        if not self._watchdog_armed:  # later deadlines never precede an armed one
            self._watchdog_armed = True
            self.ex.at(shard.deadline, self._watchdog)

    def deliver(self, key, src, dst, value, at: float) -> None:
        if key[0] in self._failed_gangs:
            return
        box = self._mail.setdefault((key, dst), {})
        if src in box:
            log.warning("exchange %r: %r delivered to %r twice; dropped", key, src, dst)
            return
        box[src] = (value, at)
        shard = self._parked.get((key, dst))
        if shard is not None and shard.waiting[0] != "group" and src in shard.waiting[1]:
            shard.waiting[2] -= 1
            if not shard.waiting[2]:
                del self._parked[(key, dst)]
                self.ex.resume_later(shard, None)

    def _watchdog(self) -> None:
        """Time out the exchanges parked past their deadline; re-arm for the next one."""
        self._watchdog_armed = False
        now = self.ex.now()
        for (key, me), shard in list(self._parked.items()):
            if shard.deadline <= now and self._parked.get((key, me)) is shard:
                if shard.waiting[0] == "group":
                    box, need = shard.waiting[1].box, shard.waiting[1].devs
                else:
                    box, need = self._mail.get((key, me), {}), shard.waiting[1]
                missing = [s for s in need if s not in box]
                del self._parked[(key, me)]
                reason = (f"exchange {key!r} at {me!r}: no value from {missing} after "
                          f"{self.ex.collective_timeout}s (a peer skipped this collective, called"
                          " another one, or is lost)")
                self.ex.resume_later(shard, CollectiveTimeout(reason))
                # the whole step is aborted, as a runtime does once it detects a deadlock:
                # no peer of this gang here may complete with the values left behind
                self.abort_gang(key[0], reason)
        if self._parked:
            self._watchdog_armed = True
            self.ex.at(min(s.deadline for s in self._parked.values()), self._watchdog)

    def abort_parked(self, reason: str) -> None:
        """Fail every kernel parked in a collective here (the executor failed): each of
        their gangs, present and future exchanges, as ``abort_gang``."""
        for gang in {k[0][0] for k in self._parked}:
            self.abort_gang(gang, reason)

    def abort_gang(self, gang, reason: str, root=None) -> None:
        """Fail ``gang``'s exchanges here, present and future; ``root``: the failure's own
        error, which its kernels fail with instead of their Abandoned."""
        self._failed_gangs[gang] = (reason, root)
        while len(self._failed_gangs) > FAILED_GANGS_KEPT:
            self._failed_gangs.popitem(last=False)
        for k in [k for k in self._mail if k[0][0] == gang]:
            del self._mail[k]
        for k in [k for k in self._groups if k[0][0] == gang]:
            del self._groups[k]
        for k in [k for k in self._batches if k[0] == gang]:
            del self._batches[k]
        for k, shard in list(self._parked.items()):
            if k[0][0] == gang:
                del self._parked[k]
                self.ex.resume_later(shard, Abandoned(
                    f"exchange {k[0]!r} at {k[1]!r} abandoned: {reason}", root=root))


class ExecutorEnv(KernelEnv):
    """Where a kernel shard's collectives go: its executor's mailboxes and ICI link.

    ``devices`` maps the mesh's flat index to the physical device id; exchange keys are
    ``(gang_key, sequence number)``. ``bytes_sent_remote`` counts array bytes sent to other
    hosts, for the ICI cost model.
    """

    def __init__(self, mesh_shape, axis_names, flat_index: int, devices, gang_key, executor,
                 shard):
        # the mesh was checked when it was made: no KernelEnv checks per kernel
        self.mesh_shape, self.axis_names, self.flat_index = mesh_shape, axis_names, flat_index
        self._seq = 0
        self.devices, self.gang_key = devices, gang_key
        self.executor, self.shard = executor, shard
        self.bytes_sent_remote = 0
        self._batches = 0  # batched segments reached so far
        self._box = None  # local_batch's answer

    def gather_all(self, members, position, x):
        plan = self.executor.exchanges.gather_plan(self.devices, members, position)
        self._count_remote(plan, x)
        key = (self.gang_key, self.next_collective())
        return self.executor.exchanges.gather(self.shard, key, plan, x)

    def reduce_all(self, members, position, x):
        plan = self.executor.exchanges.gather_plan(self.devices, members, position)
        self._count_remote(plan, x)
        key = (self.gang_key, self.next_collective())
        return self.executor.exchanges.reduce(self.shard, key, plan, x, ordered_sum)

    def host_work(self):
        return HostWork(self.executor, self.shard)

    def local_batch(self):
        self._box = self.executor.exchanges.box(self.devices, self.mesh_shape,
                                                self.axis_names)
        return None if self._box is None else self._box.batch

    def batched(self, run, args):
        """This device's results of ``run`` (``jax_batch.HostBatch.run``), run once for all
        of its host's devices of the gang (the box ``local_batch`` found)."""
        box = self._box
        labels = self.shard.kernel.labels
        if labels is not None:  # traces say which kernels ran together
            labels["batch"] = len(box.members)
        self._batches += 1
        key = (self.gang_key, ("batch", self._batches))
        return self.executor.exchanges.batch(self.shard, key, box,
                                             self.devices[self.flat_index], args, run)

    def host_work_until(self, ready_at: float) -> None:
        self.executor.timeline.host_work_until(self.shard, ready_at, self.executor.now())

    def _count_remote(self, plan, x) -> None:
        if plan[3]:
            self.bytes_sent_remote += getattr(x, "nbytes", 0) * len(plan[3])

    def exchange(self, members, position, outgoing, expect_from):
        key = (self.gang_key, self.next_collective())
        devices, local = self.devices, self.executor.devices
        me = devices[self.flat_index]
        out = {}
        for p, value in outgoing.items():
            dst = devices[members[p]]
            out[dst] = value
            if dst not in local:
                self.bytes_sent_remote += getattr(value, "nbytes", 0)
        sources = [devices[members[s]] for s in expect_from]
        got = self.executor.exchanges.exchange(self.shard, key, me, out, sources)
        result = {}
        for s in expect_from:
            if s == position:
                if position not in outgoing:
                    raise ProgramError(f"exchange {key!r} expects a value from itself but sends"
                                       " none")
                result[s] = _copy(outgoing[position])
            else:
                result[s] = got[devices[members[s]]]
        return result


class HostWork:
    """``ExecutorEnv.host_work``: the executor's time inside is the shard's host work
    (``Timeline.host_work``), not its device's."""

    __slots__ = ("ex", "shard", "since", "until")

    def __init__(self, executor, shard):
        self.ex, self.shard = executor, shard

    def __enter__(self):
        self.since = self.ex.now()
        return self

    def __exit__(self, *exc) -> None:
        now = self.ex.now()
        self.until = self.ex.timeline.host_work(self.shard, now - self.since, now)


def _copy(value):
    return value.copy() if hasattr(value, "copy") else value
