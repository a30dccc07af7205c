"""JAX transformations from outside a pw function (issue 46 item 3): jax.grad, value_and_grad,
vjp, jvp, linearize, jit and vmap of a function that calls pw.shard_map run it on the cluster,
and equal the same with jax.shard_map on this process's CPU devices. Cases after JAX's own shard_map tests
(named in each)."""

import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.testing import jax_specs

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax.sharding import Mesh as JaxMesh  # noqa: E402
from jax_cases import across_hosts  # noqa: E402

TOL = {"rtol": 2e-5, "atol": 2e-5}


def both(client, body, shape, names, in_specs, out_specs, check_rep=True):
    """(the pw function on the cluster, jax.shard_map's on JAX's CPU devices) of ``body``."""
    pw_fn = pw.shard_map(body, across_hosts(client, shape, names), in_specs, out_specs,
                         check_rep=check_rep)
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    jax_fn = jax.shard_map(body, mesh=JaxMesh(devices, names), in_specs=jax_specs(in_specs),
                           out_specs=jax_specs(out_specs), check_vma=check_rep)
    return pw_fn, jax_fn


def same_grads(client, body, shape, names, in_specs, out_specs, *args, check_rep=True,
               argnums=0):
    """jax.value_and_grad of the sum of ``body``'s outputs, both ways, equal."""
    pw_fn, jax_fn = both(client, body, shape, names, in_specs, out_specs, check_rep)

    def loss(fn):
        return lambda *a: sum(jnp.sum(o) for o in jax.tree.leaves(fn(*a)))

    got = jax.value_and_grad(loss(pw_fn), argnums=argnums)(*args)
    want = jax.value_and_grad(loss(jax_fn), argnums=argnums)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, **TOL)
    return pw_fn, jax_fn


X = np.arange(16.0, dtype=np.float32)


def test_grad_of_a_sharded_loss(client):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    same_grads(client, lambda w, x: jax.lax.psum(jnp.sum(jnp.tanh(x @ w) ** 2), "i"), (4,),
               ("i",), (P(), P("i")), P(), w, x, argnums=(0, 1))


def test_a_replicated_argument_fanned_out_transposes_to_a_sum(client):
    # JAX: test_fanout_specs_transpose_to_psum
    same_grads(client, lambda x: x * 2.0, (4,), ("i",), P(), P("i"), np.arange(1.0, 3.0))


def test_psum_transposes(client):
    # JAX: test_fanin_psum_transposes_to_fanout, test_psum_with_implicit_fanout_self_transposes
    same_grads(client, lambda x: jax.lax.psum(x, "i"), (4,), ("i",), P("i"), P(), X)
    same_grads(client, lambda x: jax.lax.psum(x, "i") * x, (4,), ("i",), P("i"), P("i"), X)


def test_psum_transpose_with_two_outputs(client):
    # JAX: test_psum_transpose_non_zero_cts, under jax.grad and jax.jit(jax.grad)
    pw_fn, jax_fn = both(client, lambda b: (b, jax.lax.psum(b, "i")), (8,), ("i",), P("i"),
                         (P("i"), P()))

    def loss(fn):
        return lambda x: fn(x)[0].sum() + 3.0 * fn(x)[1].sum()

    want = jax.grad(loss(jax_fn))(X)
    np.testing.assert_allclose(jax.grad(loss(pw_fn))(X), want, **TOL)
    np.testing.assert_allclose(jax.jit(jax.grad(loss(pw_fn)))(X), want, **TOL)


def test_grads_without_the_replication_check(client):
    # JAX: test_check_rep_false_grads
    q = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    kv = np.arange(8.0, dtype=np.float32)
    same_grads(client, lambda q, k, v: q * k[None, :] + v[None, :], (4,), ("heads",),
               (P("heads", None), P(None), P(None)), P("heads", None), q, kv, kv,
               check_rep=False, argnums=(0, 1, 2))


def test_vmap_of_a_pw_function(client):
    # JAX: test_vmap_basic (a 2x2 mesh), and vmap of a grad
    pw_fn, jax_fn = both(client, lambda x: 2.0 * x, (2, 2), ("x", "y"), P("y"), P("y"))
    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    np.testing.assert_allclose(jax.vmap(pw_fn)(x), 2 * x, **TOL)
    f, _ = both(client, lambda w, x: jax.lax.psum(jnp.sum(x * w), "i"), (4,), ("i",),
                (P(), P("i")), P())
    g = jax.vmap(jax.grad(f), in_axes=(0, None))(np.ones((3, 1), np.float32), X)
    np.testing.assert_allclose(g, np.full((3, 1), X.sum()), **TOL)


def test_an_integer_argument_gets_no_cotangent(client):
    # JAX: test_transpose_float0 (what grad gives an integer argument)
    f, _ = both(client, lambda x, n: x * n.astype(x.dtype), (4,), ("i",), P("i"), P("i"))
    n = np.arange(16, dtype=np.int32)
    g = jax.grad(lambda x, n: f(x, n).sum(), argnums=(0, 1), allow_int=True)(X, n)
    np.testing.assert_allclose(g[0], n.astype(np.float32))
    assert g[1].dtype == jax.dtypes.float0


@pytest.mark.parametrize("spec", [P("x", "y"), P("x")])
def test_jvp_and_linearize(client, spec):
    # JAX: test_jvp_basic, test_linearize_basic, test_linearize_basic_repres(_jit)
    f, g = both(client, lambda x: jnp.sin(jnp.cos(x)), (2, 2), ("x", "y"), spec, spec)
    x = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    want = jax.jvp(g, (x,), (x,))
    for got in (jax.jvp(f, (x,), (x,)), jax.jit(lambda x: jax.jvp(f, (x,), (x,)))(x)):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, **TOL)
    y, lin = jax.linearize(f, x)
    np.testing.assert_allclose(y, want[0], **TOL)
    np.testing.assert_allclose(lin(x), want[1], **TOL)
    np.testing.assert_allclose(jax.linear_transpose(lin, x)(x),
                               jax.linear_transpose(jax.linearize(g, x)[1], x)(x), **TOL)


def test_forward_and_reverse_mode_agree_under_vmap(client):
    """Per-example gradients (vmap of grad), vmap of jvp and jacfwd against jacrev, each
    equal to jax.shard_map's; a replicated output's tangent is a psum's."""
    f, g = both(client, lambda x: lax_sum_squares(x), (4,), ("i",), P("i"), P())
    xs = np.stack([X, X[::-1] * 0.5])
    np.testing.assert_allclose(jax.vmap(jax.grad(f))(xs), jax.vmap(jax.grad(g))(xs), **TOL)
    np.testing.assert_allclose(jax.vmap(lambda x: jax.jvp(f, (x,), (x,))[1])(xs),
                               jax.vmap(lambda x: jax.jvp(g, (x,), (x,))[1])(xs), **TOL)
    np.testing.assert_allclose(jax.jacfwd(f)(X), jax.jacrev(g)(X), **TOL)


def lax_sum_squares(x):
    return jax.lax.psum(jnp.sum(x ** 2), "i")


def test_an_integer_output_has_a_float0_tangent(client):
    f, g = both(client, lambda x: (x * 3.0, (x > 4.0).astype(jnp.int32)), (4,), ("i",),
                P("i"), (P("i"), P("i")))
    got, want = jax.jvp(f, (X,), (X,)), jax.jvp(g, (X,), (X,))
    np.testing.assert_allclose(got[1][0], want[1][0], **TOL)
    assert got[1][1].dtype == want[1][1].dtype == jax.dtypes.float0
    np.testing.assert_array_equal(got[0][1], want[0][1])


@pytest.mark.parametrize("how", ["hessian", "grad of grad", "jvp of grad"])
def test_a_second_derivative_is_refused_naming_the_function(client, how):
    f = pw.shard_map(lax_sum_squares, across_hosts(client, (4,), ("i",)), P("i"), P(),
                     name="loss")
    second = {"hessian": jax.hessian(f),
              "grad of grad": jax.grad(lambda x: jax.grad(f)(x).sum()),
              "jvp of grad": lambda x: jax.jvp(jax.grad(f), (x,), (x,))}[how]
    with pytest.raises(pw.ProgramError, match="loss: .*second derivative"):
        second(X)


def test_a_training_loop_with_value_and_grad_outside(client):
    """The issue's target: a loss computed by a sharded forward pass, its gradient by JAX's
    value_and_grad outside pw.shard_map, three steps of SGD: losses equal jax.shard_map's."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    params = {"w": rng.normal(size=(4, 1)).astype(np.float32) * 0.5,
              "b": np.zeros((1,), np.float32)}

    def body(p, x, y):  # data parallel: each device its rows, the mean loss over all
        err = x @ p["w"] + p["b"] - y
        return jax.lax.psum(jnp.sum(err ** 2), "d") / 16.0

    pw_fn, jax_fn = both(client, body, (4,), ("d",), ({"w": P(), "b": P()}, P("d"), P("d")),
                         P())
    losses = {}
    for name, fn in (("pw", pw_fn), ("jax", jax_fn)):
        p, losses[name] = params, []
        for _ in range(3):
            loss, grads = jax.value_and_grad(fn)(p, x, y)
            p = jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)
            losses[name].append(float(loss))
    np.testing.assert_allclose(losses["pw"], losses["jax"], rtol=1e-5)
    assert losses["pw"][-1] < losses["pw"][0]


def test_pw_arrays_stay_on_the_cluster_as_constants(client):
    """Data put on the cluster once, parameters from JAX: the gradient flows to the JAX
    values only, and the pw.Array is used where it is."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    body = lambda w, x: jax.lax.psum(jnp.sum(jnp.tanh(x @ w) ** 2), "i")  # noqa: E731
    pw_fn, jax_fn = both(client, body, (4,), ("i",), (P(), P("i")), P())
    on_cluster = client.put(x, pw_fn.mesh, P("i"))
    got = jax.value_and_grad(lambda w: pw_fn(w, on_cluster))(w)
    want = jax.value_and_grad(lambda w: jax_fn(w, x))(w)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, **TOL)
    np.testing.assert_allclose(on_cluster.result(), x)  # still there, unchanged
    # a Python number as the differentiated argument (JAX hands it on weakly typed)
    pw_fn, jax_fn = both(client, lambda s, x: jax.lax.psum(jnp.sum(x * s), "i"), (4,), ("i",),
                         (P(), P("i")), P())
    np.testing.assert_allclose(jax.grad(lambda s: pw_fn(s, on_cluster))(1.0),
                               jax.grad(lambda s: jax_fn(s, x))(1.0), **TOL)


def test_a_program_under_jax_transformations_runs_its_calls_one_by_one(client):
    """jax.grad, jax.jit and jax.vmap of a @pw.program: its shard_map calls are JAX's work,
    each as above (as pw.reference runs them); grads equal the jax.shard_map chain's."""
    layer, jax_layer = both(client, lambda w, x: jnp.tanh(x @ w), (4,), ("i",), (P(), P("i")),
                            P("i"))
    total, jax_total = both(client, lambda y: jax.lax.psum(jnp.sum(y ** 2), "i"), (4,),
                            ("i",), P("i"), P())
    rng = np.random.default_rng(3)
    w1, w2 = (rng.normal(size=(3, 3)).astype(np.float32) for _ in range(2))
    x = rng.normal(size=(8, 3)).astype(np.float32)

    @pw.program
    def loss(w1, w2, x):
        return total(layer(w2, layer(w1, x)))

    def jax_loss(w1, w2, x):
        return jax_total(jax_layer(w2, jax_layer(w1, x)))

    want = jax.grad(jax_loss, argnums=(0, 1))(w1, w2, x)
    for fn in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
        for g, v in zip(fn(w1, w2, x), want):
            np.testing.assert_allclose(g, v, **TOL)
    xs = np.stack([x, 2 * x])
    np.testing.assert_allclose(jax.vmap(loss, in_axes=(None, None, 0))(w1, w2, xs),
                               jax.vmap(jax_loss, in_axes=(None, None, 0))(w1, w2, xs), **TOL)

