"""What lowering hands the hosts: one plain spec per Plaque node, and the node's kind.

A lowered graph's nodes are made by ``HostOp(kind, spec)``: a picklable factory naming the
operator by kind (``KINDS``). Only a host runs it: the host's worker is given the table of its
operators as the service ``OPERATORS_SERVICE`` (``{kind: make(spec) -> operator}``, see
``pathways.host.operators``), so lowering, the client and the coordinator never import host
code.
"""

from __future__ import annotations

from dataclasses import dataclass

import plaque

from ..errors import PathwaysError
from ..program.compiled import Aval, CompiledFunction
from ..program.routing import RoutedFunction

KINDS = ("kernel", "send", "route", "expert", "gather")  # the node kinds lowering makes
OPERATORS_SERVICE = "operators"  # a host worker's service: {kind: make(spec) -> operator}
ROUTED_PORT = 1  # output port of routed rows, kept apart from port 0 (completion edges)


@dataclass(frozen=True)
class HostOp:
    """A node's factory: the operator of ``kind`` for ``spec``, on the host that runs it."""

    kind: str
    spec: object

    def __call__(self):
        if self.kind not in KINDS:
            raise PathwaysError(f"no {self.kind!r} operator: a host runs {', '.join(KINDS)}")
        return HostNode(self.kind, self.spec)


class HostNode(plaque.Operator):
    """A node's shard on its worker: the host's operator of its kind, made from the worker's
    ``OPERATORS_SERVICE`` table at its first event, and everything passed on to it."""

    __slots__ = ("kind", "spec", "op")

    def __init__(self, kind: str, spec):
        self.kind, self.spec, self.op = kind, spec, None

    def _made(self, ctx):
        table = ctx.services.get(OPERATORS_SERVICE)
        if table is None or self.kind not in table:
            raise PathwaysError(f"no {self.kind!r} operator on this worker: host operators run"
                                " on hosts")
        self.op = table[self.kind](self.spec)
        return self.op

    def on_start(self, ctx, t):
        (self.op or self._made(ctx)).on_start(ctx, t)

    def on_start_shards(self, shards, t):
        """The node's shards on this worker start run t: together if the host's operator
        of this kind starts them so (a kernel's gang); False (each its ``on_start``) if not."""
        ops = [(node.op or node._made(ctx), ctx) for node, ctx in shards]
        together = getattr(ops[0][0], "on_start_shards", None)
        return False if together is None else together(ops, t)

    def on_batch(self, ctx, t, port, values):
        (self.op or self._made(ctx)).on_batch(ctx, t, port, values)

    def on_input(self, ctx, t, port, value):
        (self.op or self._made(ctx)).on_input(ctx, t, port, value)

    def on_complete(self, ctx, t):
        (self.op or self._made(ctx)).on_complete(ctx, t)


@dataclass(frozen=True)
class Incoming:
    """An input that arrives by transfer: its shard shape and how many pieces each shard gets."""

    var: int
    shape: tuple[int, ...]
    dtype: object
    expect: tuple[int, ...]  # pieces per destination shard


@dataclass(frozen=True)
class KernelSpec:
    """A kernel node: equation ``index`` calls ``fn`` on every device of its mesh, reading
    buffers of the ``inputs`` var ids (or transfer buffers, ``incoming``) and writing the
    ``outputs``; each shard's outputs are checked against ``expect``."""

    index: int  # equation index in its program
    fn: CompiledFunction
    inputs: tuple[int, ...]  # var ids
    outputs: tuple[int, ...]
    releases: tuple  # per input: users sharing it where it lives (0: kept; None: moved)
    incoming: dict  # input index -> Incoming, for inputs that arrive by transfer
    expect: object  # compiled.Signature: what every shard's outputs must be
    ships: tuple = ()  # (output index, shards) of small program results: those shards' values
    # ride on the run's end to the client (one holder of each distinct part)


@dataclass(frozen=True)
class SendSpec:
    """A send node: the shards holding value ``var`` send each consumer shard its pieces
    (over the node's keyed edge), then release their hold on the value."""

    var: int
    devices: tuple[int, ...]  # where the value lives, per source shard
    pieces: tuple  # per source shard: (dst shard, src slices, dst slices, link) ...
    uses: int  # users of the value where it lives (0: a program input or output, kept)


@dataclass(frozen=True)
class RouteSpec:
    """A routed call (``expert_map``), shared by its route, expert and gather nodes: which
    rows go where, the links they cross, and the avals of what comes back."""

    index: int  # equation index
    fn: RoutedFunction
    inputs: tuple[int, ...]  # var ids: route, token args, params
    outputs: tuple[int, ...]
    releases: tuple  # per input: uses of the value where it lives (0: kept), None if moved
    incoming: dict  # input index -> Incoming, for inputs that arrive by transfer
    links: tuple  # links[token shard][expert shard]: "local" | "ici" | "dcn"
    out_avals: tuple[Aval, ...]
    row_avals: tuple[Aval, ...]  # one row (per slot) of each token argument
