"""JAX's typed PRNG keys (``jax.random.key``) go where arrays go (issue 46 item 6): put and
fetched back as keys, given to bodies as keys, returned by bodies, saved and loaded; shape
and dtype are the keys' own, as JAX says them. Each body is checked against jax.shard_map."""

import numpy as np
import pytest

import pathways as pw
from pathways import P

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax_cases import across_hosts, plain_jax, same_as_jax  # noqa: E402

X = np.arange(8, dtype=np.float32)
KEYS = jax.random.split(jax.random.key(7), 4)


def same_keys(got, want) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))


def test_a_key_array_is_put_and_fetched_as_keys(client):
    mesh = across_hosts(client, (4,), ("i",))
    for keys, spec in ((jax.random.key(0), P()), (KEYS, P("i")),
                       (jax.random.split(jax.random.key(1, impl="rbg"), 8), P("i"))):
        a = client.put(keys, mesh, spec)
        assert (a.shape, a.dtype, a.ndim) == (keys.shape, keys.dtype, keys.ndim)
        assert "key<" in repr(a)
        same_keys(a.result(), keys)
        with pytest.raises(TypeError, match="array of PRNG keys, which numpy cannot hold"):
            np.asarray(a)


def test_a_body_gets_keys_replicated_or_sharded(client):
    def noise(key, x):
        key = jax.random.fold_in(key, jax.lax.axis_index("i"))
        return x + jax.random.normal(key, x.shape)

    same_as_jax(client, noise, (P(), P("i")), P("i"), jax.random.key(3), X)
    same_as_jax(client, lambda k: jax.random.uniform(k[0], (2,)), P("i"), P("i"), KEYS)


def test_a_key_crosses_a_collective_inside_a_body(client):
    # the key lives on across the psum, where the body is cut in two compiled segments
    def body(key, x):
        key = jax.random.fold_in(key, jax.lax.axis_index("i"))
        total = jax.lax.psum(jnp.sum(x), "i")
        return total + jax.random.normal(key, x.shape)

    same_as_jax(client, body, (P(), P("i")), P("i"), jax.random.key(5), X)


@pytest.mark.parametrize("program", [False, True])
def test_a_body_returns_keys(client, program):
    mesh = across_hosts(client, (4,), ("i",))
    split = pw.shard_map(lambda k: jax.random.split(k[0], 2), mesh, P("i"), P("i"))
    draw = pw.shard_map(lambda k: jax.random.normal(k[0], (3,)), mesh, P("i"), P("i"))
    fn = pw.program(lambda k: (split(k), draw(split(k)))) if program else split
    keys = client.put(KEYS, mesh, P("i"))
    got = fn(keys)
    want = plain_jax(lambda k: jax.random.split(k[0], 2), (4,), ("i",), P("i"), P("i"), KEYS)
    if program:
        got, drawn = got
        np.testing.assert_allclose(drawn.result(), plain_jax(
            lambda k: jax.random.normal(k[0], (3,)), (4,), ("i",), P("i"), P("i"), want),
            rtol=1e-6)
    assert (got.shape, got.dtype) == ((8,), KEYS.dtype)
    same_keys(got.result(), want)
    same_keys(pw.reference(split)(KEYS), want)
    same_keys(pw.shard_map(lambda k: k, mesh, P("i"), P("i"))(keys).result(), KEYS)


def test_a_spec_cannot_split_a_keys_data(client):
    mesh = across_hosts(client, (4,), ("i",))
    keys = jax.random.split(jax.random.key(0), 2)
    with pytest.raises(pw.ShardingError, match="has 2 entries but the array has only 1"):
        client.put(keys, mesh, P(None, "i"))
    with pytest.raises(pw.ShardingError, match="has 2 entries but the array has only 1"):
        pw.shard_map(lambda k: k, mesh, P(), P(None, "i"))(client.put(keys, mesh, P()))


def test_keys_are_saved_and_loaded_as_keys(client, tmp_path):
    mesh = across_hosts(client, (4,), ("i",))
    path = str(tmp_path / "ckpt")
    client.save(path, {"keys": client.put(KEYS, mesh, P("i"))}).result(60)
    back = client.load(path, mesh)["keys"]
    assert (back.shape, back.dtype) == (KEYS.shape, KEYS.dtype)
    same_keys(back.result(), KEYS)
