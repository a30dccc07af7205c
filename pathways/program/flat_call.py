"""A ``shard_map`` call on pytrees, as a function of one argument and one result per leaf.

JAX reads ``in_specs`` as a tree prefix of the tuple of arguments and ``out_specs`` as one of
whatever the body returns: a single ``P('i')`` stands for every leaf under it, so a body
returning ``(loss, grads)`` with ``out_specs=P()`` has a spec for each leaf of both. The IR
knows only flat functions (an equation's inputs and outputs are arrays), so a call runs a
flat twin: its body puts the leaves back into the arguments' structure, calls the user's body
and flattens what it returns; its specs are the prefixes spelled out leaf by leaf. What the
body returns (its structure) comes from abstract evaluation, before anything runs.
"""

from __future__ import annotations

from ..errors import ProgramError
from . import tree

__all__ = ["FlatBody", "in_leaf_specs", "is_flat"]


class FlatBody:
    """The user's ``body`` on leaves: arguments of structure ``in_def`` in, the leaves of a
    result of structure ``out_def`` out (a tuple). ``func`` is the body, as in
    ``functools.partial``, so ``jax_body.uses_jax`` looks into it."""

    def __init__(self, body, in_def, out_def, name: str):
        self.func, self.in_def, self.out_def, self.__name__ = body, in_def, out_def, name

    def __call__(self, *leaves):
        out_leaves, out_def = tree.flatten(self.func(*tree.unflatten(self.in_def, leaves)))
        if out_def != self.out_def:
            raise ProgramError(f"{self.__name__} returned another structure than it did in"
                               f" abstract evaluation: {out_def} instead of {self.out_def}")
        return tuple(out_leaves)


class WithStatics:
    """The user's ``body`` called on the arguments that are arrays, with its static ones put
    back at their ``positions``: non-arrays under a ``None`` in_spec, which JAX's shard_map
    hands every device as they are (``static_positions``). ``func`` and ``args`` as in
    ``functools.partial``, so ``jax_body.uses_jax`` looks into them."""

    def __init__(self, body, positions: tuple, statics: tuple, name: str):
        self.func, self.positions, self.args, self.__name__ = body, positions, statics, name

    def __call__(self, *arrays):
        args = list(arrays)
        for i, value in zip(self.positions, self.args):
            args.insert(i, value)
        return self.func(*args)


def static_positions(specs, args) -> tuple:
    """The positions of a call's static arguments: those whose in_spec is ``None`` (``specs``
    a tuple of one entry per argument) and that hold nothing with a shape and dtype."""
    if type(specs) is not tuple or len(specs) != len(args) or None not in specs:
        return ()
    return tuple(i for i, (spec, arg) in enumerate(zip(specs, args)) if spec is None and not any(
        hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in tree.flatten(arg)[0]))


def in_leaf_specs(name: str, specs, args) -> list:
    """One spec per leaf of ``args`` (the call's tuple): ``specs`` is one spec for all, or a
    tuple (or list) with one entry, itself a prefix, per argument."""
    if not tree.is_node(specs):
        return [specs] * len(tree.flatten(args)[0])
    if not isinstance(specs, (tuple, list)):
        raise ProgramError(f"{name}: in_specs is a {type(specs).__name__}; it must be one spec"
                           " for every argument, or a tuple with one entry per argument")
    if len(specs) != len(args):
        raise ProgramError(f"{name}: in_specs has {len(specs)} entries for {len(args)}"
                           " arguments (give one entry per argument, or one P for all)")
    out: list = []
    for i, (spec, arg) in enumerate(zip(specs, args)):
        out += tree.per_leaf(spec, arg, f"{name}: in_specs", f"argument {i}")
    return out


def is_flat(fn, args, out) -> bool:
    """Whether ``fn`` itself is the flat function for a call on ``args`` returning ``out``:
    arrays in, and an array out for a single out spec or a tuple of arrays for a tuple."""
    if any(tree.is_node(a) for a in args):
        return False
    if fn.single_output:
        return not tree.is_node(out)
    return (type(out) is tuple and len(out) == len(fn.out_specs)
            and not any(tree.is_node(o) for o in out))
