"""One dtype rule (issue 46 item 2): a body runs with JAX's types whenever JAX can trace it,
even one that never mentions jax (``lambda x: x``, ``x.argmax()``), and JAX checks its
out_specs when it is traced, before anything runs, raising JAX's class (ValueError). A numpy
body JAX cannot trace keeps numpy's types (and its replication is checked at run time)."""

import numpy as np
import pytest

import pathways as pw
from pathways import P

jax = pytest.importorskip("jax")
from jax_cases import plain_jax, same_as_jax  # noqa: E402

INTS = np.arange(8)  # int64: JAX (x64 off) computes in int32
FLOATS = np.linspace(0, 1, 8)  # float64: JAX computes in float32


def test_a_body_that_never_mentions_jax_has_jax_dtypes(client):
    # were int64 and float64: run as numpy
    same_as_jax(client, lambda x: x, P("i"), P("i"), INTS)
    same_as_jax(client, lambda x: x.argmax(keepdims=True), P("i"), P("i"), FLOATS)
    same_as_jax(client, lambda x: x * 1.5, P("i"), P("i"), INTS)
    same_as_jax(client, lambda x, y: (x + y, (x > y).sum(keepdims=True)), P("i"), P("i"),
                INTS, FLOATS)


def test_pw_collectives_in_a_numpy_body_have_jax_dtypes(client):
    same_as_jax(client, lambda x: pw.psum(x.sum(keepdims=True), "i"), P("i"), P(), INTS)


def _wrong_out_specs(client, body, x):
    """Every way of calling ``body`` with out_specs P() on a sharded ``x`` fails at the call,
    with JAX's ValueError, as plain JAX does."""
    with pytest.raises(ValueError, match="out_specs"):
        plain_jax(body, (4,), ("i",), P("i"), P(), x)
    mesh = client.mesh((4,), ("i",))
    fn = pw.shard_map(body, mesh, P("i"), P())
    arrays = [client.put(x, mesh, P("i"))]
    for call in (lambda: fn(*arrays), lambda: pw.program(lambda a: fn(a))(*arrays),
                 lambda: pw.reference(fn)(x)):
        with pytest.raises(ValueError, match="replicated") as info:
            call()  # raised by the call itself: nothing ran (no RemoteError from a host)
        assert isinstance(info.value, pw.ProgramError)


def test_a_wrong_out_specs_is_refused_at_trace_time_with_jax_error_class(client):
    _wrong_out_specs(client, lambda x: x, INTS)  # was a RemoteError from the run


def test_a_wrong_out_specs_is_refused_even_when_the_values_happen_to_be_equal(client):
    _wrong_out_specs(client, lambda x: x * 0, FLOATS)  # was accepted: every device had 0s


def test_check_rep_false_keeps_one_devices_value_as_jax_does(client):
    mesh = client.mesh((4,), ("i",))
    fn = pw.shard_map(lambda x: x, mesh, P("i"), P(), check_rep=False)
    devices = np.array(jax.devices()[:4])
    want = jax.jit(jax.shard_map(lambda x: x, mesh=jax.sharding.Mesh(devices, ("i",)),
                                 in_specs=jax.P("i"), out_specs=jax.P(),
                                 check_vma=False))(INTS)
    got = fn(client.put(INTS, mesh, P("i"))).result()
    assert got.dtype == want.dtype and np.array_equal(got, want)


def numpy_only(b):
    out = np.empty_like(b)  # JAX cannot trace this: a numpy body
    out[...] = b * 2
    return out


def test_a_body_jax_cannot_trace_runs_as_numpy_with_numpy_dtypes(client):
    mesh = client.mesh((4,), ("i",))
    fn = pw.shard_map(numpy_only, mesh, P("i"), P("i"))
    for x in (INTS, FLOATS):
        got = fn(client.put(x, mesh, P("i"))).result()
        assert got.dtype == x.dtype and np.array_equal(got, x * 2)
        assert pw.reference(fn)(x).dtype == x.dtype
    assert fn.jax is None


def test_a_numpy_body_jax_cannot_trace_is_still_checked_at_run_time(client):
    mesh = client.mesh((4,), ("i",))
    fn = pw.shard_map(numpy_only, mesh, P("i"), P())
    with pytest.raises(pw.RemoteError, match="differs across devices"):
        fn(client.put(FLOATS, mesh, P("i"))).result()
