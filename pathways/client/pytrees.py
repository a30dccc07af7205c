"""Trees of values for ``client.put`` and ``client.device_put``: their leaves with paths, one
spec or sharding per leaf from a tree prefix, and each leaf as a numeric numpy array. No I/O.

A tree is what JAX calls a pytree. When JAX is loaded (``"jax"`` in ``sys.modules``) its
``jax.tree_util`` reads the tree, so every type registered with it (flax's, equinox's, optax's
states) is a node. Otherwise a small walker reads dicts (keys in sorted order), lists, tuples,
namedtuples and None (a node without leaves), as ``jax.tree_util`` reads them; nothing else
can be a node then, since registering one needs JAX. Paths print as JAX's ``keystr`` does:
``['params']['w']``, ``[0]``, ``.mu``.

Worked example: ``{"w": w, "opt": (m, None)}`` with the prefix ``{"w": P("d"), "opt": P()}``
has leaves ``m`` at ``['opt'][0]`` (spec ``P()``) and ``w`` at ``['w']`` (spec ``P("d")``);
the None stays None in the result.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import ProgramError, ShardingError

__all__ = ["at", "flatten", "numeric", "per_leaf", "unflatten", "where"]

_LEAF = "*"


def _jax_tree_util():
    """``jax.tree_util`` if JAX is loaded, else None (importing nothing)."""
    return getattr(sys.modules.get("jax"), "tree_util", None)


def _children(x):
    """(node, [(key, child)]) of a container of the plain walker, or None for a leaf."""
    if x is None:
        return (type(None), ()), []
    if type(x) is dict:
        try:
            keys = sorted(x)
        except TypeError:
            raise ProgramError(f"a dict in the tree has keys that cannot be sorted (as JAX's"
                               f" trees need): {sorted(map(repr, x))}") from None
        return (dict, tuple(keys)), [(f"[{k!r}]", x[k]) for k in keys]
    if type(x) in (list, tuple):
        return (type(x), len(x)), [(f"[{i}]", c) for i, c in enumerate(x)]
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
        return (type(x), x._fields), [(f".{n}", getattr(x, n)) for n in x._fields]
    return None


def flatten(tree) -> tuple[list, list[str], object]:
    """(leaves, their paths, the tree's structure) of ``tree``."""
    tu = _jax_tree_util()
    if tu is None:
        return _plain_flatten(tree)
    pairs, treedef = tu.tree_flatten_with_path(tree)
    return [leaf for _, leaf in pairs], [tu.keystr(p) for p, _ in pairs], treedef


def _plain_flatten(tree) -> tuple[list, list[str], object]:
    leaves, paths = [], []

    def walk(x, path):
        node = _children(x)
        if node is None:
            leaves.append(x)
            paths.append(path)
            return _LEAF
        kind, children = node
        return kind, tuple(walk(c, path + key) for key, c in children)

    try:
        return leaves, paths, walk(tree, "")
    finally:
        del walk  # a recursive closure is a cycle: it would keep the leaves until a GC


def _is_plain(treedef) -> bool:
    """Whether ``treedef`` is the plain walker's (else it is JAX's)."""
    return isinstance(treedef, (tuple, str))


def unflatten(treedef, leaves):
    """The tree of structure ``treedef`` (from ``flatten``) holding ``leaves`` in order."""
    if not _is_plain(treedef):
        return _jax_tree_util().tree_unflatten(treedef, leaves)
    it = iter(leaves)

    def build(d):
        if d == _LEAF:
            return next(it)
        (kind, meta), children = d
        values = [build(c) for c in children]
        if kind is type(None):
            return None
        if kind is dict:
            return dict(zip(meta, values))
        return kind(values) if kind in (list, tuple) else kind(*values)

    try:
        return build(treedef)
    finally:
        del build  # a recursive closure is a cycle: it would keep the leaves until a GC


def per_leaf(prefix, tree, treedef, n_leaves: int, is_item, what: str) -> list:
    """One item of ``prefix`` per leaf of ``tree`` (structure ``treedef``, ``n_leaves``
    leaves): a leaf of ``prefix``, or a subtree ``is_item`` says is one, stands for every leaf
    under it, as in JAX's tree prefixes. A prefix that does not match is a ProgramError."""
    if is_item(prefix):
        return [prefix] * n_leaves
    if not _is_plain(treedef):
        try:
            broadcast = _jax_tree_util().tree_broadcast(prefix, tree, is_leaf=is_item)
            return treedef.flatten_up_to(broadcast)
        except (ValueError, TypeError) as exc:
            raise ProgramError(f"{what}: {prefix!r} is neither one item for every leaf nor a"
                               f" tree prefix of the value: {exc}") from None
    out: list = []

    def walk(p, x, path):
        pnode = None if is_item(p) else _children(p)
        if pnode is None:
            out.extend([p] * len(_plain_flatten(x)[0]))
            return
        xnode = _children(x)
        if xnode is None or pnode[0] != xnode[0]:
            raise ProgramError(f"{what}: {prefix!r} is neither one item for every leaf nor a"
                               f" tree prefix of the value: at {path or 'the top'} it has"
                               f" {_describe(p)} where the value has {_describe(x)}")
        for (key, pc), (_, xc) in zip(pnode[1], xnode[1]):
            walk(pc, xc, path + key)

    try:
        walk(prefix, tree, "")
    finally:
        del walk  # a recursive closure is a cycle: it would keep the tree until a GC
    return out


def _describe(x) -> str:
    node = _children(x)
    if node is None:
        return f"a {type(x).__name__}"
    (kind, meta), _ = node
    if kind is dict:
        return "a dict of keys " + ", ".join(map(repr, meta))
    return "None" if kind is type(None) else f"a {kind.__name__} of {len(node[1])}"


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
