"""The reduction tree: the one documented order in which every collective reduction of a
group (psum, pmean, pmax, pmin, psum_scatter, all_gather) folds its members' values, and how
each of them folds (``REDUCTIONS``).

Whatever computes a reduction -- ``pw.reference`` on numpy, a host's batched JAX computation,
hosts combining partial results (``pathways.host.hierarchy``) -- it combines the same operands
in the same order, so the answer is bitwise the same everywhere.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["REDUCTIONS", "Reduction", "ordered_sum", "split_point", "sum_dtype", "tree_fold"]


def split_point(size: int) -> int:
    """Where the reduction tree splits a node of ``size`` >= 2 positions: after the largest
    power of two below ``size`` (so 8 splits 4 + 4 and 6 splits 4 + 2)."""
    return 1 << ((size - 1).bit_length() - 1)


def tree_fold(values: list, combine):
    """``values`` folded along the reduction tree: a node of positions [lo, hi) is
    ``combine(node [lo, mid), node [mid, hi))`` with ``mid = lo + split_point(hi - lo)``,
    a single position its own value. This is the order every collective reduction is
    documented to follow (``pw.reference`` included), whatever computes it: a host that
    holds an aligned block of the positions computes that block's node by itself, and hosts
    then combine their nodes pairwise (``pathways.host.hierarchy``). For 8 values:
    ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))."""
    def fold(lo: int, hi: int):
        if hi - lo == 1:
            return values[lo]
        mid = lo + split_point(hi - lo)
        return combine(fold(lo, mid), fold(mid, hi))

    try:
        return fold(0, len(values))
    finally:
        del fold  # a recursive closure is a cycle: it would keep the values until a GC


class Reduction:
    """How a collective folds its group's values along the reduction tree: ``leaf(x)`` is a
    member's value as a tree node (psum widens narrow floats, all_gather adds a leading
    dimension), ``combine(left, right)`` makes a node from its two children (a new array,
    never one of them), ``result(root, like)`` is the answer from the whole tree's node and
    a member's own ``x`` (psum rounds once to that value's type)."""

    __slots__ = ("name", "leaf", "combine", "result", "shared")

    def __init__(self, name: str, leaf, combine, result, shared: bool = False):
        self.name, self.leaf, self.combine, self.result = name, leaf, combine, result
        self.shared = shared  # its answer may be shared by members (they build from it)

    def fold(self, values: list):
        """The answer for these values in position order (each member's ``x``)."""
        leaves = [self.leaf(v) for v in values]
        root = tree_fold(leaves, self.combine)
        if len(leaves) == 1 and isinstance(root, np.ndarray):
            root = root.copy()  # an answer never shares memory with a member's value
        return self.result(root, values[0])


def _sum_leaf(x):
    wide = sum_dtype(x.dtype)
    return x if wide == x.dtype else x.astype(wide)


def _sum_result(root, like):
    dtype = like.dtype
    return np.asarray(root.astype(dtype) if root.dtype != dtype else root)


def _same(x):
    return x


REDUCTIONS = {
    "sum": Reduction("sum", _sum_leaf, np.add, _sum_result),
    "max": Reduction("max", _same, np.maximum, lambda root, like: np.asarray(root)),
    "min": Reduction("min", _same, np.minimum, lambda root, like: np.asarray(root)),
    # every member's value, stacked: a node is the values of its positions, in order
    "gather": Reduction("gather", lambda x: np.asarray(x)[None],
                        lambda a, b: np.concatenate((a, b)), lambda root, like: list(root),
                        shared=True),
}


def ordered_sum(values: list) -> np.ndarray:
    """psum's reduction: ``values`` added along the reduction tree (``tree_fold``), in their
    ``sum_dtype`` and rounded to their own type once at the end, as JAX's psum does."""
    return REDUCTIONS["sum"].fold(values)


@functools.cache
def sum_dtype(dtype: np.dtype) -> np.dtype:
    """The type psum adds values of ``dtype`` in. XLA (JAX on CPU, measured with jax 0.10)
    adds ml_dtypes' narrow floats in a wider type and rounds once: float16 for the ones
    whose every value it holds (float8, float6, float4), float32 for the others (bfloat16,
    float8_e8m0fnu). Every other type adds in itself (float16 too, rounding at each step)."""
    if dtype.type.__module__ != "ml_dtypes" or dtype.itemsize > 2:  # (complex32: 4 bytes)
        return dtype
    import ml_dtypes

    try:
        info = ml_dtypes.finfo(dtype)
    except ValueError:  # int4 and friends: integers add in themselves
        return dtype
    half = np.finfo(np.float16)
    holds = float(info.max) <= float(half.max) and info.nmant <= half.nmant \
        and float(info.smallest_subnormal) >= float(half.smallest_subnormal)
    return np.dtype(np.float16 if holds else np.float32)
