"""One case of JAX's meaning: a body run by ``jax.shard_map`` on this process's CPU devices
(conftest sets XLA_FLAGS) and by ``pw.shard_map`` called directly, inside ``@pw.program`` and
under ``pw.reference``: the same tree (its types too), values and dtypes every way."""

import numpy as np

import pathways as pw
from pathways.testing import jax_specs

import jax  # noqa: I001 - after pathways: the tests that import this skip without it
from jax.sharding import Mesh as JaxMesh


def across_hosts(client, shape, names):
    """A mesh of ``shape`` spread evenly over the session cluster's two hosts when it splits
    so (meshes are packed onto whole hosts by default): the cases then run collectives
    between hosts as well as inside one."""
    return client.mesh(shape, names, hosts=2 if np.prod(shape) % 2 == 0 else None)


def plain_jax(body, shape, names, in_specs, out_specs, *args):
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    mapped = jax.shard_map(body, mesh=JaxMesh(devices, names), in_specs=jax_specs(in_specs),
                           out_specs=jax_specs(out_specs))
    return jax.jit(mapped)(*args)


def results(tree):
    """``tree`` with each pw.Array's value."""
    return jax.tree.map(lambda a: a.result(), tree, is_leaf=lambda a: isinstance(a, pw.Array))


def assert_same(got, want, how):
    assert jax.tree.structure(got) == jax.tree.structure(want), how
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        w = np.asarray(w)
        assert (g.shape, g.dtype) == (w.shape, w.dtype), how
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=how)


def put(client, mesh, args, in_specs):
    """``args`` put on ``mesh``, each leaf by its spec from the prefix ``in_specs``."""
    specs = in_specs if type(in_specs) is tuple else (in_specs,) * len(args)
    return [client.put(a, mesh, s) for a, s in zip(args, specs)]


def same_as_jax(client, body, in_specs, out_specs, *args, shape=(4,), names=("i",)):
    """Run ``body`` every way and compare each with JAX; the function, for more checks."""
    want = plain_jax(body, shape, names, in_specs, out_specs, *args)
    mesh = across_hosts(client, shape, names)
    fn = pw.shard_map(body, mesh, in_specs, out_specs)
    arrays = put(client, mesh, args, in_specs)
    assert_same(results(fn(*arrays)), want, "called directly")
    assert_same(results(pw.program(lambda *a: fn(*a))(*arrays)), want, "inside @pw.program")
    assert_same(pw.reference(fn)(*args), want, "pw.reference")
    return fn
