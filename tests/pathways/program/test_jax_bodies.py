"""JAX bodies (issue 14, part 1): shard_map bodies written with jax.numpy, jax.lax collectives
and jax.grad run on the cluster, each checked against plain JAX running the same
``jax.shard_map`` in this process on 8 CPU devices (conftest sets XLA_FLAGS)."""

import functools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
from pathways import P
from pathways.program.compiled import Aval
from pathways.program.jax_body import uses_jax
from pathways.program.jax_plan import Collective
from pathways.testing import jax_specs, rand
from pathways.testing.fixtures import in_process_only

jax = pytest.importorskip("jax")
jnp = jax.numpy
from conftest import ROOT, load_example  # noqa: E402
from jax.sharding import Mesh as JaxMesh  # noqa: E402

TOL = {"rtol": 2e-5, "atol": 2e-5}


def plain_jax(body, shape, names, in_specs, out_specs):
    """``body`` under jax.shard_map on this process's CPU devices."""
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    return jax.jit(jax.shard_map(body, mesh=JaxMesh(devices, names),
                                 in_specs=jax_specs(in_specs),
                                 out_specs=jax_specs(out_specs)))


def assert_same(got, want):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        np.testing.assert_allclose(g, w, **TOL)


def on_cluster(client, body, shape, names, in_specs, out_specs, *args):
    """Run ``body`` with pathways on the shared cluster and with plain JAX; compare (over
    both of its hosts when the mesh splits evenly: collectives between hosts too)."""
    mesh = client.mesh(shape, names, hosts=2 if np.prod(shape) % 2 == 0 else None)
    fn = pw.shard_map(body, mesh, in_specs, out_specs)
    specs = in_specs if type(in_specs) is tuple else (in_specs,) * len(args)
    put = [client.put(a, mesh, s) for a, s in zip(args, specs)]
    got = fn(*put)
    got = jax.tree.map(lambda a: a.result(), got, is_leaf=lambda a: isinstance(a, pw.Array))
    assert_same(got, plain_jax(body, shape, names, in_specs, out_specs)(*args))
    return fn, got


# ---- the jax.shard_map tutorial's examples ------------------------------------------------

def test_matmul_psum_and_reduce_scatter(client):
    def matmul_psum(a, b):
        return jax.lax.psum(a @ b, "i")

    def matmul_reduce_scatter(a, b):
        return jax.lax.psum_scatter(a @ b, "i", scatter_dimension=0, tiled=True)

    a, b = rand(8, 16), rand(16, 4, seed=1)
    specs = (P(None, "i"), P("i", None))
    fn, got = on_cluster(client, matmul_psum, (4,), ("i",), specs, P(), a, b)
    assert fn.jax is not None  # it ran as JAX, not as a numpy body
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-5)
    on_cluster(client, matmul_reduce_scatter, (4,), ("i",), specs, P("i", None), a, b)


@pytest.mark.parametrize("tiled", [True, False])
def test_all_gather(client, tiled):
    def gather(x):
        return jax.lax.all_gather(x, "i", axis=0, tiled=tiled)

    on_cluster(client, gather, (4,), ("i",), P("i"), P("i"), rand(8, 3))


def test_ppermute_ring_and_collective_matmul(client):
    def ring(x):
        n = jax.lax.axis_size("i")
        return jax.lax.ppermute(x, "i", [(j, (j + 1) % n) for j in range(n)])

    on_cluster(client, ring, (4,), ("i",), P("i"), P("i"), rand(8, 2))

    def collective_matmul(lhs_block, rhs_block):
        """The tutorial's all-gather matmul: shift rhs blocks round the ring and overlap."""
        n = jax.lax.axis_size("i")
        idx = jax.lax.axis_index("i")
        shift = functools.partial(jax.lax.ppermute, axis_name="i",
                                  perm=[(j, (j + 1) % n) for j in range(n)])
        width = lhs_block.shape[1] // n

        def lhs_cols(j):
            return jax.lax.dynamic_slice_in_dim(lhs_block, j * width, width, 1)

        out = lhs_cols(idx) @ rhs_block
        for i in range(1, n):
            rhs_block = shift(rhs_block)
            out = out + lhs_cols((idx - i) % n) @ rhs_block
        return out

    lhs, rhs = rand(8, 16), rand(16, 12, seed=1)
    _, got = on_cluster(client, collective_matmul, (4,), ("i",), (P("i", None), P("i", None)),
                        P("i", None), lhs, rhs)
    np.testing.assert_allclose(got, lhs @ rhs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tiled", [True, False])
def test_all_to_all(client, tiled):
    def a2a(x):
        if tiled:
            return jax.lax.all_to_all(x, "i", 0, 1, tiled=True)
        return jax.lax.all_to_all(x.reshape(4, 2, 3), "i", 0, 2)

    on_cluster(client, a2a, (4,), ("i",), P("i"), P("i"), rand(32, 3))


def test_dp_tp_mlp(client):
    """The tutorial's data- and tensor-parallel MLP layer, on a (2, 4) mesh."""
    def layer(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        return jax.lax.psum(h @ w2, "model")

    x, w1, w2 = rand(8, 16), rand(16, 32, seed=1), rand(32, 16, seed=2)
    specs = (P("data", None), P(None, "model"), P("model", None))
    on_cluster(client, layer, (2, 4), ("data", "model"), specs, P("data", None), x, w1, w2)


def test_pmax_pmin_pmean_and_pw_spellings(client):
    """pw's collectives inside a JAX body mean jax.lax's (and inside plain jax.shard_map)."""
    def body(x):
        y = jax.lax.pmax(x, "i") - jax.lax.pmin(x, "i") + jax.lax.pmean(x, "i")
        return y, pw.psum(jnp.sin(x), "i") + pw.axis_index("i"), \
            pw.all_gather(x, "i", tiled=True)

    on_cluster(client, body, (4,), ("i",), P("i"), (P(), P("i"), P("i")), rand(8, 2))


def _combining_body(a, b):
    """Two independent psums with work between them, a pmax, then their use."""
    ga = jax.lax.psum(a * 2, "i")
    gb = jax.lax.psum(jnp.sin(b), "i")
    top = jax.lax.pmax(b, "i")
    return ga + 1, gb * ga.sum(), top


def test_reductions_run_in_rounds_and_go_as_one_exchange():
    """Reductions run in rounds: work that does not need a reduction's result runs in the
    segment before it, and a round's reductions of one kind over the same axes become one
    step (one exchange); a reduction that reads another's result waits for it."""
    mesh = pw.Mesh.abstract((2,), ("i",))

    def steps(body, n_in, outs):
        fn = pw.shard_map(body, mesh, (P("i"),) * n_in, outs)
        avals = [Aval((4, 3), np.dtype(np.float32))] * n_in
        ins = fn.signature(avals).ins  # (first: it tells a JAX body, fn.jax)
        plan = fn.jax.plan(ins, fn.single_output)
        return [type(s).__name__ if not isinstance(s, Collective) else
                [e.primitive.name for e in s.eqns] for s in plan.steps]

    assert steps(_combining_body, 2, (P(), P(), P())) == [
        "Segment", ["psum_invariant", "psum_invariant"], ["pmax"], "Segment"]
    chained = steps(lambda a: jax.lax.psum(jnp.cos(jax.lax.psum(a, "i")), "i"), 1, P())
    assert chained == [["psum_invariant"], "Segment", ["psum_invariant"]]

    def loss_and_grad(a, b):  # the loss's use does not hold back the gradient's psum
        loss = jax.lax.psum(jnp.sum(a), "i") / 2
        return loss, jax.lax.psum(b * 3, "i") + 1

    assert steps(loss_and_grad, 2, (P(), P())) == [
        "Segment", ["psum_invariant", "psum_invariant"], "Segment"]


def test_combined_reductions_are_bitwise_the_single_ones(client):
    """Reductions carried by one exchange (across two hosts) give bitwise what each gives
    alone, and the body's results equal plain JAX's."""
    a, b = rand(8, 3), rand(8, 5, seed=1)
    fn, got = on_cluster(client, _combining_body, (4,), ("i",), (P("i"), P("i")),
                         (P(), P(), P()), a, b)
    mesh = client.mesh((4,), ("i",), hosts=2)
    alone_a = pw.shard_map(lambda x: jax.lax.psum(x * 2, "i"), mesh, P("i"), P())
    alone_b = pw.shard_map(lambda x: jax.lax.psum(jnp.sin(x), "i"), mesh, P("i"), P())
    ga = alone_a(client.put(a, mesh, P("i"))).result()
    gb = alone_b(client.put(b, mesh, P("i"))).result()
    np.testing.assert_array_equal(got[0], ga + 1)
    np.testing.assert_array_equal(got[1], gb * ga.sum())


def test_a_mesh_whose_hosts_hold_it_unevenly_runs_its_collectives():
    """Row 0 of a (2, 4) mesh on two hosts, two devices each, row 1 on a third, whole: the
    third could run its psum over "model" inside one computation, the others exchange it.
    Every host must then number the exchanges alike: the psum over "data" after it failed
    ("another host sent the partial ... unexpectedly"); now a host batches only where every
    host's devices form a box of the same extents (batching.same_boxes)."""
    from pathways.host.batching import same_boxes

    with pw.local_cluster(hosts_per_island=3, devices_per_host=4, processes=False) as cluster, \
            pw.connect(cluster.address) as client:
        client.mesh((4,), ("x",), hosts=2)  # two devices on each of two hosts, held
        mesh = client.mesh((2, 4), ("data", "model"))
        hosts = [[d.host for d in row] for row in mesh.devices]
        assert hosts[0][0] == hosts[0][1] != hosts[0][2] == hosts[0][3] != hosts[1][0]
        assert len(set(hosts[1])) == 1

        def body(x):
            rows = jax.lax.psum(x, "model") * 2
            return jax.lax.psum(rows, "data"), jax.lax.pmax(x, "data")

        x = rand(2, 8)
        fn = pw.shard_map(body, mesh, P("data", "model"), (P(), P(None, "model")))
        total, top = fn(client.put(x, mesh, P("data", "model")))
        assert_same((total.result(), top.result()),
                    plain_jax(body, (2, 4), ("data", "model"), P("data", "model"),
                              (P(), P(None, "model")))(x))
    owner = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c", 6: "c", 7: "c"}
    flat = {i: i for i in range(8)}
    assert not same_boxes(flat, (2, 4), owner.get)  # boxes (1, 2), (1, 2) and (1, 4)
    assert same_boxes(flat, (2, 4), lambda d: d // 4)  # a row each
    assert same_boxes(flat, (2, 4), lambda d: d % 4 // 2)  # a (2, 2) block each
    assert not same_boxes(flat, (2, 4), lambda d: None if d == 7 else d // 4)  # not known


# ---- training with jax.grad inside the body ---------------------------------------------

@in_process_only
def test_transformer_training_matches_plain_jax(client):
    """Several DP + TP training steps of a transformer block (jax.value_and_grad inside the
    body, pytree parameters): the same losses and parameters as plain JAX."""
    ex = load_example("jax_transformer")
    mesh = client.mesh((2, 4), ("data", "model"))
    step, ref = ex.pathways_step(mesh), ex.jax_step(jax.devices()[:8])
    params = {k: client.put(v, mesh, ex.SPECS[k]) for k, v in ex.init().items()}
    want_params = ex.init()
    losses, want_losses = [], []
    for i in range(3):
        x, t = ex.batch(i)
        params, loss = step(params, client.put(x, mesh, ex.DATA_SPEC),
                            client.put(t, mesh, ex.DATA_SPEC))
        want_params, want_loss = ref(want_params, x, t)
        losses.append(float(loss.result()))
        want_losses.append(float(want_loss))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    for k, v in params.items():
        np.testing.assert_allclose(v.result(), np.asarray(want_params[k]), rtol=1e-3,
                                   atol=1e-5)


def test_grad_in_reference_interpreter():
    """pw.reference runs JAX bodies too (threads, no cluster)."""
    def step(w, x):
        loss, g = jax.value_and_grad(lambda w: jax.lax.psum(jnp.sum((x @ w) ** 2), "i"))(w)
        return w - 0.1 * g, loss

    mesh = pw.Mesh.abstract((4,), ("i",))
    w, x = rand(3, 2), rand(8, 3, seed=1)
    got = pw.reference(pw.shard_map(step, mesh, (P(), P("i")), (P(), P())))(w, x)
    assert_same(got, plain_jax(step, (4,), ("i",), (P(), P("i")), (P(), P()))(w, x))


# ---- a differential suite: random bodies from a small grammar ----------------------------

# every op is well conditioned: psum adds along pathways' reduction tree, XLA in device order,
# so float32 sums differ in the last bits, which sin of a large value (after neg_sq twice,
# say) would blow up past any tolerance
UNARY = {"sin": lambda x: jnp.sin(jnp.tanh(x)), "tanh": jnp.tanh, "neg_sq": lambda x: -x * x,
         "exp": lambda x: jnp.exp(-jnp.abs(x)), "scale": lambda x: 1.5 * x + 0.25,
         "softmax": lambda x: jax.nn.softmax(x, axis=-1),
         "cumsum": lambda x: jnp.cumsum(x, axis=0) / 8.0,
         "matmul": lambda x: x @ jnp.arange(16.0, dtype=x.dtype).reshape(4, 4) / 16.0}
RING = [(j, (j + 1) % 4) for j in range(4)]
COLLECTIVES = {
    "psum": lambda x: jax.lax.psum(x, "m"),
    "pmean": lambda x: jax.lax.pmean(x, ("d", "m")),
    "pmax": lambda x: jax.lax.pmax(x, "m"),
    "pmin": lambda x: jax.lax.pmin(x, "d"),
    "ppermute": lambda x: jax.lax.ppermute(x, "m", RING),
    "all_to_all": lambda x: jax.lax.all_to_all(x, "m", 0, 0, tiled=True),
    "scatter_gather": lambda x: jax.lax.all_gather(
        jax.lax.psum_scatter(x, "m", tiled=True), "m", tiled=True),
    "axis_index": lambda x: x + jax.lax.axis_index("m").astype(x.dtype),
}
OPS = {**UNARY, **COLLECTIVES}


def _compose(names):
    """x <- op(x + y / 2) for each op: x + y varies along both axes, so every collective of
    the grammar is valid under JAX's replication rules whatever came before."""
    def body(x, y):
        for name in names:
            x = OPS[name](x + 0.5 * y)
        return x
    body.__name__ = "_".join(names)
    return body


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=6),
       seed=st.integers(0, 2**16))
def test_random_bodies_match_plain_jax(client, names, seed):
    body = _compose(names)
    both = P(("d", "m"))
    on_cluster(client, body, (2, 4), ("d", "m"), (P("d"), both), both,
               rand(16, 4, seed=seed), rand(64, 4, seed=seed + 1))


# ---- what a body is, errors ---------------------------------------------------------------

def _helper(x):
    return jnp.tanh(x)


def test_uses_jax_tells_jax_bodies_from_numpy_bodies():
    assert not uses_jax(lambda x: np.tanh(x) * 2)
    assert not uses_jax(lambda x: pw.psum(x, "i"))
    assert uses_jax(lambda x: jnp.tanh(x))
    assert uses_jax(lambda x: jax.lax.psum(x, "i"))
    assert uses_jax(lambda x: _helper(x) + 1)  # through a helper function
    assert uses_jax(functools.partial(lambda w, x: x @ w, jnp.ones((2, 2))))
    from jax import lax
    assert uses_jax(lambda x: lax.pmax(x, "i"))


def test_jax_hidden_behind_an_object_is_still_found(client):
    """A body whose JAX use the static check cannot see (a method on an object) fails the
    numpy pass in JAX's way and is traced as JAX instead."""
    class Model:
        def __init__(self, ops):
            self.ops = ops

    model = Model({"reduce": __import__("jax").lax.psum})

    def body(x):
        return model.ops["reduce"](x * 2, "i")

    assert not uses_jax(body)
    fn, _ = on_cluster(client, body, (4,), ("i",), P("i"), P(), rand(8, 2))
    assert fn.jax is not None


def test_float64_follows_jax_config():
    """x64 off (JAX's default): float64 arguments become float32, as under jax.jit."""
    mesh = pw.Mesh.abstract((2,), ("i",))
    fn = pw.shard_map(lambda x: jnp.sin(x), mesh, P("i"), P("i"))
    assert fn.abstract_eval([Aval((4,), np.dtype(np.float64))])[0].dtype == np.float32
    fn64 = pw.shard_map(lambda x: jnp.sin(x), mesh, P("i"), P("i"))
    with jax.enable_x64(True):  # as with jax.jit, the setting where it is first traced
        got = pw.reference(fn64)(np.arange(4.0))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.sin(np.arange(4.0)))


def test_unreplicated_out_spec_is_refused_by_jax_check():
    mesh = pw.Mesh.abstract((4,), ("i",))
    fn = pw.shard_map(lambda x: jnp.sin(x), mesh, P("i"), P())
    with pytest.raises(pw.ProgramError, match="<lambda>.*replicat"):
        fn.abstract_eval([Aval((8,), np.dtype(np.float32))])
    unchecked = pw.shard_map(lambda x: jnp.sin(x), mesh, P("i"), P(), check_rep=False)
    assert unchecked.abstract_eval([Aval((8,), np.dtype(np.float32))])[0].shape == (2,)


def _traced_flat(fn):
    return fn.abstract_eval([Aval((8, 4), np.dtype(np.float32))])


def _traced_for_a_pytree(fn):  # its result's structure first, from a trace of its own
    return fn.twin(({"a": np.zeros((8, 4), np.float32)},))


@pytest.mark.parametrize("op, body, trace", [
    ("psum", lambda x: jax.lax.psum(x, "nope"), _traced_flat),  # JAX's error: empty
    ("all_gather", lambda x: jax.lax.all_gather(x, ("i", "nope")), _traced_flat),
    ("psum", lambda t: jax.lax.psum(t["a"], "nope"), _traced_for_a_pytree),
])
def test_a_collective_over_an_axis_the_mesh_lacks_names_the_axis_and_the_mesh(op, body, trace):
    """Issue 45: the error names the collective, the axis and the mesh's axes, as a spec's
    does, not JAX's error for it (for psum, an AssertionError with no message)."""
    fn = pw.shard_map(body, pw.Mesh.abstract((2, 4), ("i", "j")), P("i"), P("i"))
    with pytest.raises(pw.ProgramError) as e:
        trace(fn)
    assert str(e.value) == f"<lambda>: {op} over axis 'nope', which the mesh ('i', 'j')" \
        " does not have"


def test_a_trace_error_with_no_message_is_named_by_its_type():
    def body(x):
        y = jnp.sin(x)
        if y.ndim:
            raise AssertionError  # no message, as some of JAX's own errors have none
        return y

    fn = pw.shard_map(body, pw.Mesh.abstract((2,), ("i",)), P("i"), P("i"))
    with pytest.raises(pw.ProgramError, match=r"body on arguments \['float32\[8\]'\]:"
                                              r" AssertionError$"):
        fn.abstract_eval([Aval((8,), np.dtype(np.float32))])


def test_collectives_inside_scan_while_and_cond(client):
    """Loops and conditionals whose bodies hold collectives run their iterations on the
    host, the body's plan per iteration (fori_loop over a ppermute ring, as in the
    tutorial's collective matmul written with a loop)."""
    ring = [(j, (j + 1) % 4) for j in range(4)]

    def body(x):
        def step(c, xi):
            return c + jax.lax.ppermute(c, "i", ring) * xi, c.sum()
        c, ys = jax.lax.scan(step, x, jnp.arange(3.0))
        w = jax.lax.fori_loop(0, 2, lambda k, v: v * 0.5 + jax.lax.ppermute(v, "i", ring), x)
        n = jax.lax.while_loop(lambda s: s[1] < 3, lambda s: (
            s[0] + jax.lax.ppermute(s[0], "i", ring), s[1] + 1), (x, 0))[0]
        total = jax.lax.psum(x.sum(), "i")
        z = jax.lax.cond(total > 0, lambda v: jax.lax.ppermute(v, "i", ring),
                         lambda v: v * 2.0, x)
        return c, ys, w, n, z

    on_cluster(client, body, (4,), ("i",), P("i"), (P("i"),) * 5, rand(16))


def test_modelled_time_comes_from_xla_cost_analysis():
    """A matmul's modelled time is its flops at the device's peak: 2*M*N*K from XLA."""
    mesh = pw.Mesh.abstract((2,), ("i",))
    fn = pw.shard_map(jnp.matmul, mesh, (P("i"), P()), P("i"))
    avals = [Aval((512, 256), np.dtype(np.float32)), Aval((256, 512), np.dtype(np.float32))]
    sig = fn.signature(avals)
    plan = fn.jax.plan(sig.ins, fn.single_output)
    assert plan.flops == 2 * 256 * 256 * 512
    spec = pw.DeviceSpec(flops=1e9, hbm_bandwidth=1e15)
    assert fn.cost_of([], [], spec, sig) == pytest.approx(plan.flops / 1e9)
    ring = [(0, 1), (1, 0)]

    def looped(a, b):  # 3 matmuls, a ppermute after each: a scan the plan runs itself
        return jax.lax.scan(lambda c, _: (jax.lax.ppermute(c @ b, "i", ring), None), a,
                            None, length=3)[0]

    scan = pw.shard_map(looped, mesh, (P("i"), P()), P("i"))
    sq = [Aval((512, 512), np.dtype(np.float32))] * 2
    ins = scan.signature(sq).ins
    assert scan.jax.plan(ins, True).flops == 3 * 2 * 256 * 512 * 512
    assert pw.shard_map(jnp.matmul, mesh, (P("i"), P()), P("i"), cost=0.5) \
        .cost_of([], [], spec, sig) == 0.5


def test_without_jax_numpy_bodies_work_and_jax_bodies_say_how_to_install(tmp_path):
    script = textwrap.dedent("""
        import sys
        sys.modules["jax"] = None  # as if the extra were not installed
        import numpy as np
        import pathways as pw
        from pathways import P
        mesh = pw.Mesh.abstract((2,), ("i",))
        ok = pw.reference(pw.shard_map(lambda x: pw.psum(x, "i"), mesh, P("i"), P()))
        assert np.allclose(ok(np.arange(4.0)), [2.0, 4.0])

        def body(x):
            import jax.numpy as jnp
            return jnp.sin(x)

        try:
            pw.reference(pw.shard_map(body, mesh, P("i"), P("i")))(np.arange(4.0))
        except pw.ProgramError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert "pip install -e '.[jax]'" in out.stdout


def test_the_readme_jax_snippet_matches_plain_jax():
    import re

    text = (ROOT / "README.md").read_text()
    code = re.search(r"<!-- jax -->\s*```python\n(.*?)```", text, re.S).group(1)
    scope = {"pw": pw, "P": P, "mesh": pw.Mesh.abstract((4,), ("data",))}
    exec(code, scope)
    w, x, y = rand(3, 2), rand(8, 3, seed=1), rand(8, 2, seed=2)
    got = pw.reference(scope["step"])(w, x, y)
    want = plain_jax(scope["sgd"], (4,), ("data",), (P(), P("data"), P("data")),
                     (P(), P()))(w, x, y)
    assert_same(got, want)


# ---- library code with JAX bodies: pipeline stages, experts ----------------------------

def test_pipeline_with_jax_stages_matches_hand_written_backward(client):
    """Stage.from_jax: the backward is jax.vjp; two stages of two devices each train as the
    example's hand-written numpy stages do."""
    ex = load_example("pipeline_mlp")
    numpy_stages = ex.init_stages(2)
    losses = {}
    for name, stages in (("numpy", numpy_stages), ("jax", ex.jax_stages(numpy_stages))):
        pipe = pw.Pipeline(client, stages, ex.mse, microbatches=2, lr=0.2, devices_per_stage=2)
        losses[name] = [float(pipe.step(x, t).result(60)) for x, t in ex.batches(3)]
    # float32 inside the JAX stages (x64 off), float64 in the numpy ones
    np.testing.assert_allclose(losses["jax"], losses["numpy"], rtol=1e-4)
    assert losses["jax"][-1] < losses["jax"][0]


def test_expert_body_in_jax(client):
    """An expert_map body written with jax.numpy (and jax.grad) runs per expert."""
    mesh = client.mesh((4,), ("e",))

    def expert(rows, w):
        # the rows' gradient of a per-row loss, through jax.grad
        return jax.vmap(jax.grad(lambda r: jnp.sum(jnp.tanh(r @ w) ** 2)))(rows)

    fn = pw.expert_map(expert, tokens=mesh, experts=mesh, num_experts=4)
    route = np.array([[0], [1], [2], [3], [1], [0], [3], [2]], np.int32)
    x, w = rand(8, 3), rand(4, 3, 3, seed=1)
    got = fn(client.put(route, mesh, P("e")), client.put(x, mesh, P("e")),
             client.put(w, mesh, P("e"))).result()
    def row_grad(r, we):
        return jax.grad(lambda r: jnp.sum(jnp.tanh(r @ we) ** 2))(r)

    for t in range(8):
        want = row_grad(x[t], w[route[t, 0]])
        np.testing.assert_allclose(got[t, 0], want, rtol=1e-5, atol=1e-6)


def test_a_body_closing_over_jax_arrays():
    """Arrays the body closes over become constants of its plan (shipped with the body)."""
    w = jnp.arange(8.0, dtype=jnp.float32).reshape(4, 2) / 8
    table = jnp.ones((300, 4), jnp.float32)

    def body(x):
        return jax.lax.psum(x @ w + table[:x.shape[0]].sum(), "i")

    mesh = pw.Mesh.abstract((2,), ("i",))
    x = rand(4, 4)
    got = pw.reference(pw.shard_map(body, mesh, P("i"), P()))(x)
    assert_same(got, plain_jax(body, (2,), ("i",), P("i"), P())(x))


def test_compilation_is_the_hosts_work_not_device_time(pw_process_cluster, tmp_path):
    """Issue 30: a host compiling a JAX body's program is not device busy time. Every
    device of the gang waits for it idle (a "compile" span before its first kernel, which
    begins only when the program is ready); the next call compiles nothing."""
    from pathways.plot import utilization

    with pw.connect(pw_process_cluster.address) as client:
        mesh = client.mesh((8,), ("d",))
        salt = float(np.random.default_rng().integers(1, 1000))  # a program no host has seen
        f = pw.shard_map(lambda v: jax.lax.psum(jnp.tanh(v) * salt, "d"), mesh, P("d"), P(),
                         cost=1e-4)
        x = client.put(np.ones(8, np.float32), mesh, P("d"))
        with client.trace(tmp_path / "t.json") as tr:
            first = f(x)
            first.block_until_ready()
            np.testing.assert_allclose(f(x).result(), first.result())
        events = [e for e in tr.trace["traceEvents"] if e.get("ph") == "X"]
        rows = {}
        for e in events:
            rows.setdefault((e["pid"], e["tid"]), []).append(e)
        assert len(rows) == 8
        for row in rows.values():
            row.sort(key=lambda e: e["ts"])
            compile_, first_k, second_k = row  # each device: compile, then its two kernels
            assert (compile_["cat"], first_k["cat"], second_k["cat"]) == (
                "compile", "kernel", "kernel")
            assert compile_["dur"] > 0
            assert abs(compile_["ts"] + compile_["dur"] - first_k["ts"]) < 1.0  # µs
            assert first_k["args"]["compile"] > 0 and "compile" not in second_k["args"]
        busy = utilization(tr.trace)
        span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
        for (_, tid), row in rows.items():
            kernels = sum(e["dur"] for e in row if e["cat"] == "kernel")
            label = next(k for k in busy if k.endswith(f"device {tid}"))
            assert busy[label] == pytest.approx(kernels / span)


def _frozen(v):
    import gc
    return v * 0 + gc.get_freeze_count()


def test_a_host_freezes_what_jax_brought():
    """A host process loads JAX with its first JAX body, after its collector was settled:
    what JAX brought (~100k objects) is frozen then too, so a full collection does not
    rescan it (issue 47: 200-340 ms each on a host that keeps its kernel records)."""
    with pw.local_cluster(hosts_per_island=1, devices_per_host=1) as cluster, \
            pw.connect(cluster.address) as client:
        mesh = client.mesh((1,), ("d",))
        x = client.put(np.zeros(1, np.float32), mesh, P("d"))
        probe = pw.shard_map(_frozen, mesh, P("d"), P("d"))
        before = int(probe(x).result(timeout=30)[0])
        pw.shard_map(jnp.tanh, mesh, P("d"), P("d"))(x).block_until_ready(60)
        after = int(probe(x).result(timeout=30)[0])
    assert after > before + 10_000, (before, after)


def test_hosts_compilation_cache_is_private_or_not_used(tmp_path, monkeypatch):
    from pathways.program.jax_body import compilation_cache

    monkeypatch.setenv("PATHWAYS_JAX_CACHE", str(tmp_path / "c"))
    where = compilation_cache()
    assert where == str(tmp_path / "c") and os.stat(where).st_mode & 0o777 == 0o700
    os.chmod(where, 0o777)  # others may write executables into it: not used
    assert compilation_cache() is None
    monkeypatch.setenv("PATHWAYS_JAX_CACHE", "off")
    assert compilation_cache() is None
    monkeypatch.delenv("PATHWAYS_JAX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation_cache() == str(tmp_path / "xdg" / "pathways" / "jax")
