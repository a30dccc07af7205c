"""JAX's own shard_map tests (tests/shard_map_test.py in jax-ml/jax), ported to pw.shard_map.

Each case names the JAX test it comes from and runs its body by ``jax.shard_map`` on this
process's CPU devices and by ``pw.shard_map`` (called directly, inside ``@pw.program`` and under
``pw.reference``), comparing trees, dtypes and values. Where JAX itself refuses a body, pathways
must refuse it too, before anything runs. Where pathways does not support what JAX does, the case
asserts a clear refusal that names what is missing (issue 46 lists them).

Left out, as JAX internals with no pathways counterpart: jaxpr and HLO printing, replication
(``vma``) types read off avals, residual forwarding and remat policies, custom partitioning,
explicit/auto mesh axis types, unreduced/reduced shardings, psend/precv and ``smap``. Tests of
transformations *outside* the shard_map (``jax.grad``/``vmap``/``jvp``/``linearize`` of a
function calling it) are issue 46 item 3 and are ported here as the same math *inside* the body.
"""

import numpy as np
import pytest

import pathways as pw
from pathways import P

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax
from jax.sharding import Mesh as JaxMesh  # noqa: E402
from jax.sharding import PartitionSpec as JaxP  # noqa: E402
from jax_cases import across_hosts, plain_jax, put, results, same_as_jax  # noqa: E402

X3 = ((2, 2, 2), ("x", "y", "z"))
X22 = ((2, 2), ("x", "y"))
I42 = ((4, 2), ("i", "j"))
X8 = ((8,), ("x",))
X4 = ((4,), ("x",))
X2 = ((2,), ("x",))


@pytest.fixture(scope="module")
def client(pw_cluster):
    """One client of the session's twin cluster (2 hosts x 4 devices) for the whole module."""
    with pw.connect(pw_cluster.address) as c:
        yield c


def same(client, body, in_specs, out_specs, *args, mesh=X4):
    shape, names = mesh
    return same_as_jax(client, body, in_specs, out_specs, *args, shape=shape, names=names)


def jax_refuses_too(client, body, in_specs, out_specs, *args, mesh=X4, match=None):
    """JAX refuses ``body`` with a ValueError when it traces it; so does pathways, called
    directly and inside a program, with a ProgramError (a ValueError) matching ``match``."""
    with pytest.raises((ValueError, TypeError)):
        plain_jax(body, *mesh, in_specs, out_specs, *args)
    pathways_refuses(client, body, in_specs, out_specs, args, mesh, match, fetch=results)


def refused(client, body, in_specs, out_specs, *args, mesh=X4, match):
    """JAX runs ``body``; pathways refuses it with a ProgramError matching ``match`` when the
    call is made (nothing runs), called directly and when a program is traced."""
    plain_jax(body, *mesh, in_specs, out_specs, *args)
    pathways_refuses(client, body, in_specs, out_specs, args, mesh, match, fetch=lambda r: r)


def pathways_refuses(client, body, in_specs, out_specs, args, mesh, match, fetch):
    """``body`` called directly and inside a program fails with a ProgramError matching
    ``match`` (by the time ``fetch`` has its results)."""
    pw_mesh = across_hosts(client, *mesh)
    fn = pw.shard_map(body, pw_mesh, in_specs, out_specs)
    arrays = put(client, pw_mesh, args, in_specs)
    for call in (lambda: fn(*arrays), lambda: pw.program(lambda *a: fn(*a))(*arrays)):
        with pytest.raises(pw.ProgramError, match=match):
            fetch(call())


def jax_mesh(shape, names):
    return JaxMesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


def iota(*shape, dtype=np.float32):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


A88 = iota(8, 8)


# ----------------------------------------------------------------------------- collectives


class TestCollectives:
    def test_identity(self, client):  # JAX: test_identity
        same(client, lambda x: x, P("z", ("x", "y")), P("z", ("x", "y")), A88, mesh=X3)

    def test_all_gather(self, client):  # JAX: test_all_gather
        def body(a):
            return (lax.all_gather(a, "z", axis=0, tiled=True),
                    lax.all_gather(a, ("x", "y"), axis=-1, tiled=True))

        same(client, body, P("z", ("x", "y")), P("z", ("x", "y")), A88, mesh=X3)

    def test_all_gather_invariant_basic(self, client):  # JAX: test_all_gather_invariant_basic
        body = lambda a: lax.all_gather(a, "x", tiled=True, to="invarying")  # noqa: E731
        same(client, body, P("x"), P(), np.arange(8.0, dtype=np.float32))

    def test_all_gather_invariant_complex(self, client):  # JAX: test_all_gather_invariant_complex
        def body(a):
            return (lax.all_gather(a, "z", axis=0, tiled=True, to="invarying"),
                    lax.all_gather(a, ("x", "y"), axis=-1, tiled=True, to="invarying"))

        same(client, body, P("z", ("x", "y")), (P(None, ("x", "y")), P("z")), A88, mesh=X3)

    def test_all_gather_untiled_of_a_replicated_value(self, client):
        # JAX: test_all_gather_with_vma_in_types
        same(client, lambda x: lax.all_gather(x, "x"), P(), P("x"), np.arange(8.0), mesh=X2)

    def test_psum_scatter_of_a_matmul(self, client):  # JAX: test_matmul_reduce_scatter
        def body(a, b):
            c = a @ b
            return (lax.psum_scatter(c, "y", scatter_dimension=0, tiled=True),
                    lax.psum_scatter(c, ("z", "y"), scatter_dimension=0, tiled=True))

        same(client, body, (P("z", "y"), P("y", None)), P(("z", "y"), None), A88, A88, mesh=X3)

    def test_ppermute_around_a_ring(self, client):  # JAX: test_collective_permute
        def body(a):
            n = lax.axis_size("x")
            return lax.ppermute(a, "x", perm=[(j, (j + 1) % n) for j in range(n)])

        same(client, body, P("x", None), P("x", None), iota(8, 8, dtype=np.int32), mesh=X8)

    def test_ppermute_over_two_axes(self, client):
        # JAX: test_collective_permute_with_multiple_axis_names
        def ring(axes):
            n = lax.axis_size(axes)
            return [(j, (j + 1) % n) for j in range(n)]

        def body(a):
            return (lax.ppermute(a, ("x", "y"), perm=ring(("x", "y"))),
                    lax.ppermute(a, ("y", "z"), perm=ring(("y", "z"))))

        same(client, body, P("x", ("y", "z")), P("x", ("y", "z")),
             iota(4, 16, dtype=np.int32), mesh=X3)

    @pytest.mark.parametrize("axes,mesh", [("x", X8), (("x", "y"), ((4, 2), ("x", "y")))])
    def test_all_to_all(self, client, axes, mesh):  # JAX: test_all_to_all
        def body(a):
            return lax.all_to_all(a, axes, split_axis=1, concat_axis=1, tiled=True)

        same(client, body, P(axes, None), P(None, axes), iota(8, 8, dtype=np.int32), mesh=mesh)

    def test_all_to_all_rows_to_columns(self, client):  # JAX: test_all_to_all_grad (forward)
        def body(x):
            return lax.all_to_all(x, "x", split_axis=1, concat_axis=0, tiled=True)

        same(client, body, P("x", None), P(None, "x"), A88)

    def test_pmin(self, client):  # JAX: test_pmin
        same(client, lambda x: lax.pmin(x, "x"), P("x"), P(), np.arange(8.0, dtype=np.float32))

    def test_pmax(self, client):  # JAX: test_pmax
        same(client, lambda x: lax.pmax(x, "x"), P("x"), P(), np.arange(8.0, dtype=np.float32))

    def test_pmax_of_a_replicated_value(self, client):  # JAX: test_pmax_vma_in_types
        same(client, lambda x: lax.pmax(x, "x"), P(), P(), np.arange(8.0, dtype=np.float32))

    def test_repeated_psum(self, client):  # JAX: test_repeated_psum_allowed
        same(client, lambda x: lax.psum(lax.psum(x, "x"), "x"), P("x"), P(),
             np.arange(4.0, dtype=np.float32))

    def test_psum_of_a_convolution(self, client):  # JAX: test_conv_general_dilated
        def body(x, y):
            dot = lax.conv_general_dilated(x, y, window_strides=(), padding="VALID",
                                           dimension_numbers=("NC", "IO", "NC"))
            return lax.psum(dot, "x")

        same(client, body, (P(None, "x"), P("x", None)), P(None, None),
             np.ones((16, 32), np.float32), np.ones((32, 8), np.float32))

    def test_psum_over_both_axes_then_cond(self, client):
        # JAX: test_eager_control_flow (its Python `if` on the sum, as lax.cond under jit)
        def body(x):
            y = lax.psum(x, ("x", "y"))
            return lax.cond(jnp.all(y < 0), lambda: x, lambda: -x)

        same(client, body, P("x", "y"), P("x", "y"), iota(2, 2), mesh=X22)


class TestAxisIndexGroups:
    """JAX takes ``axis_index_groups`` on all_gather, psum_scatter and all_to_all; pathways
    refuses it by name when the body is traced (issue 46 item 6: it was refused only when the
    devices ran it, as a RemoteError from the first device)."""

    def test_all_gather(self, client):  # JAX: test_all_gather_with_axis_index_groups
        def body(a):
            return lax.all_gather(a, ("y", "z"), axis_index_groups=((0, 1), (2, 3)), axis=-1,
                                  tiled=True)

        refused(client, body, P("x", ("y", "z")), P("x", ("y", "z")), A88, mesh=X3,
                match="body: all_gather with axis_index_groups is not supported")

    def test_psum_scatter(self, client):  # JAX: test_reduce_scatter_with_axis_index_groups
        def body(a):
            return lax.psum_scatter(a, ("x", "y", "z"), scatter_dimension=0, tiled=True,
                                    axis_index_groups=((0, 2, 4, 6), (1, 3, 5, 7)))

        refused(client, body, P(None, ("x", "y", "z")), P(None, ("x", "y", "z")), A88, mesh=X3,
                match="reduce_scatter with axis_index_groups is not supported")

    def test_all_to_all(self, client):  # JAX: test_all_to_all_with_axis_index_groups
        def body(a):
            return lax.all_to_all(a, "x", split_axis=1, concat_axis=0, tiled=True,
                                  axis_index_groups=((0, 1), (2, 3)))

        refused(client, body, P("x", None), P(None, "x"), iota(4, 4),
                match="all_to_all with axis_index_groups is not supported")

    def test_refused_under_reference_and_inside_control_flow(self, client):
        def body(a):
            return lax.fori_loop(0, 2, lambda i, c: lax.all_to_all(
                c, "x", 1, 1, tiled=True, axis_index_groups=((0, 1), (2, 3))), a)

        fn = pw.shard_map(body, across_hosts(client, *X4), P("x", None), P("x", None))
        with pytest.raises(pw.ProgramError, match="all_to_all with axis_index_groups"):
            pw.reference(fn)(iota(4, 4))


# ----------------------------------------------------------------------------- axis_index


class TestAxisIndex:
    def test_axis_index_with_no_arguments(self, client):  # JAX: test_axis_index_basic
        for body in (lambda: lax.axis_index("x")[None], jax.jit(lambda: lax.axis_index("x")[None])):
            same(client, body, (), P("x"))

    def test_axis_index_of_two_axes(self, client):  # JAX: test_axis_index_twoaxes
        def body():
            return (lax.axis_index("i")[None, None], lax.axis_index("j")[None, None],
                    lax.axis_index(("i", "j"))[None, None])

        same(client, body, (), P("i", "j"), mesh=I42)

    def test_axis_index_of_two_axes_with_an_argument(self, client):  # JAX: test_axis_index_twoaxes
        def body(x):
            return (x + lax.axis_index("i"), x + lax.axis_index("j"),
                    x + lax.axis_index(("i", "j")))

        same(client, body, P("i", "j"), P("i", "j"), iota(4, 2, dtype=np.int32), mesh=I42)

    def test_psum_of_axis_index(self, client):  # JAX: test_axis_index_eager
        def body(x):
            total = lax.psum(lax.axis_index("x"), "x")
            return jnp.where(total > 0, 1.0, -1.0) + 0 * lax.psum(x, "x")

        same(client, body, P("x"), P(), np.arange(4.0, dtype=np.float32))

    def test_axis_index_added_to_a_shard(self, client):  # JAX: test_axis_env_extension_regression
        def body(x):
            return jnp.exp(x) + lax.axis_index("x").astype(x.dtype)

        same(client, body, P("x"), P("x"), np.arange(8.0, dtype=np.float32), mesh=X8)

    def test_iota_with_no_arguments(self, client):  # JAX: test_jaxpr_shardings_with_no_outputs
        same(client, lambda: lax.iota(jnp.dtype("int32"), 4), (), P("x"))

    def test_arange_plus_a_block(self, client):  # JAX: test_jaxpr_shardings_with_no_outputs
        same(client, lambda a: jnp.arange(a.shape[0]) + a, P("x"), P("x"),
             np.arange(32, dtype=np.int32))


# ----------------------------------------------------------------------------- control flow


def _rotate_scan(x, y, z):
    x, y, z = x.sum(), y.sum(), z.sum()

    def step(c, _):
        first, *rest = c
        return (*rest, first), None

    x = lax.pcast(x, ("x", "y"), to="varying")
    y = lax.pcast(y, "y", to="varying")
    out, _ = lax.scan(step, (x, y, z), None, length=3)
    return [jnp.expand_dims(a, 0) for a in out]


def _keep_scan(x, y, z):
    out, _ = lax.scan(lambda c, _: (c, None), (x.sum(), y.sum(), z.sum()), None, length=1)
    return [jnp.expand_dims(a, 0) for a in out]


def _rotate_while(x, y, z):
    x, y, z = x.sum(), y.sum(), z.sum()

    def step(c):
        i, first, *rest = c
        return (i + 1, *rest, first)

    x = lax.pcast(x, ("x", "y"), to="varying")
    y = lax.pcast(y, "y", to="varying")
    _, *out = lax.while_loop(lambda c: c[0] < 5, step, (0, x, y, z))
    return [jnp.expand_dims(a, 0) for a in out]


def _keep_while(x, y, z):
    _, *out = lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, *c[1:]),
                             (0, x.sum(), y.sum(), z.sum()))
    return [jnp.expand_dims(a, 0) for a in out]


XYZ_IN = (P(None), P("x"), P(("x", "y")))
X4I = np.arange(4, dtype=np.int32)


class TestControlFlow:
    @pytest.mark.parametrize("body", [_rotate_scan, _rotate_while])
    def test_loop_carrying_values_of_different_variation(self, client, body):
        # JAX: test_scan_rep_rule, test_while_rep_rule (the scan failed to compile on the
        # hosts when plans were made of a trace that kept JAX's varying-axes types)
        same(client, body, XYZ_IN, P(("x", "y")), X4I, X4I, X4I, mesh=X22)

    def test_cond_on_a_constant_branch_varying(self, client):
        # JAX: test_cond_rep_rule (failed to compile for a host's batch of devices when the
        # branches' types disagreed on the varying axes)
        same(client, lambda x: lax.cond(True, lambda x: x, lambda x: x + 1, x), P("x"),
             P("x"), X4I, mesh=X4)

    def test_histogram_of_each_shard(self, client):
        # JAX: test_jnp_histogram (searchsorted inside: a scan whose carry varies)
        x = np.arange(64, dtype=np.float32).reshape(8, 4, 2)
        edges = np.asarray(jnp.histogram_bin_edges(x, bins=100))
        same(client, lambda x, e: jax.vmap(lambda q: jnp.histogram(q, bins=e))(x)[0],
             (P("x"), P()), P("x"), x, edges, mesh=X2)

    @pytest.mark.parametrize("body", [_keep_scan, _keep_while])
    def test_loop_keeping_each_value_where_it_was(self, client, body):
        # JAX: test_scan_rep_rule, test_while_rep_rule
        same(client, body, XYZ_IN, [P(None), P("x"), P(("x", "y"))], X4I, X4I, X4I, mesh=X22)

    @pytest.mark.parametrize("body", [_rotate_scan, _rotate_while])
    @pytest.mark.parametrize("out", [P("x"), P("y"), P(None)])
    def test_loop_output_promised_too_replicated(self, client, body, out):
        # JAX: test_scan_rep_rule, test_while_rep_rule
        jax_refuses_too(client, body, XYZ_IN, out, X4I, X4I, X4I, mesh=X22,
                        match="out_specs")

    @pytest.mark.parametrize("body", [_keep_scan, _keep_while])
    def test_loop_output_one_spec_wrong(self, client, body):
        # JAX: test_scan_rep_rule, test_while_rep_rule
        jax_refuses_too(client, body, XYZ_IN, [P(None), P(None), P(("x", "y"))],
                        X4I, X4I, X4I, mesh=X22, match="out_specs")

    def test_cond_on_a_constant_promised_replicated(self, client):  # JAX: test_cond_rep_rule
        def body(x, y):
            return lax.cond(True, lambda x, y: x, lambda x, y: x + 1, x, y)

        jax_refuses_too(client, body, (P("x"), P("y")), P(None), X4I, X4I, mesh=X22,
                        match="out_specs")

    def test_cond_of_branches_varying_differently(self, client):  # JAX: test_cond_rep_rule
        def body(x, y):
            return lax.cond(True, lambda x, y: lax.pcast(x, "y", to="varying"),
                            lambda x, y: lax.pcast(y, "x", to="varying"), x, y)

        same(client, body, (P("x"), P("y")), P(("x", "y")), X4I, X4I, mesh=X22)
        jax_refuses_too(client, body, (P("x"), P("y")), P("x"), X4I, X4I, mesh=X22,
                        match="out_specs")

    def test_cond_on_a_sharded_predicate(self, client):  # JAX: test_cond_rep_rule
        def on_x(x, y):
            return lax.cond(jnp.any(x > 0), lambda x, y: x, lambda x, y: x + 1, x, y)

        def on_y(x, y):
            return lax.cond(jnp.any(y > 0), lambda x, y: x, lambda x, y: x + 1, x, y)

        same(client, on_x, (P("x"), P("y")), P("x"), X4I, X4I, mesh=X22)
        jax_refuses_too(client, on_x, (P("x"), P("y")), P(None), X4I, X4I, mesh=X22,
                        match="out_specs")
        same(client, on_y, (P("x"), P("y")), P(("x", "y")), X4I, X4I, mesh=X22)

    def test_cond_of_a_bool_array_with_constant_branches(self, client):  # JAX: test_cond_rep_rule
        def body(a):
            return jnp.reshape(lax.cond(jnp.any(a), lambda: 1, lambda: 0), a.shape)

        same(client, body, P("x"), P("x"), np.array([True, False]), mesh=X2)

    def test_switch(self, client):  # JAX: test_switch_rep_rule
        def body(n, x, y):
            return lax.switch(n, [lambda x, _: x, lambda x, _: x + 1, lambda x, _: x + 2], x, y)

        same(client, body, (P(), P("x"), P("y")), P("x"), np.int32(1), X4I, X4I, mesh=X22)

    def test_scan_of_psum(self, client):  # JAX: test_rewrite_scan
        def body(x):
            step = lambda c, _: (lax.pcast(lax.psum(c, "x"), "x", to="varying"), None)  # noqa: E731
            return lax.scan(step, x, None, length=2)[0]

        same(client, body, P("x"), P("x"), np.arange(4.0, dtype=np.float32))

    def test_map_of_matrix_inverse(self, client):  # JAX: test_linalg_inv
        x = np.random.default_rng(0).uniform(size=(4, 5, 5)).astype(np.float32) + 5 * np.eye(5)
        same(client, lambda x: lax.map(jnp.linalg.inv, x), P("x"), P("x"),
             x.astype(np.float32), mesh=X2)

    def test_fori_loop_of_psum(self, client):
        def body(x):
            return lax.fori_loop(0, 3, lambda i, c: c / 2 + lax.psum(c, "x") / 8 + i, x)

        same(client, body, P("x"), P("x"), np.arange(8.0, dtype=np.float32))


# ----------------------------------------------------------------------------- transformations
# inside the body (JAX's versions apply them to the shard_map from outside: issue 46 item 3)


class TestTransformationsInside:
    def test_value_and_grad(self, client):  # JAX: test_pvary_in_shmap_of_grad
        def body(x):
            val, grad = jax.value_and_grad(lambda x: jnp.mean(x ** 2))(x)
            return jnp.atleast_1d(val), jnp.atleast_1d(grad)

        same(client, body, P("x"), P("x"), np.ones(2, np.float32), mesh=X2)

    def test_grad_of_a_custom_jvp(self, client):  # JAX: test_eager_custom_jvp_basic
        @jax.custom_jvp
        def double(x):
            return 2.0 * x

        @double.defjvp
        def _(primals, tangents):
            return double(primals[0]), 3.0 * tangents[0]

        def body(x):
            loss, grad = jax.value_and_grad(lambda x: double(x).sum())(x)
            return jnp.atleast_1d(loss), grad

        same(client, body, P("x"), P("x"), np.arange(4.0, dtype=np.float32))

    def test_grad_of_a_custom_vjp(self, client):  # JAX: test_eager_custom_vjp_basic
        # the body closes over a custom_vjp function, which did not unpickle on the hosts
        @jax.custom_vjp
        def double(x):
            return 2.0 * x

        double.defvjp(lambda x: (double(x), None), lambda _, g: (3.0 * g,))

        def body(x):
            loss, grad = jax.value_and_grad(lambda x: double(x).sum())(x)
            return jnp.atleast_1d(loss), grad

        same(client, body, P("x"), P("x"), np.arange(4.0, dtype=np.float32))

    def test_jit_of_a_custom_jvp_as_the_body(self, client):  # JAX: test_custom_jvp_inside_jit
        same(client, jax.jit(jax.nn.relu), P("x"), P("x"), np.arange(-8.0, 8.0, dtype=np.float32))

    def test_grad_through_psum(self, client):  # JAX: test_check_rep_failure_inside_rule
        def body(w, x):
            return jax.grad(lambda w: lax.psum(((w * x) ** 2).sum(), "x"))(w)

        same(client, body, (P(), P("x")), P(), np.float32(3.0), np.arange(8.0, dtype=np.float32))

    def test_grad_of_a_mixed_body(self, client):  # JAX: test_reverse_mode_ad
        def f(x, y):
            return jnp.sin(x) + 3 + jnp.tan(2.0) * jnp.cos(x) + y

        def body(x, y):
            return f(x, y), jax.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))(x, y)

        same(client, body, (P("x"), P(None)), (P("x"), (P("x"), P("x"))),
             np.arange(8.0, dtype=np.float32) / 10, np.arange(2.0, dtype=np.float32) / 10)

    def test_grad_of_a_dynamic_slice(self, client):  # JAX: test_dynamic_slice_transpose
        def f(x):
            return lax.dynamic_slice_in_dim(x, jnp.array(1, dtype=np.int32), 2)

        def body(x):
            return f(x), jax.grad(lambda x: f(x).sum())(x)

        same(client, body, P("x"), P("x"), np.arange(16.0, dtype=np.float32), mesh=X2)

    def test_grad_of_remat(self, client):  # JAX: test_remat_scalar_residuals
        def body(x):
            f = jax.checkpoint(lambda x: jnp.sin(jnp.sin(jnp.sin(x.sum()))[None]))
            return f(x), jax.grad(lambda x: f(x).sum())(x)

        same(client, body, P("x"), P("x"), np.arange(8.0, dtype=np.float32))

    def test_linearize_and_transpose(self, client):
        # JAX: test_shmap_linearize_and_linearize_transpose_error (its working half)
        def body(t):
            p = lax.pcast(jnp.array([1.0]), "x", to="varying")
            _, fwd = jax.linearize(lambda x: jnp.mean(x ** 2), p)
            return jax.linear_transpose(fwd, p)(fwd(t))

        same(client, body, P("x"), P("x"), np.ones(2, np.float32), mesh=X2)

    def test_vmap_over_a_psum(self, client):
        same(client, lambda x: jax.vmap(lambda r: lax.psum(r, "x"))(x), P(None, "x"),
             P(None, None), iota(3, 8))


# ----------------------------------------------------------------------------- specs, pytrees,
# arguments


class TestSpecsAndArguments:
    def test_out_specs_promising_replication_the_body_lacks(self, client):
        # JAX: test_replication_checker_jit, test_vma_out_specs_error_check
        jax_refuses_too(client, lambda x: jnp.multiply(x, 2), P("x", "y"), P(None, "y"), A88,
                        mesh=X22, match="out_specs")
        jax_refuses_too(client, lambda x: jnp.multiply(x, 2), P("x", "y", "z"), P("x"),
                        iota(4, 2, 2, dtype=np.int32), mesh=X3, match="out_specs")

    def test_psum_makes_the_out_specs_hold(self, client):  # JAX: test_replication_checker_jit
        same(client, lambda x: lax.psum(x, "x"), P("x", "y"), P(None, "y"), A88, mesh=X22)

    def test_in_specs_of_more_dimensions_than_the_argument(self, client):
        # JAX: test_error_for_variable_num_args, test_functools_partial_rank_error
        with pytest.raises(ValueError):
            plain_jax(lambda *a: a[0] @ a[1], *X22, (P("x", "y", None),) * 2, P("x", "y"),
                      A88, A88)
        mesh = across_hosts(client, *X22)
        with pytest.raises(pw.ShardingError):
            client.put(A88, mesh, P("x", "y", None))

    def test_in_specs_tree_that_does_not_fit(self, client):  # JAX: test_tree_prefix_error
        mesh = across_hosts(client, *X22)
        fn = pw.shard_map(lambda x: x, mesh, ([P("x", "y")],), P("x", "y"))
        with pytest.raises(pw.ProgramError, match="in_specs"):
            pw.reference(fn)([A88, A88])

    def test_a_list_of_outputs_under_a_list_of_specs(self, client):
        same(client, lambda x: [x, x * 2], P("x"), [P("x"), P("x")],
             np.arange(8.0, dtype=np.float32))

    def test_a_replicated_scalar_reshaped_to_a_block(self, client):
        # JAX: test_outer_jit_detects_shard_map_mesh
        same(client, lambda x: x.reshape(1, *x.shape), P(), P("x"), np.float32(2.0), mesh=X22)

    def test_a_scalar_under_p(self, client):  # JAX: test_in_specs_none_error (its P() call)
        same(client, lambda x: x, P(), P(), np.float32(3.0))

    def test_device_put_inside(self, client):  # JAX: test_device_put
        same(client, lambda x: x + jax.device_put(1), P("x"), P("x"),
             np.arange(32.0, dtype=np.float32))

    def test_print_inside(self, client, capsys):  # JAX: test_print_inside_shard_map
        def body(x):
            print(x)
            return 2 * x

        for spec in (P(), P("x"), P(("x", "y"))):
            same(client, body, spec, spec, np.arange(4.0, dtype=np.float32), mesh=X22)

    # A non-array argument under a None in_spec is static: every device gets it as it is.
    def test_static_argument(self, client):  # JAX: test_with_static_arg
        def body(x, s):
            return x + jnp.ones(s, x.dtype)

        mesh = across_hosts(client, *X22)
        want = jax.jit(jax.shard_map(body, mesh=jax_mesh(*X22), in_specs=(JaxP("x", "y"), None),
                                     out_specs=JaxP("x", "y")), static_argnums=1)(A88, (4, 4))
        fn = pw.shard_map(body, mesh, (P("x", "y"), None), P("x", "y"))
        x = client.put(A88, mesh, P("x", "y"))
        for got in (fn(x, (4, 4)).result(), pw.program(lambda x: fn(x, (4, 4)))(x).result(),
                    pw.reference(fn)(A88, (4, 4))):
            np.testing.assert_array_equal(got, want)
        with pytest.raises(pw.ProgramError, match="argument 1 has a None in_spec.*hashable"):
            fn(x, [4, 4])  # a list: JAX's static arguments must be hashable too

    def test_none_in_spec_for_an_object(self, client):  # JAX: test_in_spec_none
        def body(o, x):
            return jnp.sin(x)

        mesh = across_hosts(client, *I42)
        thing = object()
        want = jax.jit(jax.shard_map(body, mesh=jax_mesh(*I42), in_specs=(None, JaxP("i")),
                                     out_specs=JaxP("i")), static_argnums=0)(thing, iota(4, 2))
        fn = pw.shard_map(body, mesh, (None, P("i")), P("i"))
        x = client.put(iota(4, 2), mesh, P("i"))
        for got in (fn(thing, x).result(), pw.reference(fn)(thing, iota(4, 2))):
            np.testing.assert_allclose(got, want, rtol=1e-6)


# ----------------------------------------------------------------------------- dtypes and ops


class TestDtypesAndOps:
    @pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.float16, jnp.bfloat16,
                                       np.float32, np.complex64, np.bool_])
    def test_identity_and_psum_of_each_dtype(self, client, dtype):
        x = (np.arange(16) % 3).astype(dtype)
        same(client, lambda x: x, P("x"), P("x"), x)
        if dtype != np.bool_:
            same(client, lambda x: lax.psum(x, "x"), P("x"), P(), x)

    def test_argmax_keeps_int32(self, client):  # JAX: test_argmax_pvary
        x = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
        same(client, lambda x: jnp.argmax(x, axis=-1, keepdims=True), P("x", "y"), P("x", "y"), x,
             mesh=X22)

    def test_cumsum(self, client):  # JAX: test_cumsum
        same(client, jnp.cumsum, P("x"), P("x"), np.arange(8.0, dtype=np.float32))

    def test_erf(self, client):  # JAX: test_erf_rules
        same(client, lax.erf, P("x"), P("x"), np.arange(16.0, dtype=np.float32))

    def test_approx_max_k(self, client):  # JAX: test_approx_top_k
        same(client, lambda x: lax.approx_max_k(x, 2), P("x"), P("x"),
             np.array([3.0, 1.0, 4.0, 2.0], np.float32), mesh=X2)

    def test_insert(self, client):  # JAX: test_rep_none_canonicalization_again
        same(client, lambda x: jnp.insert(x, 0, 0)[None], P("x"), P("x"),
             np.zeros(100, np.float32), mesh=X2)

    def test_complex_expm(self, client):  # JAX: test_rep_none_canonicalization
        v = (np.random.default_rng(1).normal(size=(8, 8)) * 0.1).astype(np.complex64)

        def body(v, xs):
            return jax.scipy.linalg.expm(v).sum() * xs.sum(axis=-1).astype(np.complex64)

        same(client, body, (P(), P("x")), P("x"), v, np.ones((8, 8), np.int32), mesh=X2)

    def test_split_of_a_replicated_array(self, client):
        # JAX: test_multiple_result_primitive_with_none_sharding
        same(client, lambda x: jnp.split(x.squeeze(), 2), P(), P("x"), iota(2, 10, dtype=np.int32),
             mesh=X2)

    def test_random_bits_of_raw_keys(self, client):  # JAX: test_prngkeyarray_eager
        keys = np.asarray(jax.random.split(jax.random.PRNGKey(0), 4))
        body = lambda k: jax.random.randint(k[0], (1, 16), 0, 16, dtype=jnp.int32)  # noqa: E731
        same(client, body, P("x", None), P("x", None), keys)

    @pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
    def test_sharded_random_bits(self, client, impl):  # JAX: test_sharded_random_bits
        keys = jax.random.split(jax.random.key(0, impl=impl), 4)
        same(client, lambda k: jax.random.bits(k[0], shape=(4,), dtype=jnp.uint8), P("x"),
             P("x"), keys)

    def test_random_normal_of_typed_keys(self, client):  # JAX: test_random_normal_rules
        keys = jax.random.split(jax.random.key(0), 4)
        same(client, lambda k: jax.random.normal(k[0], (1,)), P("x"), P("x"), keys)


# ----------------------------------------------------------------------------- systematic
# (JAX: ShardMapSystematicTest.test_jit_against_ref; a fixed sample of its functions, meshes
# and specs instead of a random one)


def _dot_sin(a, b):
    return jnp.sin(jnp.dot(jnp.sin(a), b))


SYSTEMATIC = [
    ("id", lambda x: x, ((2, 4), ("i", "j")), (P("i", "j"),), P("i", "j"), [(4, 8)]),
    ("id", lambda x: x, ((4, 2), ("i", "j")), (P(("j", "i")),), P(("j", "i")), [(8, 3)]),
    ("flip", lambda x, y: (y, x), ((2, 2), ("i", "j")), (P("i"), P(None, "j")),
     (P(None, "j"), P("i")), [(4, 2), (3, 4)]),
    ("transpose", lambda x: x.T, ((2, 4), ("i", "j")), (P("i", "j"),), P("j", "i"), [(2, 8)]),
    ("ravel", lambda x: x.ravel(), ((2, 2), ("i", "j")), (P("i", None, "j"),), P(("i", "j")),
     [(2, 3, 4)]),
    ("dot", jnp.dot, ((2, 2), ("i", "j")), (P("i", None), P(None, "j")), P("i", "j"),
     [(4, 3), (3, 4)]),
    ("dot", jnp.dot, ((1, 2), ("i", "j")), (P(None, "j"), P("j", None)), P(("i", "j")),
     [(3, 4), (4, 2)]),
    ("sin_dot_sin", _dot_sin, ((4, 2), ("i", "j")), (P("i", None), P()), P("i"),
     [(8, 3), (3, 2)]),
    ("relu", lambda x: jax.nn.relu(x + 1) - 1, ((1,), ("i",)), (P(),), P(), [(3, 2)]),
    ("relu", lambda x: jax.nn.relu(x + 1) - 1, ((2, 4), ("i", "j")), (P(None, ("i", "j")),),
     P(None, ("j", "i")), [(2, 16)]),
]


@pytest.mark.parametrize("name,fun,mesh,in_specs,out_specs,shapes", SYSTEMATIC,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(SYSTEMATIC)])
def test_systematic(client, name, fun, mesh, in_specs, out_specs, shapes):
    args = [(iota(*s) - iota(*s).size / 2) / iota(*s).size for s in shapes]
    same(client, fun, in_specs, out_specs, *args, mesh=mesh)
