"""Issue 30: a program's consecutive JAX calls on one mesh run as one compiled function
(``pathways.program.fusion``): one kernel per device for K steps, results those of the calls
one by one (``pw.reference``), and a run of calls ends wherever fusing would change what
the program does."""

import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.program import fusion
from pathways.program.ir import Aval
from pathways.testing import rand

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax

K = 4


def sgd_step(w, x, y):
    """Data x tensor parallel regression: w [8, 8] split over "m" by column, x over "d" by
    row, y over both; the loss is psum'd over "m" and pmean'd over "d" inside grad."""
    def loss(w):
        h = jnp.tanh(x @ w)
        return lax.pmean(lax.psum(jnp.mean((h - y) ** 2), "m"), "d")

    value, grad = jax.value_and_grad(loss)(w)
    return w - 0.1 * grad, value


def steps_program(fn):
    @pw.program
    def steps(w, x, y):
        losses = []
        for _ in range(K):
            w, loss = fn(w, x, y)
            losses.append(loss)
        return (w, *losses)

    return steps


def kernels_of(client, tmp_path, program, args):
    with client.trace(tmp_path / "t.json") as tr:
        outs = [o.result() for o in program(*args)]
    return outs, [e for e in tr.trace["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == "kernel"]


def args_of(client, mesh):
    values = [rand(8, 8, seed=1) * 0.3, rand(16, 8, seed=2), rand(16, 8, seed=3)]
    specs = [P(None, "m"), P("d"), P("d", "m")]
    return values, [client.put(v, mesh, s) for v, s in zip(values, specs)]


def fn_on(mesh):
    return pw.shard_map(sgd_step, mesh, (P(None, "m"), P("d"), P("d", "m")),
                        (P(None, "m"), P()))


@pytest.mark.parametrize("where", ["one_host", "client"])
def test_k_steps_are_one_kernel_per_device_and_equal_the_calls_one_by_one(
        where, request, tmp_path):
    """On one host of 8 the chain is one computation for all devices (``batch: 8``); on 2
    hosts x 4 (the session's twin) the gradient's psum over "d" leaves the host, so the
    chain's segments run for the host's 4 devices at once (``batch: 4``), that collective
    between them through the exchange. Either way one kernel per device for K steps, and
    results within float32 rounding of the reference's (XLA may contract a multiply and an add
    differently in a longer computation)."""
    client = request.getfixturevalue(where)
    mesh = client.mesh((2, 4), ("d", "m"))
    steps = steps_program(fn_on(mesh))
    values, args = args_of(client, mesh)
    got, kernels = kernels_of(client, tmp_path, steps, args)
    want = pw.reference(steps)(*values)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)
    assert len(kernels) == 8
    assert {k["name"] for k in kernels} == {f"sgd_step x{K}"}
    assert all(k["args"].get("batch") == (8 if where == "one_host" else 4) for k in kernels)


def test_fused_off_runs_every_call_as_its_own_kernel(one_host, tmp_path, monkeypatch):
    monkeypatch.setattr(fusion, "FUSE", False)
    mesh = one_host.mesh((2, 4), ("d", "m"))
    steps = steps_program(fn_on(mesh))
    values, args = args_of(one_host, mesh)
    got, kernels = kernels_of(one_host, tmp_path, steps, args)
    assert len(kernels) == 8 * K
    for g, w in zip(got, pw.reference(steps)(*values)):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)


# ---- which calls fuse: on the traced program, no cluster needed ----------------------------

MESH = pw.Mesh.abstract((2, 4), ("d", "m"))


def traced(program, *shapes):
    return program.trace([Aval(s, np.dtype(np.float32)) for s in shapes])


def test_a_run_ends_at_a_numpy_call_a_cost_a_limit_and_a_placement_change():
    def sm(body, in_spec, out_spec, name, **kw):
        return pw.shard_map(body, MESH, in_spec, out_spec, name=name, **kw)

    jax_fn = sm(lambda x: jnp.sin(x), P("d"), P("d"), "sin")
    other = sm(lambda x: jnp.cos(x), P("d"), P("d"), "cos")
    numpy_fn = sm(lambda x: np.sin(x), P("d"), P("d"), "np_sin")
    costly = sm(lambda x: jnp.sin(x), P("d"), P("d"), "costly", cost=1e-3)
    limited = sm(lambda x: jnp.sin(x), P("d"), P("d"), "limited", limit=5)
    gather = sm(lambda x: lax.psum(x, "d"), P("d"), P(), "gather")
    double = sm(lambda x: x * 2, P("m"), P("m"), "double")  # x lies on P("d"): a transfer

    @pw.program
    def prog(x):
        x = other(jax_fn(x))       # fused: 1
        x = numpy_fn(x)            # 2
        x = jax_fn(jax_fn(x))      # fused: 3
        x = costly(x)              # 4
        x = limited(x)             # 5
        x = jax_fn(gather(x))      # 6, 7: gather's P() is not the P("d") jax_fn reads
        return double(x)           # 8

    program = traced(prog, (8, 4))
    fused = fusion.fused(program)
    names = [e.fn.name for e in fused.eqns]
    assert names == ["sin+cos", "np_sin", "sin x2", "costly", "limited", "gather", "sin",
                     "double"]
    assert fused.eqns[0].fn.calls == 2 and fused.eqns[1].fn.calls == 1
    assert len(fused.eqns) == len(program.eqns) - 2


def test_values_read_later_are_outputs_and_the_rest_stay_inside():
    f = pw.shard_map(lambda x: (jnp.sin(x), jnp.cos(x)), MESH, P("d"), (P("d"), P("d")))
    g = pw.shard_map(lambda a, b: jnp.multiply(a, b), MESH, (P("d"), P("d")), P("d"))
    h = pw.shard_map(lambda x: jnp.add(x, 1), MESH, P("d"), P("d"))
    n = pw.shard_map(lambda x: np.tanh(x), MESH, P("d"), P("d"))

    @pw.program
    def prog(x):
        a, b = f(x)       # a, b: read only by g
        c = g(a, b)       # c: read by h and by n after the run
        d = h(c)          # d: returned
        return d, n(c), h(x)  # x: the run's input, read again after it

    program = traced(prog, (8, 4))
    fused = fusion.fused(program)
    first = fused.eqns[0]
    assert first.fn.calls == 3
    assert first.inputs == (program.inputs[0],)
    c, d = program.eqns[1].outputs[0], program.eqns[2].outputs[0]
    assert first.outputs == (c, d)
    assert len(fused.eqns) == 3
    x = rand(8, 4, seed=5)
    for got, want in zip(pw.reference(prog)(x), (np.sin(x) * np.cos(x) + 1,
                                                  np.tanh(np.sin(x) * np.cos(x)), x + 1)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_fused_kernel_may_run_the_default_limit_once_per_call():
    f = pw.shard_map(lambda x: jnp.sin(x), MESH, P("d"), P("d"))

    @pw.program
    def prog(x):
        for _ in range(3):
            x = f(x)
        return x

    fn = fusion.fused(traced(prog, (8, 4))).eqns[0].fn
    assert fn.calls == 3 and fn.limit is None
