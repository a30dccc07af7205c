"""The table of a host's operators: which class runs each kind of node a lowered graph has.

Lowering names a node's operator by kind (``pathways.lowering.specs.HostOp``); a host that
starts hands its Plaque worker ``operator_table(host)`` as the ``OPERATORS_SERVICE`` service,
and each node's shard is made from it with the host's ``HostServices``. Nothing is registered
when a module is imported: this table is the one place kinds meet classes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import plaque

from ..lowering.specs import KINDS
from .kernel import KernelOp, SendOp
from .routing import ExpertOp, GatherOp, RouteOp
from .services import HostServices

__all__ = ["host_operators", "operator_table"]


def host_operators() -> dict[str, type]:
    """``{kind: operator class}`` for every kind of node lowering makes; each class is made
    as ``cls(spec, host)``."""
    table = {"kernel": KernelOp, "send": SendOp, "route": RouteOp, "expert": ExpertOp,
             "gather": GatherOp}
    assert set(table) == set(KINDS), "a kind lowering makes has no operator here"
    return table


def operator_table(host: HostServices) -> dict[str, Callable[[object], plaque.Operator]]:
    """``{kind: make(spec)}``: the host's operators bound to ``host``, for its worker."""
    return {kind: functools.partial(cls, host=host) for kind, cls in host_operators().items()}
