"""in_specs and out_specs are trees with JAX's prefix semantics (issue 46 item 1): one spec
stands for every leaf under it, every way a function is called, or a ProgramError names the
argument or output that does not fit. Each case is checked against jax.shard_map."""

import numpy as np
import pytest

import pathways as pw
from pathways import P

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax_cases import across_hosts, plain_jax, same_as_jax  # noqa: E402

X = np.arange(8, dtype=np.float32)


def test_one_out_spec_covers_every_output_of_a_numpy_body(client):
    # was: the tuple stacked into one array (and only the first output inside a program)
    same_as_jax(client, lambda a: (a * 2, a + 1), P("i"), P("i"), X)


def test_one_out_spec_covers_every_output_of_a_jax_body(client):
    # was: KeyError 2 called directly; only the first output in @pw.program and reference
    same_as_jax(client, lambda a: (jnp.sin(a), a + 1), P("i"), P("i"), X)


def test_value_and_grad_keeps_its_gradient(client):
    def step(w):
        return jax.value_and_grad(lambda w: jax.lax.psum(jnp.sum(w ** 2), "i"))(w)

    same_as_jax(client, step, P("i"), (P(), P("i")), X)


def test_a_spec_prefix_of_a_dict_of_outputs(client):
    def step(w):
        loss, grad = jax.value_and_grad(lambda w: jax.lax.psum(jnp.sum(w ** 2), "i"))(w)
        return {"loss": loss, "grads": {"w": grad, "b": grad[:1]}}

    same_as_jax(client, step, P("i"), {"loss": P(), "grads": P("i")}, X)


def test_one_in_spec_covers_every_argument_of_a_jax_body(client):
    # was: "pytree structure error" from JAX for a body of two arguments
    same_as_jax(client, lambda a, b: jnp.sin(a) + b, P("i"), P("i"), X, X + 1)


def test_a_spec_prefix_of_a_tree_argument(client):
    same_as_jax(client, lambda d: d["a"] * d["b"][0], ({"a": P("i"), "b": P("i")},), P("i"),
                {"a": X, "b": (X + 1,)})


def test_a_body_returning_a_list_returns_a_list(client):
    same_as_jax(client, lambda a: [a, a * 2], P("i"), P("i"), X)
    same_as_jax(client, lambda a: [jnp.cos(a), a], P("i"), [P("i"), P("i")], X)


def test_a_program_returning_a_list_returns_a_list(client):
    mesh = across_hosts(client, (4,), ("i",))
    double = pw.shard_map(lambda a: a * 2, mesh, P("i"), P("i"))
    both = pw.program(lambda a: [a, double(a)])
    got = both(client.put(X, mesh, P("i")))
    assert type(got) is list and len(got) == 2
    assert type(pw.reference(both)(X)) is list


def _mismatch(client, body, in_specs, out_specs, *args):
    mesh = across_hosts(client, (4,), ("i",))
    fn = pw.shard_map(body, mesh, in_specs, out_specs)
    arrays = [client.put(a, mesh, P("i")) for a in args]
    errors = []
    for call in (lambda: fn(*arrays), lambda: pw.program(lambda *a: fn(*a))(*arrays),
                 lambda: pw.reference(fn)(*args)):
        with pytest.raises(pw.ProgramError) as info:
            call()
        errors.append(str(info.value))
    return errors


def test_an_out_spec_tree_that_does_not_fit_names_the_output(client):
    for error in _mismatch(client, lambda a: {"w": a, "b": (a, a)}, P("i"),
                           {"w": P("i"), "b": (P("i"),) * 3}, X):
        assert "out_specs" in error and "output['b']" in error and "tuple of 3" in error


def test_in_specs_that_do_not_fit_name_the_argument(client):
    for error in _mismatch(client, lambda a, b: a + b, (P("i"),) * 3, P("i"), X, X):
        assert "in_specs has 3 entries for 2 arguments" in error
    mesh = across_hosts(client, (4,), ("i",))
    fn = pw.shard_map(lambda d: d["a"], mesh, ({"a": P("i"), "c": P("i")},), P("i"))
    with pytest.raises(pw.ProgramError, match=r"in_specs.* where argument 0 is a dict"):
        pw.reference(fn)({"a": X, "b": X})


def test_one_out_spec_over_several_jax_outputs_is_checked_when_traced(client):
    """JAX checks the replication of every output under a P() prefix when it traces the body
    and raises ValueError; so does pathways, every way, before anything runs (ProgramError
    is a ValueError), and the error names the body, not a wrapper."""
    def body(a):
        return jnp.sin(a), jax.lax.psum(a, "i")

    with pytest.raises(ValueError):
        plain_jax(body, (4,), ("i",), P("i"), P(), X)
    for error in _mismatch(client, body, P("i"), P(), X):
        assert "out_specs" in error and "'body'" in error
