"""Issue 30: a host runs a JAX body's segments once for all of its devices of the gang (one
vmapped XLA computation, ``pathways.program.jax_batch``), with the collectives among them
inside it: results equal the per-device reference's, each device keeps its kernel record,
and a body cut by a collective to another host runs per device as before."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
from pathways import P
from pathways.testing import fails_once_then_recovers, rand
from pathways.testing.fixtures import in_process_only

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax

RING = [(j, (j + 1) % 4) for j in range(4)]


def run_traced(client, tmp_path, fn, mesh, args, specs):
    """``fn``'s results and each kernel's trace args, for one call."""
    put = [client.put(a, mesh, s) for a, s in zip(args, specs)]
    with client.trace(tmp_path / "t.json") as tr:
        outs = fn(*put)
        outs = [o.result() for o in (outs if isinstance(outs, tuple) else (outs,))]
    kernels = [e["args"] for e in tr.trace["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") == "kernel"]
    return outs, kernels


def every_collective(x, y):
    """Each collective kind over axes the host holds: bitwise the per-device path's."""
    h = jnp.tanh(x) + 0.5 * y
    s = lax.psum(h, ("m", "d"))  # several axes, the minor one named first
    mx, mn = lax.pmax(h, "m"), lax.pmin(h, "d")
    g = lax.all_gather(h, ("d", "m"), axis=1, tiled=True)
    u = lax.all_gather(h, "m")  # untiled: a new dimension
    r = lax.psum_scatter(jnp.tile(h, (4, 1)), "m", tiled=True)
    r2 = lax.psum_scatter(jnp.stack([h, -h]), "d")  # untiled
    p = lax.ppermute(h, "m", RING)
    a = lax.all_to_all(jnp.tile(h, (4, 1)), "m", 0, 0, tiled=True)
    i = h + lax.axis_index(("d", "m")).astype(h.dtype)
    mean = lax.pmean(h.sum(), ("d", "m"))
    return s, mx, mn, g, u, r, r2, p, a, i, mean


OUT_SPECS = (P("d", "m"),) * 10 + (P(),)


def test_every_collective_inside_one_computation_equals_the_reference(one_host, tmp_path):
    mesh = one_host.mesh((2, 4), ("d", "m"))
    fn = pw.shard_map(every_collective, mesh, (P("d", "m"), P("d", "m")), OUT_SPECS,
                      check_rep=False)
    args = [rand(8, 12, seed=1), rand(8, 12, seed=2)]
    got, kernels = run_traced(one_host, tmp_path, fn, mesh, args, [P("d", "m")] * 2)
    want = pw.reference(fn)(*args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, np.asarray(w))
    assert len(kernels) == 8 and all(k.get("batch") == 8 for k in kernels)


@in_process_only
def test_a_body_cut_by_a_collective_to_another_host_still_runs_batched(client, tmp_path):
    """On 2 hosts x 4 (the session's twin): collectives over "m" stay on a host, so the body
    runs batched by 4; one over "d" reaches the other host and cuts the body there, and its
    segments still run batched by 4, the collective between them through the exchange."""
    mesh = client.mesh((2, 4), ("d", "m"))
    x = rand(8, 8, seed=3)
    local = pw.shard_map(lambda v: lax.psum(jnp.sin(v), "m") * lax.axis_index("d"), mesh,
                         P("d", "m"), P("d"))
    cut = pw.shard_map(lambda v: lax.psum(jnp.sin(v), ("d", "m")), mesh, P("d", "m"), P())
    for fn, batch in ((local, 4), (cut, 4)):
        got, kernels = run_traced(client, tmp_path, fn, mesh, [x], [P("d", "m")])
        np.testing.assert_array_equal(got[0], np.asarray(pw.reference(fn)(x)))
        assert len(kernels) == 8 and {k.get("batch") for k in kernels} == {batch}


def test_meshes_of_the_same_devices_batch_each_by_its_own_axes(one_host):
    """Two meshes over the same 8 devices: each body sees its own axes (a host keeps one
    device map per set of devices)."""
    flat, square = one_host.mesh((8,), ("i",)), one_host.mesh((2, 4), ("d", "m"))
    x = rand(8, 4, seed=4)
    f = pw.shard_map(lambda v: lax.psum(v, "i"), flat, P("i"), P())
    g = pw.shard_map(lambda v: lax.psum(v, "m"), square, P("d"), P("d"))
    np.testing.assert_array_equal(f(one_host.put(x, flat, P("i"))).result(),
                                  np.asarray(pw.reference(f)(x)))
    np.testing.assert_array_equal(g(one_host.put(x, square, P("d"))).result(),
                                  np.asarray(pw.reference(g)(x)))


def test_training_step_with_grad_and_scan_matches_the_reference(one_host):
    """jax.grad through collectives (batched), then the same with a scan whose body holds
    one (a loop the host runs per device), on one host: the reference's values (matmuls
    may round differently batched, so within float32 rounding)."""
    mesh = one_host.mesh((2, 4), ("d", "m"))

    def step(w, x):
        def loss(w):
            h = jnp.tanh(x @ w)
            return lax.pmean(lax.psum(jnp.sum(h * h), "m"), "d")

        value, grad = jax.value_and_grad(loss)(w)
        return value, w - 0.1 * grad

    def looped(w, x):
        value, w = step(w, x)
        acc, _ = lax.scan(lambda c, _: (c + lax.ppermute(c, "m", RING), None), w, None,
                          length=3)
        return value, w, acc

    w, x = rand(6, 8, seed=5), rand(4, 6, seed=6)
    for body, out_specs in ((step, (P(), P(None, "m"))),
                            (looped, (P(), P(None, "m"), P(None, "m")))):
        fn = pw.shard_map(body, mesh, (P(None, "m"), P("d")), out_specs)
        got = fn(one_host.put(w, mesh, P(None, "m")), one_host.put(x, mesh, P("d")))
        for g, r in zip(got, pw.reference(fn)(w, x)):
            np.testing.assert_allclose(g.result(), np.asarray(r), rtol=1e-6, atol=1e-6)


UNARY = {"tanh": jnp.tanh, "scale": lambda v: 1.5 * v - 0.25, "sq": lambda v: v * v}
COLLECTIVES = {
    "psum_m": lambda v: lax.psum(v, "m"), "psum_dm": lambda v: lax.psum(v, ("d", "m")),
    "pmax_d": lambda v: lax.pmax(v, "d"), "pmin_m": lambda v: lax.pmin(v, "m"),
    "ppermute": lambda v: lax.ppermute(v, "m", RING),
    "all_to_all": lambda v: lax.all_to_all(v, "m", 0, 0, tiled=True),
    "scatter_gather": lambda v: lax.all_gather(lax.psum_scatter(v, ("m", "d"), tiled=True),
                                               ("m", "d"), tiled=True),
    "index": lambda v: v * lax.axis_index(("m", "d")).astype(v.dtype),
}
OPS = {**UNARY, **COLLECTIVES}


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=5),
       seed=st.integers(0, 2**16))
def test_random_elementwise_bodies_equal_the_reference_bitwise(one_host, names, seed):
    """Elementwise operations and collectives only: batched, every value is bit for bit the
    per-device reference's (psums add in position order on both)."""
    def body(x, y):
        for name in names:
            x = OPS[name](x + 0.5 * y)
        return x

    mesh = one_host.mesh((2, 4), ("d", "m"))
    both = P(("d", "m"))
    fn = pw.shard_map(body, mesh, (P("d"), both), both)
    x, y = rand(16, 4, seed=seed), rand(64, 4, seed=seed + 1)
    got = fn(one_host.put(x, mesh, P("d")), one_host.put(y, mesh, both)).result()
    np.testing.assert_array_equal(got, np.asarray(pw.reference(fn)(x, y)))


def batched_psum_fails_once_then_recovers(client, owner, name, broken, message):
    """A batched psum works; with ``owner.name`` broken, the call fails naming ``message``
    well within the 60 s a waiting member would otherwise give its peers; then it works
    again."""
    mesh = client.mesh((2, 4), ("d", "m"))
    total = pw.shard_map(lambda v: lax.psum(jnp.cos(v), ("d", "m")), mesh, P("d", "m"), P())
    x = client.put(rand(2, 4, seed=7), mesh, P("d", "m"))
    fails_once_then_recovers(lambda: total(x), owner, name, broken, message)


def test_a_failing_batched_computation_fails_every_member_with_its_error(one_host):
    from pathways.program import jax_batch

    def broken(segment, coords, each):
        raise FloatingPointError("XLA failed here")

    batched_psum_fails_once_then_recovers(one_host, jax_batch, "_call", broken,
                                          "FloatingPointError: XLA failed here")


def test_a_member_that_fails_before_the_batch_fails_the_others_at_once(one_host):
    """One device's body fails before it reaches the batched segment: the others, parked
    there, fail at once with its error (not the collective timeout)."""
    from pathways.host.exchange import Exchanges

    real = Exchanges.batch

    def batch(self, shard, key, box, me, args, run):
        if me == box.members[-1]:  # the last member never arrives
            raise MemoryError("device ran out before the batch")
        return real(self, shard, key, box, me, args, run)

    batched_psum_fails_once_then_recovers(one_host, Exchanges, "batch", batch,
                                          "device ran out before the batch")
