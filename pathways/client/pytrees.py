"""Trees of values for ``client.put`` and ``client.device_put``: their leaves with paths, one
spec or sharding per leaf from a tree prefix, and each leaf as a numeric numpy array. No I/O.

A tree is what JAX calls a pytree, read by ``pathways.program.tree``, the walker of a
function's arguments too (so what ``put`` takes as a tree a function takes): dicts (keys in
sorted order), lists, tuples, namedtuples, dataclasses and None (a node without leaves), and,
once JAX is loaded, every type registered with ``jax.tree_util`` (flax's, equinox's, optax's
states). Paths print as JAX's ``keystr`` does: ``['params']['w']``, ``[0]``, ``.mu``.

Worked example: ``{"w": w, "opt": (m, None)}`` with the prefix ``{"w": P("d"), "opt": P()}``
has leaves ``m`` at ``['opt'][0]`` (spec ``P()``) and ``w`` at ``['w']`` (spec ``P("d")``);
the None stays None in the result.
"""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError, ShardingError
from ..program import tree as _tree

__all__ = ["at", "flatten", "numeric", "per_leaf", "unflatten", "where"]


def flatten(tree) -> tuple[list, list[str], object]:
    """(leaves, their paths, the tree's structure) of ``tree``."""
    leaves, treedef = _tree.flatten(tree)
    return leaves, [path for path, _ in _tree.with_paths(tree)], treedef


def unflatten(treedef, leaves):
    """The tree of structure ``treedef`` (from ``flatten``) holding ``leaves`` in order."""
    return _tree.unflatten(treedef, leaves)


def per_leaf(prefix, tree, is_item, what: str) -> list:
    """One item of ``prefix`` per leaf of ``tree``: a leaf of ``prefix``, or a subtree
    ``is_item`` says is one, stands for every leaf under it, as in JAX's tree prefixes. A
    prefix that does not match is a ProgramError."""
    return _tree.per_leaf(prefix, tree, f"{what}: the tree prefix {prefix!r}",
                          is_item=is_item)


def where(path: str) -> str:
    """How an error names the leaf at ``path``."""
    return f"leaf {path}" if path else "the value"


def numeric(leaf, path: str, what: str) -> np.ndarray:
    """``leaf`` as a numpy array (no copy where numpy needs none), refusing what numpy can
    make no numeric array of (a string, a set, an object of its own): such a leaf would
    only fail later, inside a body. An ``np.ndarray`` is taken as it is, whatever its dtype:
    an object array given as one travels pickled."""
    if isinstance(leaf, np.ndarray):
        return leaf
    try:
        value = np.asarray(leaf)
    except (TypeError, ValueError) as exc:
        value, why = None, f" ({exc})"
    else:
        why = ""
    if value is None or value.dtype.kind in "OSU":
        kind = type(leaf).__qualname__
        if type(leaf).__module__ != "builtins":
            kind = f"{type(leaf).__module__}.{kind}"
        raise ProgramError(
            f"{what}: {where(path)} is a {kind},"
            f" of which numpy makes no numeric array{why}; {what} takes arrays (numpy, JAX,"
            f" pw.Array), Python numbers, and trees of them (dicts, lists, tuples, None)")
    return value


def at(path: str, exc: ShardingError) -> ShardingError:
    """``exc`` saying which leaf it is about."""
    return ShardingError(f"{where(path)}: {exc}") if path else exc
