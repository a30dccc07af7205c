"""A call's arguments, checked before anything is traced or sent: every leaf a live
``pw.Array`` of one client, else a ProgramError naming the leaf and what to do instead."""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError
from . import tree
from .ir import Aval, RemoteValue
from .jax_outer import is_tracer

__all__ = ["check_arguments", "describe"]


def check_arguments(name: str, args, client=None) -> None:
    """A call's arguments outside a program, checked before anything is traced or sent:
    every leaf (of tuples, lists, dicts and dataclasses too) a live ``pw.Array`` of one
    client (``client``, the function's, when known; a call of no arguments runs there, as
    JAX's shard_map of no arguments runs on its mesh). Else ``ProgramError`` naming the
    argument and the leaf ("argument 0[3]"), and what to do instead."""
    if not args:
        if client is not None:  # a function of no arguments: its mesh says where it runs
            return
        raise ProgramError(f"{name}: call with pw.Array arguments (client.put(...)); for"
                           " numpy use pw.reference(f)")
    owner = client
    for arg in args:  # the usual call: live arrays of one client, no tree to walk
        if not isinstance(arg, RemoteValue) or arg.is_deleted():
            break
        if owner is None:
            owner = arg.client
        elif arg.client is not owner:
            break
    else:
        return
    leaves = tree.flatten(args)[0]  # trees of live arrays of one client: no paths needed
    want = client if client is not None or not leaves else getattr(leaves[0], "client", None)
    if want is not None and all(isinstance(a, RemoteValue) and not a.is_deleted()
                                and a.client is want for a in leaves):
        return
    first = None  # else the first leaf that is not, named by its path
    for i, arg in enumerate(args):
        for path, leaf in tree.with_paths(arg, f"argument {i}"):
            if is_tracer(leaf):
                raise ProgramError(
                    f"{name}: {path} is a JAX tracer ({type(leaf).__name__}): it was called"
                    " inside a JAX transformation (jax.grad, jax.jit, jax.vmap, ...), which"
                    " pw.shard_map functions and @pw.program support from outside (their"
                    " gradient runs on the cluster too), but an expert_map does not:"
                    " transform inside its expert body instead")
            if not isinstance(leaf, RemoteValue):
                raise ProgramError(
                    f"{name}: {path} is {describe(leaf)}, not a pw.Array. Put the value on"
                    " the cluster first (x = client.put(value, mesh, spec)) and pass the"
                    " array; a constant the body needs can be closed over by the body;"
                    " for numpy in, numpy out use pw.reference(f)")
            if leaf.is_deleted():
                raise ProgramError(f"{name}: {path} was deleted (array.delete()); pass an"
                                   " array that is still alive")
            if first is None:
                first = path
                if client is None:
                    client = leaf.client
                elif leaf.client is not client:
                    raise ProgramError(f"{name}: {path} belongs to another client than the"
                                       " mesh of the function; put it with that client")
            elif leaf.client is not client:
                raise ProgramError(f"{name}: {path} belongs to another client than {first};"
                                   " the arrays of one call must all belong to one client")
    if first is None:
        raise ProgramError(f"{name}: the arguments hold no pw.Array; call with arrays put on"
                           " the cluster (client.put(...))")


def describe(value) -> str:
    """What a wrong argument is, briefly: ``a float (0.0)``, ``a numpy.ndarray float64[8]``."""
    if isinstance(value, np.ndarray):
        return f"a numpy.ndarray {Aval.of(value)}"
    text, kind = repr(value), type(value).__name__
    kind = f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}"
    return f"{kind} ({text})" if len(text) <= 40 else kind
