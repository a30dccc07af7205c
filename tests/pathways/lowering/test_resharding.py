"""Resharding plans move every element exactly once per destination shard, for random meshes
and specs (checked by carrying the plan out on numpy arrays)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.lowering.resharding import plan
from pathways.program.sharding import P, assemble, shard_shape, split

AXES = ("a", "b", "c")


@st.composite
def placement(draw, ndim):
    k = draw(st.integers(1, 3))
    shape = tuple(draw(st.sampled_from([1, 2, 3])) for _ in range(k))
    names = AXES[:k]
    free = list(names)
    entries = []
    for _ in range(ndim):
        if free and draw(st.booleans()):
            entries.append(free.pop(draw(st.integers(0, len(free) - 1))))
        else:
            entries.append(None)
    return (shape, names), P(*entries)


@st.composite
def case(draw):
    ndim = draw(st.integers(0, 3))
    src, src_spec = draw(placement(ndim))
    dst, dst_spec = draw(placement(ndim))
    dims = []
    for d in range(ndim):
        parts = 1
        for (mesh, names), spec in ((src, src_spec), (dst, dst_spec)):
            if spec[d] is not None:
                parts = np.lcm(parts, mesh[names.index(spec[d])])
        dims.append(int(parts) * draw(st.integers(1, 2)))
    return tuple(dims), src, src_spec, dst, dst_spec


@settings(max_examples=200, deadline=None)
@given(case())
def test_carrying_out_a_plan_reshards_exactly(c):
    shape, src, src_spec, dst, dst_spec = c
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    src_shards = split(x, *src, src_spec)
    want = split(x, *dst, dst_spec)
    got = [np.full(shard_shape(shape, *dst, dst_spec), -1, np.int64) for _ in want]
    written = [np.zeros(g.shape, np.int64) for g in got]
    for p in plan(shape, src, src_spec, dst, dst_spec):
        got[p.dst][p.dst_slices] = src_shards[p.src][p.src_slices]
        written[p.dst][p.dst_slices] += 1
    for g, w, n in zip(got, want, written):
        np.testing.assert_array_equal(g, w)
        assert (n == 1).all()  # each element arrives once: replicas are not sent twice
    np.testing.assert_array_equal(assemble(got, *dst, dst_spec), x)
