"""Collectives between the kernel shards one executor runs: mailboxes, parking, ICI sends.

Reductions and all_gather (``tree``) are hierarchical (``pathways.host.hierarchy``): this
host's members of a group fold their values into the group's reduction tree together, and
the host exchanges tree nodes, not members' values, with the other hosts of the group.
Other exchanges (ppermute, all_to_all) go device to device: a shard that reaches one hands
its values to its local peers' mailboxes in memory, queues the values for devices of other
hosts on the executor's ICI link (which sends one message per peer host per executor turn),
and parks -- its greenlet, not a thread -- until
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

import numpy as np

from ..errors import CollectiveTimeout, ProgramError
from ..program.collectives import KernelEnv
from ..program.reduction import REDUCTIONS, tree_fold
from ..program.rendezvous import FAILED_GANGS_KEPT, Abandoned
from . import hierarchy
from .batching import BATCHING, Batch, Box, box_of, same_boxes
from .hierarchy import TreePlan, chunk_code, chunk_of, code, node_of

log = logging.getLogger("pathways.host.exchange")

PLANS_KEPT = 4096  # collective groups whose local/remote split an executor remembers
_SAME_SETTINGS = (" (every host of a cluster must run with the same PATHWAYS_FLAT_HOSTS and"
                  " PATHWAYS_SCATTER_BYTES)")


class _Tree:
    """This host's part of one group's reduction in one collective (``hierarchy.TreePlan``):
    the tree nodes it has so far, and the members waiting for the answer."""

    __slots__ = ("key", "plan", "red", "values", "missing", "steps", "parked", "left",
                 "answer", "error", "done_at", "received", "finished", "link_seconds", "like")

    def __init__(self, key, plan: TreePlan, red):
        self.key, self.plan, self.red = key, plan, red
        self.values: dict = {}  # node -> (value, available at); positions -> their leaves
        self.missing = {node: len(ps) for node, ps in plan.local}  # local nodes' members
        self.steps = list(plan.steps)  # the nodes still to combine here, children first
        self.parked: list = []  # (device, shard) waiting for the answer
        self.left = len(plan.position)  # local members that have not taken the answer yet
        self.answer = self.error = None
        self.done_at = 0.0  # when the answer was available (virtual time)
        self.link_seconds = 0.0  # the modelled time of its rounds between hosts
        self.received: list = []  # (round, bytes) of each value from another host
        self.finished: dict = {}  # the scatter algorithm's finished chunks: j -> (value, at)
        self.like = None  # a member's own value: the answer takes its type and shape

    def missing_sources(self) -> list:
        """What has not come yet, for a timeout's message: members, or other hosts' nodes."""
        plan = self.plan
        lacking = [plan.devs[p] for node, ps in plan.local for p in ps
                   if p not in self.values]
        lacking += [f"host {host}'s partial of positions {node[0]}..{node[1] - 1}"
                    for node, host in plan.expects.items() if node not in self.values]
        if plan.mode == "scatter" and plan.root in self.values:
            lacking += [f"host {host}'s finished chunk" for j, host in enumerate(plan.hosts)
                        if j not in self.finished]
        return lacking


class Exchanges:
    """The collectives of the shards run by ``executor`` (its thread only, but for
    ``abort_gang``, which the executor forwards)."""

    def __init__(self, executor):
        self.ex = executor
        self._mail: dict = {}  # (key, dst) -> {src: (value, available at)}
        self._parked: dict = {}  # (key, dst) -> shard
        self._failed_gangs: OrderedDict = OrderedDict()
        self._plans: dict = {}  # tree_plan's answers
        self._groups: dict = {}  # (key, its leader here) -> its _Tree, for reductions
        self._batches: dict = {}  # key -> its Batch, for batched segments
        self._boxes: dict = {}  # (id(devices), shape, names) -> (devices, Box or None)
        self._watchdog_armed = False  # one timer for every parked exchange's timeout

    def box(self, devices: dict, mesh_shape, axis_names) -> Box | None:
        """The box of this host's devices of a mesh (``devices``: flat index -> device, as
        the host keeps it per mesh), or None (see ``box_of``; and None on every host unless
        every host's devices form a box of the same extents: ``same_boxes``); worked out once
        per mesh and topology."""
        k = (id(devices), mesh_shape, axis_names)  # meshes of the same devices share them
        hit = self._boxes.get(k)
        if hit is not None and hit[0] is devices:
            return hit[1]
        local = self.ex.devices
        worker_of = self.ex.link.worker_of if self.ex.link is not None else {}
        box = box_of(devices, mesh_shape, axis_names, local, self.ex.jax_of) if BATCHING \
            and same_boxes(devices, mesh_shape,
                           lambda d: "here" if d in local else worker_of.get(d)) else None
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

    def tree_plan(self, devices: dict, members: tuple, mode: str | None = None) -> TreePlan:
        """This host's plan for the group ``members`` (flat indices; ``devices`` maps them
        to devices): ``hierarchy.plan``, worked out once per group and found by the
        identity of ``devices`` and ``members`` (groups of a thousand devices: hashing their
        tuples for every kernel would cost more than the collective)."""
        k = (id(devices), id(members), mode)
        hit = self._plans.get(k)
        if hit is not None and hit[0] is devices and hit[1] is members:
            return hit[2]
        same = (id(devices), members, mode)  # another device's equal tuple: share its plan
        hit = self._plans.get(same)
        if hit is not None and hit[0] is devices:
            tree = hit[2]
        else:
            tree = self._new_plan(devices, members, mode)
            if len(self._plans) < PLANS_KEPT:
                self._plans[same] = (devices, members, tree)
        if len(self._plans) < PLANS_KEPT:  # the entry keeps ``members`` alive: its id holds
            self._plans[k] = (devices, members, tree)
        return tree

    def _new_plan(self, devices: dict, members: tuple, mode) -> TreePlan:
        devs = tuple(devices[m] for m in members)
        local = self.ex.devices
        worker_of = self.ex.link.worker_of if self.ex.link is not None else {}
        me = next((worker_of[d] for d in devs if d in local and d in worker_of), -1)
        try:
            owners = tuple(me if d in local else worker_of[d] for d in devs)
        except KeyError as exc:
            raise ProgramError(f"device {exc.args[0]} of a collective's group is not on this"
                               " host and no host is known for it") from None
        return hierarchy.plan(devs, owners, me, mode)

    def forget_plans(self) -> None:
        """The hosts of devices changed (a new topology): plans and boxes are worked out
        again."""
        self._plans.clear()
        self._boxes.clear()

    def tree(self, shard, key, plan: TreePlan, me, value, red):
        """In the shard's greenlet: the group's ``value``s folded by the reduction ``red``
        (``reduction.REDUCTIONS``) along the reduction tree, worked out once for all of
        this host's members of the group, with other hosts' nodes as ``plan`` says; and the
        modelled link seconds it took. Each member gets its own answer array (all_gather's
        list is shared: callers build new arrays from it)."""
        at = self._arrive(shard, key, me)
        group = self._tree_of(key, plan, red)
        position = plan.position[me]
        group.values[position] = (value, at)
        if group.like is None:
            group.like = value
        node, ps = plan.home[position]
        group.missing[node] -= 1
        if not group.missing[node]:  # (until then, nothing new for the steps above it)
            self._local_node(group, node, ps)
            self._advance(group)
        if group.answer is None and group.error is None:
            shard.waiting = ["group", group]
            self._park(shard, key, me)
            group.parked.append((me, shard))
            try:
                self.ex.park()  # resumed when the group has its answer
            finally:
                shard.waiting = None
                self._parked.pop((key, me), None)
        group.left -= 1
        if not group.left:
            self._groups.pop((key, plan.leader), None)
        if group.error is not None:
            raise group.error
        self.ex.timeline.leave_collective(shard, at, max(group.done_at, at), self.ex.now())
        answer = group.answer
        if group.left and not red.shared:
            answer = answer.copy()
        return answer, group.link_seconds

    def _tree_of(self, key, plan: TreePlan, red) -> _Tree:
        group = self._groups.get((key, plan.leader))
        if group is None:
            group = self._groups[(key, plan.leader)] = _Tree(key, plan, red)
            early = self._mail.pop((key, plan.leader), None)  # sent before any of us came
            for src, (value, at) in (early or {}).items():
                self._remote_node(group, src, value, at)
        return group

    def _local_node(self, group: _Tree, node, positions) -> None:
        """All of this host's members under ``node`` are here: fold their values."""
        values = group.values
        red = group.red
        leaves = [red.leaf(values[p][0]) for p in positions]
        if len(leaves) == 1:  # (the host's only member here: nothing to fold)
            value = _copy(leaves[0])  # a node must never share a member's own array
        else:
            try:
                with np.errstate(all="ignore"):  # an overflow is inf, as on a device
                    value = tree_fold(leaves, red.combine)
            except BaseException as exc:  # e.g. all_gather of different shapes
                self._tree_failed(group, exc)
                return
        at = max(values[p][1] for p in positions)
        plan = group.plan
        if plan.mode == "scatter":  # each host gets its chunk, this one keeps its own
            parts = hierarchy.chunks(value, len(plan.hosts))
            for j, part in enumerate(parts):
                if j != plan.index:
                    self._send(group, code(node, plan.n), (plan.leaders[j],), part, at)
            value = parts[plan.index]
        self._put(group, node, value, at)

    def _remote_node(self, group: _Tree, src, value, at: float) -> None:
        plan = group.plan
        j = chunk_of(src, plan.n) if plan.mode == "scatter" else None
        if j is not None:  # another host's finished chunk
            if j >= len(plan.hosts) or j == plan.index or j in group.finished:
                self._unexpected(group, f"chunk {j}")
                return
            group.received.append((1, getattr(value, "nbytes", 0)))
            group.finished[j] = (value, at)
            return
        node = node_of(src, plan.n)
        if node not in plan.expects or node in group.values:
            self._unexpected(group, f"the partial of positions {node[0]}..{node[1] - 1}")
            return
        group.received.append((0, getattr(value, "nbytes", 0)))
        group.values[node] = (value, at)

    def _unexpected(self, group: _Tree, what: str) -> None:
        """Another host sent what this host's plan does not expect: the hosts disagree on
        the algorithm (different settings, or different views of where devices are), so
        the group would wait for values that never come. It fails now, saying so."""
        log.error("exchange %r: %s came from another host unexpectedly", group.key, what)
        self._tree_failed(group, ProgramError(
            f"collective {group.key!r}: another host sent {what}, which this host's"
            f" {group.plan.mode} plan does not expect{_SAME_SETTINGS}"))

    def _put(self, group: _Tree, node, value, at: float) -> None:
        """This host has ``node``'s value: keep it, and send it where the plan says."""
        group.values[node] = (value, at)
        dsts = group.plan.sends.get(node)
        if dsts:
            self._send(group, code(node, group.plan.n), dsts, value, at)

    def _send(self, group: _Tree, src: int, dsts, value, at: float) -> None:
        """Queue ``value`` for the hosts of ``dsts``; a value that cannot leave fails the
        group at once (its peers learn it from the coordinator)."""
        try:
            self._queue_remote(group.key, src, dsts, value, at)
        except BaseException as exc:
            self._tree_failed(group, exc)

    def _advance(self, group: _Tree) -> None:
        """Combine every node whose children are here; answer once the root is."""
        values, combine = group.values, group.red.combine
        waiting = []
        for step in group.steps:  # children first: one pass finishes what it can
            node, left, right = step
            if group.error is not None or left not in values or right not in values:
                waiting.append(step)
                continue
            (a, at_a), (b, at_b) = values[left], values[right]
            try:
                with np.errstate(all="ignore"):  # an overflow is inf, as on a device
                    value = combine(a, b)
            except BaseException as exc:
                self._tree_failed(group, exc)
                return
            self._put(group, node, value, max(at_a, at_b))
        group.steps = waiting
        plan = group.plan
        root = values.get(plan.root)
        if root is None or group.answer is not None or group.error is not None:
            return
        like = group.like
        if plan.mode == "scatter":  # root is this host's chunk: share it, wait for the rest
            if plan.index not in group.finished:
                group.finished[plan.index] = root
                others = plan.leaders[:plan.index] + plan.leaders[plan.index + 1:]
                self._send(group, chunk_code(plan.index, plan.n), others, root[0], root[1])
                if group.error is not None:
                    return
            if len(group.finished) < len(plan.hosts):
                return
            got = [group.finished[j] for j in range(len(plan.hosts))]
            root = (np.concatenate([v for v, _ in got]).reshape(np.shape(like)),
                    max(at for _, at in got))
        try:
            group.answer = group.red.result(root[0], like)
        except BaseException as exc:
            self._tree_failed(group, exc)
            return
        group.done_at = root[1]
        group.link_seconds = plan.link_time(group.received)  # once, for every member
        self._wake(group)

    def _tree_failed(self, group: _Tree, exc: BaseException) -> None:
        if group.error is None:
            group.error = exc
            self._wake(group)

    def _wake(self, group: _Tree) -> None:
        for me, shard in group.parked:
            if self._parked.pop((group.key, me), None) is shard:
                self.ex.resume_later(shard, None)
        group.parked = []

    def receive(self, key, src, dsts, value, at: float) -> None:
        """A value from another host for this host's devices ``dsts`` (a tree node for the
        group whose leader here is ``dsts[0]``, or one device's value of an exchange)."""
        if key[0] in self._failed_gangs:
            return
        group = self._groups.get((key, dsts[0]))
        if group is not None:
            self._remote_node(group, src, value, at)
            self._advance(group)
            return
        for dst in dsts:  # an exchange with per-destination values, or one nobody reached yet
            self.deliver(key, src, dst, value, at)

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
                    missing = shard.waiting[1].missing_sources()
                else:
                    box = self._mail.get((key, me), {})
                    missing = [s for s in shard.waiting[1] if s not in box]
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
    ``(gang_key, sequence number)``; ``jax_device``: the JAX device the kernel's device is,
    on a host whose devices are JAX's own (its JAX segments run there). For the ICI cost
    model, ``bytes_sent_remote`` counts array bytes an exchange sent to other hosts (its time
    is ``cost.transfer_time`` of them) and ``link_seconds`` the modelled time of the
    hierarchical reductions' rounds between hosts (``hierarchy.TreePlan.link_time``).
    """

    def __init__(self, mesh_shape, axis_names, flat_index: int, devices, gang_key, executor,
                 shard, jax_device=None):
        # the mesh was checked when it was made: no KernelEnv checks per kernel
        self.mesh_shape, self.axis_names, self.flat_index = mesh_shape, axis_names, flat_index
        self.devices, self.gang_key = devices, gang_key
        self.executor, self.shard = executor, shard
        self.bytes_sent_remote = 0
        self.link_seconds = 0.0
        self._batches = 0  # batched segments reached so far
        self._box = None  # local_batch's answer
        self.jax_device = jax_device  # the JAX device this one is (--backend jax), or None

    def reduce_all(self, members, position, x, op="sum"):
        exchanges = self.executor.exchanges
        plan = exchanges.tree_plan(self.devices, members)
        if plan.scatters(getattr(x, "nbytes", 0), getattr(x, "size", 1), op):
            plan = exchanges.tree_plan(self.devices, members, "scatter")
        key = (self.gang_key, self.next_collective())
        answer, seconds = exchanges.tree(self.shard, key, plan, self.devices[members[position]],
                                         x, REDUCTIONS[op])
        self.link_seconds += seconds
        return answer

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
