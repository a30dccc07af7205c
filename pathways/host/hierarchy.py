"""Hierarchical collectives: which host computes which node of a group's reduction tree, and
what it sends to whom.

Every reduction of a group (psum, pmean, pmax, pmin, psum_scatter, all_gather) is defined as
its values folded along the reduction tree (``pathways.program.reduction.tree_fold``): a
node of positions [lo, hi) combines [lo, mid) and [mid, hi). A host computes that answer for
its members like this:

1. **Locally first.** A node whose positions are all on this host (a *local* node) is
   computed here from the members' values, with no message. When a host holds an aligned
   block of the group (the usual layout: 32 devices of a host are 32 consecutive positions),
   the whole block is one local node.
2. **Then across hosts**, by one of three algorithms, chosen by the number of hosts in the
   group (``FLAT_HOSTS``) and the payload (``SCATTER_BYTES``), never by anything local, so
   every host of a group picks the same:

   - *flat* (few hosts): each host sends its maximal local nodes to every other host of the
     group, and every host computes the rest of the tree itself. One round; H - 1 messages
     per host.
   - *tree* (recursive doubling over the tree): the hosts under a node all end up holding
     its value. At a node whose children are held by host sets L and R, each host of L that
     is not in R receives R's value from one host of R (the i-th from ``R[i % |R|]``), and
     the other way round; each then combines left with right itself. With power-of-two
     blocks that is one message in and out per tree level above the hosts: log2(H) rounds
     and messages per host, where the flat way has H - 1.
   - *scatter* (large payloads: psum, pmean, pmax, pmin of at least ``SCATTER_BYTES`` on 3
     hosts or more, where NCCL and XLA switch to a bandwidth-optimal ring; here a direct
     reduce-scatter and all-gather, the same bytes in two rounds): the values are cut
     into one contiguous chunk per host. Each host sends chunk j of its maximal local nodes to
     host j, which computes the rest of the tree for chunk j alone (a reduce-scatter), then
     sends its finished chunk to every other host (an all-gather). A host sends and receives
     2 (H - 1) / H of the payload, where the flat way moves H - 1 payloads and the tree
     log2(H); the additions are the tree's, elementwise, so the bits are too.

   All three compute the same tree, with the same operands in the same order, so the answer
   is bitwise the same on every host, whichever algorithm ran, and equal to
   ``pw.reference``'s.

Every host of a cluster must choose alike: ``PATHWAYS_FLAT_HOSTS`` and
``PATHWAYS_SCATTER_BYTES`` (read once, at import) set the two thresholds for a whole cluster
(``pw.local_cluster`` passes its environment on to its hosts), for experiments.

Modelled link time (``TreePlan.link_time``): a round costs ``latency + bytes / bandwidth`` of
its link (``pathways.program.cost.ICI``). The flat algorithm is one round whose bytes are
everything the host receives; the tree algorithm is one round per value it receives (they
come one after another, each level waiting for the one below):

    flat:     t = latency + (sum of received bytes) / bandwidth
    tree:     t = sum over received values of (latency + bytes / bandwidth)
    scatter:  t = 2 latency + (chunks received + finished chunks received) bytes / bandwidth

Local combining costs no link time (it is the host's memory). A node's value travels in the
reduction's working type (psum of bfloat16 adds in float32, so its partial sums travel as
float32 and are rounded once, at the root).

Nodes are ``(lo, hi)``. On the wire a node is its ``code`` (a negative int, so it never looks
like a device id): ``-1 - (lo * (n + 1) + hi)`` for a group of n positions; the scatter
algorithm's finished chunk j is ``-1 - ((n + 1) ** 2 + j)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..program.cost import ICI, transfer_time
from ..program.reduction import split_point


def _setting(name: str, default: int) -> int:
    """An integer threshold from the environment, or ``default``; a clear error if it is not
    a non-negative integer."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {text!r}")
    return value


# groups on at most this many hosts exchange flat; more take the tree
FLAT_HOSTS = _setting("PATHWAYS_FLAT_HOSTS", 4)
# reductions of at least this many bytes on 3 hosts or more scatter
SCATTER_BYTES = _setting("PATHWAYS_SCATTER_BYTES", 256 * 1024)


def chunk_code(j: int, n: int) -> int:
    """The wire number of the scatter algorithm's finished chunk ``j`` (negative, and below
    every node's ``code``)."""
    return -1 - ((n + 1) ** 2 + j)


def chunk_of(src: int, n: int) -> int | None:
    """The chunk a wire number names, or None if it names a node."""
    j = -1 - src - (n + 1) ** 2
    return j if j >= 0 else None


def chunks(value, parts: int) -> list:
    """``value`` flattened and cut into ``parts`` contiguous chunks (sizes differ by at most
    one element, the larger first)."""
    return np.array_split(np.ascontiguousarray(value).reshape(-1), parts)


def code(node: tuple, n: int) -> int:
    """``node``'s number on the wire (negative)."""
    return -1 - (node[0] * (n + 1) + node[1])


def node_of(src: int, n: int) -> tuple:
    """The node a wire ``code`` names."""
    return divmod(-1 - src, n + 1)


@dataclass(frozen=True)
class TreePlan:
    """This host's part in one group's reduction (see the module docstring).

    ``local``: the maximal local nodes, each with the positions it folds; ``steps``: the
    other nodes this host computes, ``(node, left, right)`` children first; ``sends``: node
    -> ``(leader device of the receiving host, ...)``; ``expects``: node -> the host that
    sends it here; ``position``: this host's member devices -> their positions; ``leader``:
    the device messages for this host's members name (its member of lowest position);
    ``home``: position -> its local node and that node's positions; ``mode``: "flat",
    "tree" or "scatter"; ``hosts``: the group's hosts in order, ``index`` this host's place
    among them and ``leaders`` their leader devices (what the scatter algorithm needs)."""

    n: int
    devs: tuple
    local: tuple
    steps: tuple
    sends: dict
    expects: dict
    position: dict
    home: dict
    leader: int
    root: tuple
    mode: str
    hosts: tuple
    index: int
    leaders: tuple

    def link_time(self, received: list) -> float:
        """Modelled seconds of the link rounds that brought ``received`` here: ``(round,
        bytes)`` of each value (round 0, or 1 for the scatter algorithm's finished chunks)."""
        if not received:
            return 0.0
        if self.mode == "tree":
            return sum(transfer_time(b, ICI) for _, b in received)
        rounds = {r for r, _ in received}
        return sum(transfer_time(sum(b for r2, b in received if r2 == r), ICI) for r in rounds)

    def scatters(self, nbytes: int, size: int, op: str) -> bool:
        """Whether a reduction ``op`` of ``nbytes`` (``size`` elements) takes the scatter
        algorithm: the same answer on every host of the group."""
        return scatters(op, nbytes, size, len(self.hosts))


def scatters(op: str, nbytes: int, size: int, hosts: int, threshold: int | None = None) -> bool:
    """Whether a reduction ``op`` of ``nbytes`` (``size`` elements) over ``hosts`` hosts
    takes the scatter algorithm, from ``threshold`` bytes (None: ``SCATTER_BYTES``)."""
    threshold = SCATTER_BYTES if threshold is None else threshold
    return op != "gather" and nbytes >= threshold and hosts >= 3 and size >= hosts


def plan(devs: tuple, owners: tuple, me, mode: str | None = None) -> TreePlan:
    """Host ``me``'s plan for the group of member devices ``devs`` (in position order), where
    ``owners[p]`` is the host of position p (any ints that every host of the group sees the
    same); ``mode``: the algorithm (None: flat or tree by the number of hosts)."""
    n = len(devs)
    hosts_of: dict = {}  # node -> the sorted hosts of its positions
    children: dict = {}
    order: list = []  # every node, children first

    def walk(lo: int, hi: int) -> tuple:
        node = (lo, hi)
        if hi - lo == 1:
            hosts_of[node] = (owners[lo],)
        else:
            mid = lo + split_point(hi - lo)
            left, right = walk(lo, mid), walk(mid, hi)
            children[node] = (left, right)
            hosts_of[node] = tuple(sorted(set(hosts_of[left]) | set(hosts_of[right])))
        order.append(node)
        return node

    root = walk(0, n)
    leader_of: dict = {}
    for p, host in enumerate(owners):
        leader_of.setdefault(host, devs[p])
    if mode is None:
        mode = "flat" if len(hosts_of[root]) <= FLAT_HOSTS else "tree"

    upper = [node for node in order if len(hosts_of[node]) > 1]  # on several hosts
    # the maximal local nodes: on one host, and the root or a child of a node on several
    tops = [node for node in (root, *(c for u in upper for c in children[u]))
            if len(hosts_of[node]) == 1]
    local = tuple((node, tuple(range(*node))) for node in tops if hosts_of[node] == (me,))
    sends: dict = {}
    expects: dict = {}
    if mode != "tree":  # flat, and scatter on chunks: every host computes the upper tree
        steps = tuple((node, *children[node]) for node in upper)
        if mode == "flat":  # (scatter sends chunks of its local nodes instead)
            others = tuple(leader_of[h] for h in hosts_of[root] if h != me)
            sends = {node: others for node, _ in local}
        for node in tops:
            if hosts_of[node] != (me,):
                expects[node] = hosts_of[node][0]
    else:
        steps = tuple((node, *children[node]) for node in upper if me in hosts_of[node])
        for node in upper:
            left, right = children[node]
            for have, need in ((left, right), (right, left)):
                # the hosts holding ``have`` that lack ``need`` get it from one holder each
                holders = hosts_of[need]
                lacking = [h for h in hosts_of[have] if h not in holders]
                for i, h in enumerate(lacking):
                    sender = holders[i % len(holders)]
                    if h == me:
                        expects[need] = sender
                    if sender == me:
                        sends.setdefault(need, []).append(leader_of[h])
        sends = {node: tuple(dsts) for node, dsts in sends.items()}
    position = {devs[p]: p for p in range(n) if owners[p] == me}
    home = {p: (node, ps) for node, ps in local for p in ps}
    hosts = hosts_of[root]
    return TreePlan(n, tuple(devs), local, steps, sends, expects, position, home,
                    leader_of[me], root, mode, hosts, hosts.index(me),
                    tuple(leader_of[h] for h in hosts))
