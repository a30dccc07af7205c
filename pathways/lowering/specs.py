"""What lowering hands the hosts: one plain spec per Plaque node, and the node's kind.

A lowered graph's nodes are made by ``HostOp(kind, spec)``: a picklable factory naming the
operator by kind ("kernel", "send", "route", "expert", "gather"). Only a host runs it, and the
host package fills ``OPERATORS`` with its operator classes, so lowering, the client and the
coordinator never import host code.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PathwaysError
from ..program.compiled import Aval, CompiledFunction
from ..program.routing import RoutedFunction

OPERATORS: dict[str, type] = {}  # kind -> operator class; filled by pathways.host
ROUTED_PORT = 1  # output port of routed rows, kept apart from port 0 (completion edges)


@dataclass(frozen=True)
class HostOp:
    """A node's factory: the operator of ``kind`` for ``spec``, on the host that runs it."""

    kind: str
    spec: object

    def __call__(self):
        op = OPERATORS.get(self.kind)
        if op is None:
            raise PathwaysError(f"no {self.kind!r} operator in this process: host operators"
                                " run on hosts (import pathways.host)")
        return op(self.spec)


@dataclass(frozen=True)
class Incoming:
    """An input that arrives by transfer: its shard shape and how many pieces each shard gets."""

    var: int
    shape: tuple[int, ...]
    dtype: object
    expect: tuple[int, ...]  # pieces per destination shard


@dataclass(frozen=True)
class KernelSpec:
    index: int  # equation index in its program
    fn: CompiledFunction
    inputs: tuple[int, ...]  # var ids
    outputs: tuple[int, ...]
    releases: tuple  # per input: users sharing it where it lives (0: kept; None: moved)
    incoming: dict  # input index -> Incoming, for inputs that arrive by transfer
    expect: object  # compiled.Signature: what every shard's outputs must be


@dataclass(frozen=True)
class SendSpec:
    var: int
    devices: tuple[int, ...]  # where the value lives, per source shard
    pieces: tuple  # per source shard: (dst shard, src slices, dst slices, link) ...
    uses: int  # users of the value where it lives (0: a program input or output, kept)



@dataclass(frozen=True)
class RouteSpec:
    index: int  # equation index
    fn: RoutedFunction
    inputs: tuple[int, ...]  # var ids: route, token args, params
    outputs: tuple[int, ...]
    releases: tuple  # per input: uses of the value where it lives (0: kept), None if moved
    incoming: dict  # input index -> Incoming, for inputs that arrive by transfer
    links: tuple  # links[token shard][expert shard]: "local" | "ici" | "dcn"
    out_avals: tuple[Aval, ...]
    row_avals: tuple[Aval, ...]  # one row (per slot) of each token argument
