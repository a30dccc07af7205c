"""Pytrees: tuples, lists, dicts, namedtuples and dataclasses of arrays, as JAX's tree_util reads
them (dict keys in sorted order; a partition spec ``P`` is a leaf), and once JAX is loaded every
type registered with ``jax.tree_util`` (flax's, equinox's, optax's states, an ``OrderedDict``),
through JAX's own flattening. In a tree of values None is
a node without leaves, as in JAX (``{"w": w, "b": None}`` has one leaf, and gives None back);
in a tree of specs (``per_leaf``'s prefix, ``is_node``) None is a leaf: the spec of what is
static, as JAX reads specs.

>>> w, b1, b2 = 1.0, 2.0, 3.0
>>> leaves, treedef = flatten({"w": w, "b": (b1, b2)})     # and a hashable treedef
>>> leaves
[2.0, 3.0, 1.0]
>>> unflatten(treedef, leaves) == {"w": w, "b": (b1, b2)}
True
>>> per_leaf(P("data"), {"w": w, "b": (b1, b2)})           # a spec prefix, one per leaf
[P('data'), P('data'), P('data')]
"""

from __future__ import annotations

import dataclasses
import sys

from ..errors import ProgramError

__all__ = ["flatten", "is_node", "per_leaf", "unflatten", "with_paths"]

LEAF = "*"
NONE = ((None, None), ())  # a None in a tree of values: a node of no leaves


def is_node(x) -> bool:
    """Whether ``x`` is a container of the tree (not a leaf): decided by its type, once per
    type (every call of a function asks it of each argument)."""
    kind = type(x)
    node = _NODE_TYPES.get(kind)
    if node is None:
        node = (kind in (tuple, list, dict)
                or (issubclass(kind, tuple) and hasattr(kind, "_fields"))  # a namedtuple
                or (dataclasses.is_dataclass(kind) and not issubclass(kind, type))
                or _registered(x) is not None)
        if len(_NODE_TYPES) < TYPES_KEPT:
            _NODE_TYPES[kind] = node
    return node


def _registered(x):
    """``x``'s children as JAX flattens a node of a type registered with ``jax.tree_util``
    (``(treedef of one level, [(key path, child)])``), or None: not such a node, or JAX not
    loaded (then nothing can be registered)."""
    tu = getattr(sys.modules.get("jax"), "tree_util", None)
    if tu is None or x is None:
        return None
    pairs, treedef = tu.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    if len(pairs) == 1 and pairs[0][1] is x:
        return None
    return treedef, pairs


TYPES_KEPT = 4096  # types whose kind (node or leaf) is_node remembers
_NODE_TYPES: dict[type, bool] = {}


def _children(x):
    """(node description, children, their keys as Python reaches them) of a container."""
    if type(x) is dict:  # (an OrderedDict is JAX's: keys in their order)
        try:
            keys = tuple(sorted(x))
        except TypeError:
            raise ProgramError(f"a dict in the tree has keys that cannot be sorted (as JAX's"
                               f" trees need): {sorted(map(repr, x))}; use keys of one type"
                               ) from None
        return ("dict", keys), [x[k] for k in keys], [f"[{k!r}]" for k in keys]
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple: its fields by name
        return (type(x), len(x)), list(x), [f".{n}" for n in x._fields]
    if isinstance(x, (tuple, list)):
        return (type(x), len(x)), list(x), [f"[{i}]" for i in range(len(x))]
    if not dataclasses.is_dataclass(x):  # a type registered with JAX: its own flattening
        treedef, pairs = _registered(x)
        keystr = sys.modules["jax"].tree_util.keystr
        return ("jax", treedef), [c for _, c in pairs], [keystr(p) for p, _ in pairs]
    names = tuple(f.name for f in dataclasses.fields(x))
    return (type(x), names), [getattr(x, n) for n in names], [f".{n}" for n in names]


def flatten(tree) -> tuple[list, tuple]:
    """The leaves of ``tree`` in order, and its structure (hashable)."""
    leaves: list = []

    def walk(x):
        if x is None:
            return NONE
        if not is_node(x):
            leaves.append(x)
            return LEAF
        node, children, _ = _children(x)
        return (node, tuple([walk(c) for c in children]))

    try:
        return leaves, walk(tree)
    finally:
        # a recursive closure is a cycle: it would keep the leaves (a call's arrays) alive
        # until the cyclic GC, and with them their shards on the hosts
        del walk


def unflatten(treedef, leaves):
    """The tree of structure ``treedef`` holding ``leaves`` in order."""
    it = iter(leaves)

    def build(d):
        if d == LEAF:
            return next(it)
        if d == NONE:
            return None
        (kind, meta), children = d
        values = [build(c) for c in children]
        if kind == "dict":
            return dict(zip(meta, values))
        if kind == "jax":
            return meta.unflatten(values)
        if kind in (tuple, list):
            return kind(values)
        if isinstance(kind, type) and issubclass(kind, tuple):  # namedtuple
            return kind(*values)
        return kind(**dict(zip(meta, values)))

    try:
        return build(treedef)
    finally:
        del build  # a recursive closure is a cycle: it would keep the leaves until a GC


def with_paths(tree, path: str = ""):
    """``(path, leaf)`` for every leaf of ``tree`` in order, each path written as Python would
    reach the leaf from ``path``: ``argument 0[3]``, ``argument 1['w'].b``."""
    if tree is None:
        return  # no leaves
    if not is_node(tree):
        yield path, tree
        return
    _, children, keys = _children(tree)
    for key, child in zip(keys, children):
        yield from with_paths(child, path + key)


def per_leaf(prefix, tree, what: str = "specs", path: str = "", is_item=None) -> list:
    """One item of ``prefix`` per leaf of ``tree``: a leaf of the prefix (a ``P`` or None),
    or a subtree ``is_item`` says is one (a ``NamedSharding``), stands for every leaf under
    it, as JAX's tree prefixes do (a tuple and a list of the same length match). A mismatch is
    a ProgramError naming where it is (``path`` names ``tree``)."""
    if not is_node(prefix) or (is_item is not None and is_item(prefix)):
        return [prefix] * len(flatten(tree)[0])
    where = path or "the top"
    if not is_node(tree):
        raise ProgramError(f"{what} has {_describe(prefix)} where {where} is"
                           f" {'None' if tree is None else 'an array'}")
    (pk, pm), pc, _ = _children(prefix)
    (tk, tm), tc, keys = _children(tree)
    if not (pm == tm and (pk == tk or {pk, tk} <= {tuple, list})):
        raise ProgramError(f"{what} has {_describe(prefix)} where {where} is"
                           f" {_describe(tree)}")
    out = []
    for p, t, key in zip(pc, tc, keys):
        out += per_leaf(p, t, what, path + key, is_item)
    return out


def _describe(tree) -> str:
    if not is_node(tree):
        return "an array"
    (kind, meta), children, _ = _children(tree)
    if kind == "dict":
        return "a dict of keys " + ", ".join(map(repr, meta))
    if kind == "jax":
        return f"a {type(tree).__name__} of {len(children)}"
    name = kind.__name__ if isinstance(kind, type) else str(kind)
    return f"a {name} of {len(children)}"
