"""Tests of the collectives (``pathways.program.collectives``) and the environments they run in.

What is tested:

- every collective on ``run_spmd``, for random meshes (1-3 axes, up to 16 devices), random
  groups of axes (multi-axis ones included) and random inputs, against numpy applied to the
  intended semantics; the reference finds groups from ``np.unravel_index``, not from
  ``axis_group``;
- ppermute with partial permutations (non-destinations get zeros), all_to_all shape rules,
  argument errors, psum of float32 bitwise equal on every member;
- errors: a collective outside a kernel, an unknown axis, a device that never joins a
  collective (CollectiveTimeout after a short timeout, no hang), and a device that raises
  (its own error wins over its peers' abandoned waits, and nobody waits for the timeout);
- ``Rendezvous`` on its own: blocking collect, timeout naming the missing sources, abort,
  nothing left behind;
- ``LocalEnv`` over two mailboxes joined by a ``send`` hook, as two hosts would be, with its
  byte counters; ``AbstractEnv`` output shapes and dtypes.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways.errors import CollectiveTimeout, ProgramError, ShardingError
from pathways.program.collectives import (
    AbstractEnv,
    LocalEnv,
    Rendezvous,
    all_gather,
    all_to_all,
    axis_index,
    current_env,
    kernel_env,
    pmax,
    pmean,
    pmin,
    ppermute,
    psum,
    psum_scatter,
    run_spmd,
)

MESH, NAMES = (2, 4), ("data", "model")


def ref_group(mesh, names, axes, i):
    """The group of device i over ``axes`` and i's position, computed the obvious way."""
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    coords = [tuple(int(c) for c in np.unravel_index(j, mesh)) for j in range(math.prod(mesh))]
    others = [k for k, name in enumerate(names) if name not in axes]
    members = [j for j in range(len(coords)) if all(coords[j][k] == coords[i][k] for k in others)]
    members.sort(key=lambda j: tuple(coords[j][names.index(a)] for a in axes))
    return members, members.index(i)


@st.composite
def mesh_and_axes(draw):
    """A mesh of at most 16 devices and a non-empty group of its axes, in any order."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    while math.prod(shape) > 16:
        shape = shape[:-1]
    names = ("x", "y", "z")[: len(shape)]
    order = draw(st.permutations(names))
    axes = tuple(order[: draw(st.integers(1, len(names)))])
    return shape, names, axes[0] if len(axes) == 1 and draw(st.booleans()) else axes


def inputs(n, shape, seed, dtype=np.int64):
    rng = np.random.default_rng(seed)
    return [(rng.integers(-100, 100, shape).astype(dtype),) for _ in range(n)]


@settings(max_examples=40, deadline=None)
@given(mesh_and_axes(), st.integers(0, 2), st.integers(0, 2**16))
def test_reductions_and_gathers_match_numpy(case, axis, seed):
    mesh, names, axes = case
    n = math.prod(mesh)
    args = inputs(n, (2, 3), seed)

    def body(x):
        return (
            psum(x, axes),
            pmean(x, axes),
            all_gather(x, axes, axis=axis),
            all_gather(x, axes, axis=min(axis, 1), tiled=True),
            axis_index(axes),
        )

    results = run_spmd(body, mesh, names, args, timeout=10)
    for i, (total, mean, stacked, tiled, index) in enumerate(results):
        members, position = ref_group(mesh, names, axes, i)
        xs = [args[j][0] for j in members]
        assert index == position
        assert np.array_equal(total, np.sum(xs, axis=0)) and total.dtype == np.int64
        assert np.allclose(mean, np.mean(xs, axis=0))
        assert np.array_equal(stacked, np.stack(xs, axis=axis))
        assert np.array_equal(tiled, np.concatenate(xs, axis=min(axis, 1)))


@settings(max_examples=40, deadline=None)
@given(mesh_and_axes(), st.integers(0, 1), st.integers(0, 2**16))
def test_pmax_pmin_and_psum_scatter_match_numpy(case, dim, seed):
    mesh, names, axes = case
    n = math.prod(mesh)
    group = len(ref_group(mesh, names, axes, 0)[0])
    shape = [3, 2]
    shape[dim] = 2 * group  # tiled: two rows (or columns) per member; untiled: see below
    args = inputs(n, tuple(shape), seed)

    def body(x):  # JAX's keyword spellings
        untiled = np.stack([x] * group, axis=dim)
        return (pmax(x, axis_name=axes), pmin(x, axes),
                psum_scatter(x, axes, scatter_dimension=dim, tiled=True),
                psum_scatter(untiled, axis_name=axes, scatter_dimension=dim))

    for i, (hi, lo, tiled, untiled) in enumerate(run_spmd(body, mesh, names, args, timeout=10)):
        members, position = ref_group(mesh, names, axes, i)
        xs = [args[j][0] for j in members]
        total = np.sum(xs, axis=0)
        assert np.array_equal(hi, np.max(xs, axis=0)) and np.array_equal(lo, np.min(xs, axis=0))
        assert np.array_equal(tiled, np.split(total, group, axis=dim)[position])
        assert np.array_equal(untiled, total)  # each member's block j is the whole x summed


def test_psum_scatter_checks_its_dimension():
    def body(x):
        return psum_scatter(x, "model", scatter_dimension=0)  # needs size 4, has 3

    with pytest.raises(ShardingError, match="must be equal to 4"):
        run_spmd(body, MESH, NAMES, [(np.zeros((3, 2)),)] * 8, timeout=10)


@settings(max_examples=40, deadline=None)
@given(mesh_and_axes(), st.data())
def test_ppermute_partial_perms(case, data):
    mesh, names, axes = case
    n = math.prod(mesh)
    size = len(ref_group(mesh, names, axes, 0)[0])
    destinations = data.draw(st.permutations(range(size)))
    sources = data.draw(st.lists(st.integers(0, size - 1), unique=True))
    perm = [(s, destinations[s]) for s in sources]
    args = inputs(n, (3,), data.draw(st.integers(0, 2**16)), np.float32)

    results = run_spmd(lambda x: ppermute(x, axes, perm), mesh, names, args, timeout=10)
    for i, got in enumerate(results):
        members, position = ref_group(mesh, names, axes, i)
        senders = [s for s, d in perm if d == position]
        want = args[members[senders[0]]][0] if senders else np.zeros(3, np.float32)
        assert np.array_equal(got, want) and got.dtype == np.float32


@settings(max_examples=40, deadline=None)
@given(mesh_and_axes(), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2**16))
def test_all_to_all_matches_numpy(case, split_axis, concat_axis, seed):
    mesh, names, axes = case
    n = math.prod(mesh)
    size = len(ref_group(mesh, names, axes, 0)[0])
    shape = [2, 3, 1]
    shape[split_axis] *= size
    args = inputs(n, tuple(shape), seed)

    results = run_spmd(
        lambda x: all_to_all(x, axes, split_axis, concat_axis, tiled=True), mesh, names, args,
        timeout=10)
    for i, got in enumerate(results):
        members, position = ref_group(mesh, names, axes, i)
        chunks = [np.split(args[j][0], size, axis=split_axis)[position] for j in members]
        assert np.array_equal(got, np.concatenate(chunks, axis=concat_axis))
        want_shape = list(shape)
        want_shape[split_axis] //= size
        want_shape[concat_axis] *= size
        assert got.shape == tuple(want_shape)


@settings(max_examples=40, deadline=None)
@given(mesh_and_axes(), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2**16))
def test_untiled_all_to_all_is_jax_default(case, split_axis, concat_axis, seed):
    mesh, names, axes = case
    size = len(ref_group(mesh, names, axes, 0)[0])
    shape = [2, 3, 1]
    shape[split_axis] = size
    args = inputs(math.prod(mesh), tuple(shape), seed)
    results = run_spmd(lambda x: all_to_all(x, axes, split_axis, concat_axis), mesh, names,
                       args, timeout=10)
    for i, got in enumerate(results):
        members, position = ref_group(mesh, names, axes, i)
        # JAX: the split dimension goes; what each member sent is stacked at concat_axis
        want = np.stack([np.take(args[j][0], position, axis=split_axis) for j in members],
                        axis=concat_axis)
        assert np.array_equal(got, want)


def test_multi_axis_psum_by_hand():
    # On a 2 x 4 mesh a group over both axes is the whole mesh, in flat order.
    args = [(np.array([float(i)]),) for i in range(8)]
    out = run_spmd(
        lambda x: (psum(x, ("data", "model")), axis_index(("model", "data"))),
        MESH,
        NAMES,
        args,
        timeout=10,
    )
    assert all(total[0] == 28.0 for total, _ in out)
    # Over ("model", "data") the position is model * 2 + data: device 1 (data 0, model 1) is 2.
    assert [index for _, index in out] == [0, 2, 4, 6, 1, 3, 5, 7]


def test_float32_psum_is_bitwise_equal_on_every_member():
    rng = np.random.default_rng(7)
    # Magnitudes from 1e-8 to 1e8 make the sum depend on the order of additions.
    args = [
        ((rng.standard_normal(64) * 10.0 ** rng.integers(-8, 8, 64)).astype(np.float32),)
        for _ in range(8)
    ]
    results = run_spmd(lambda x: psum(x, "x"), (8,), ("x",), args, timeout=10)
    a = [x for (x,) in args]
    # the documented reduction tree, written out: pairs, then pairs of pairs
    want = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
    sequential = a[0].copy()
    for x in a[1:]:
        sequential = sequential + x
    assert want.tobytes() != sequential.tobytes()  # the data tells the two orders apart
    for r in results:
        assert r.dtype == np.float32 and r.tobytes() == want.tobytes()


def test_shape_and_argument_errors():
    x = np.zeros((6, 2))
    with kernel_env(AbstractEnv(MESH, NAMES)):
        with pytest.raises(ShardingError, match="not divisible by the group size 4"):
            all_to_all(x, "model", 0, 1, tiled=True)
        with pytest.raises(ShardingError, match="not the group size 4 .pass tiled=True"):
            all_to_all(x, "model", 0, 1)
        with pytest.raises(ProgramError, match="split_axis=2"):
            all_to_all(x, "data", 2, 0)
        with pytest.raises(ProgramError, match="repeats a destination"):
            ppermute(x, "model", [(0, 1), (2, 1)])
        with pytest.raises(ProgramError, match="outside a group of 2"):
            ppermute(x, "data", [(0, 2)])
        with pytest.raises(ProgramError, match="axis=3"):
            all_gather(x, "data", axis=3)
        with pytest.raises(ProgramError, match="axis=2"):
            all_gather(x, "data", axis=2, tiled=True)
        with pytest.raises(ShardingError, match="'rows'"):
            psum(x, "rows")


def test_collective_outside_kernel():
    assert current_env() is None
    with pytest.raises(ProgramError, match="psum called outside a compiled function"):
        psum(np.ones(2), "data")
    with pytest.raises(ProgramError, match="axis_index called outside"):
        axis_index("data")


def test_kernel_env_nests_and_restores():
    outer, inner = AbstractEnv(MESH, NAMES, 1), AbstractEnv(MESH, NAMES, 2)
    with kernel_env(outer):
        with kernel_env(inner):
            assert current_env() is inner
        assert current_env() is outer
    assert current_env() is None


def test_unknown_axis_inside_run_spmd():
    with pytest.raises(ShardingError, match="unknown mesh axis 'rows'"):
        run_spmd(lambda x: psum(x, "rows"), MESH, NAMES, [(np.ones(1),)] * 8, timeout=5)


def test_device_skipping_a_collective_times_out():
    def body(x):
        return x if axis_index("x") == 0 else psum(x, "x")

    with pytest.raises(CollectiveTimeout, match=r"no value from \[0\]"):
        run_spmd(body, (3,), ("x",), [(np.ones(2),)] * 3, timeout=0.3)


def test_failing_device_error_wins_and_peers_stop_at_once():
    def body(x):
        if axis_index("x") == 2:
            raise ValueError("boom on 2")
        return psum(x, "x")

    # Peers waiting out their collective timeout would outlast the test's own time limit
    # (pytest-timeout, 120 s): the test passes only if they stop as soon as 2 fails.
    with pytest.raises(ValueError, match="boom on 2"):
        run_spmd(body, (4,), ("x",), [(np.ones(2),)] * 4, timeout=600)


def test_rendezvous_blocks_until_delivered_and_leaves_nothing():
    box = Rendezvous()
    box.deliver("k", 1, 0, "early")
    threading.Timer(0.05, box.deliver, ("k", 2, 0, "late")).start()
    assert box.collect("k", 0, [1, 2], timeout=5) == {1: "early", 2: "late"}
    assert box.pending() == 0
    with pytest.raises(ProgramError, match="twice"):
        box.deliver("j", 1, 0, "a")
        box.deliver("j", 1, 0, "b")


def test_rendezvous_timeout_names_missing_and_abort_wakes():
    box = Rendezvous()
    box.deliver("k", "a", "me", 1)
    with pytest.raises(CollectiveTimeout, match=r"\['b', 'c'\]"):
        box.collect("k", "me", ["a", "b", "c"], timeout=0.05)
    assert box.pending() == 0
    threading.Timer(0.05, box.abort, ("test over",)).start()
    with pytest.raises(CollectiveTimeout, match="test over"):
        box.collect("k2", "me", ["a"], timeout=30)


def test_local_env_two_hosts_with_send_hook(threads):
    """Devices 10, 11 on host 1 and 20, 21 on host 2: cross-host values go through ``send``."""
    devices = {0: 10, 1: 11, 2: 20, 3: 21}
    boxes = {1: Rendezvous(), 2: Rendezvous()}

    def send(dst, key, src, value):
        boxes[dst // 10].deliver(key, src, dst, value)

    envs = [
        LocalEnv(
            (4,),
            ("x",),
            i,
            devices,
            "gang",
            boxes[devices[i] // 10],
            send=send,
            is_local=lambda d, h=devices[i] // 10: d // 10 == h,
            timeout=5,
        )
        for i in range(4)
    ]
    results = [None] * 4

    def run(i):
        with kernel_env(envs[i]):
            results[i] = (psum(np.full(3, float(i)), "x"), all_gather(np.int32(i), "x"))

    for t in [threads(run, i) for i in range(4)]:
        t.join(10)
        assert not t.is_alive(), "a device never finished its collectives"
    for total, gathered in results:
        assert np.array_equal(total, np.full(3, 6.0))
        assert np.array_equal(gathered, [0, 1, 2, 3])
    # Per device: 24 + 4 bytes to its host-mate, twice that to the other host's two devices.
    assert all(e.bytes_sent_local == 28 and e.bytes_sent_remote == 56 for e in envs)
    assert boxes[1].pending() == boxes[2].pending() == 0


def test_local_env_without_send_hook_refuses_remote():
    env = LocalEnv((2,), ("x",), 0, {0: 0, 1: 1}, "g", Rendezvous(), is_local=lambda d: d == 0)
    with kernel_env(env), pytest.raises(ProgramError, match="no send hook"):
        psum(np.ones(1), "x")


def test_abstract_env_shapes_and_dtypes():
    x = np.ones((4, 6), np.float32)
    env = AbstractEnv(MESH, NAMES, flat_index=0)
    with kernel_env(env):
        assert psum(x, "model").shape == (4, 6) and psum(x, "model").dtype == np.float32
        assert pmean(x, ("data", "model")).dtype == np.float32
        assert all_gather(x, "model", axis=1).shape == (4, 4, 6)
        assert all_gather(x, "model", axis=1, tiled=True).shape == (4, 24)
        assert all_to_all(x, "data", 1, 0, tiled=True).shape == (8, 3)
        assert all_to_all(x[:2], "data", 0, 1).shape == (6, 2)
        # Position 0 sends nothing and receives from 1; then neither sends nor receives.
        assert ppermute(x, "model", [(1, 0)]).shape == (4, 6)
        assert ppermute(x, "model", [(1, 2)]).dtype == np.float32
        assert axis_index("model") == 0
    assert env.next_collective() == 9  # one number per exchange; axis_index takes none
