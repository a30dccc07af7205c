"""Putting values on meshes: ``client.put`` and ``client.device_put`` once their arguments are
read. A value, or a tree of them (``pathways.client.pytrees``), gets one mesh and spec per
leaf from a tree prefix of specs or shardings; every leaf is checked (its spec, that its shard
fits a device's HBM, that an object array pickles) before any is sent, and each is then
copied, split and sent to its devices' hosts as a new ``Array``.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import pickle
import sys

import numpy as np

from ..errors import ProgramError, ShardingError
from ..program import prng, sharding
from ..program.compiled import Aval
from ..program.mesh import Mesh
from . import pytrees
from .array import Array, NamedSharding

__all__ = ["device_put", "put"]


def put(client, value, mesh, spec=None):
    """``client.put(value, mesh, spec)``: a ``pw.NamedSharding`` may stand for the mesh and
    the spec."""
    if isinstance(mesh, NamedSharding) or _is_jax_sharding(mesh):
        if spec is not None:
            raise ShardingError("put takes a mesh and a spec, or a NamedSharding alone;"
                                f" got {mesh!r} and the spec {spec!r}")
        return device_put(client, value, mesh)
    if not isinstance(mesh, Mesh):
        raise ProgramError(f"put needs a mesh from client.mesh(...) or a pw.NamedSharding,"
                           f" got {mesh!r} ({type(mesh).__name__})")
    return _place(client, value, spec, _is_spec, lambda s, path: (mesh, s), "put")


def device_put(client, x, shardings):
    """``client.device_put(x, shardings)``: a pw.Array of the client placed so already is
    returned as it is."""
    def where(item, path):
        if isinstance(item, NamedSharding):
            return item.mesh, item.spec
        if _on_our_mesh(item):  # JAX's NamedSharding of a pathways mesh: the same
            return item.mesh, NamedSharding(item.mesh, item.spec).spec
        if _is_jax_sharding(item):
            raise ShardingError(
                f"device_put: {pytrees.where(path)} would go to {item!r}, a JAX sharding"
                " of JAX's own devices; give NamedSharding(mesh, spec) (JAX's or"
                " pw's) with a mesh from client.mesh(...)")
        raise ShardingError(f"device_put: {pytrees.where(path)} would go to {item!r};"
                            " give a pw.NamedSharding(mesh, spec) (pathways has no"
                            " default device)")

    return _place(client, x, shardings,
                  lambda s: s is None or isinstance(s, NamedSharding) or _on_our_mesh(s),
                  where, "device_put", keep_placed=True)


def _is_spec(s) -> bool:
    return s is None or isinstance(s, sharding.P) or sharding.is_jax_spec(s)


def _place(client, value, items, is_item, where, what: str, keep_placed: bool = False):
    """``value``'s tree with each leaf put where its item of the tree prefix ``items`` says
    (``where(item, path)``: mesh and spec); every leaf is checked before any is sent.
    ``keep_placed``: a pw.Array of this client placed so already stays as it is."""
    leaves, paths, treedef = pytrees.flatten(value)
    per_leaf = pytrees.per_leaf(items, value, is_item, what)
    places = [where(item, path) for item, path in zip(per_leaf, paths)]
    client.suspensions.check([mesh for mesh, _ in places])
    plans = []
    for leaf, path, (mesh, spec) in zip(leaves, paths, places):
        try:
            if keep_placed and _placed(client, leaf, mesh, spec):
                plans.append(leaf)
                continue
            key = None
            if prng.is_key(leaf):  # kept as its key data (``prng``)
                array, key = prng.data_of(leaf)
            else:
                array = pytrees.numeric(leaf, path, what)  # no copy yet: a huge view must
            aval = Aval(array.shape, array.dtype, key)
            spec = sharding.spec_for(aval, spec, mesh.axis_names)  # fail first
            block = sharding.shard_shape(array.shape, mesh.axis_sizes, mesh.axis_names, spec)
        except ShardingError as exc:
            raise pytrees.at(path, exc) from None
        client.shards.check_fits(math.prod(block) * array.dtype.itemsize, mesh, what)
        if array.dtype.hasobject:
            _check_picklable(array)
        plans.append((array, mesh, spec, aval))
    return pytrees.unflatten(treedef, [_send(client, p) for p in plans])


def _placed(client, leaf, mesh: Mesh, spec) -> bool:
    """Whether ``leaf`` is a live array of ``client`` on ``mesh`` with ``spec``."""
    if not isinstance(leaf, Array) or leaf.client is not client or leaf.is_deleted():
        return False
    return leaf.mesh == mesh and leaf.spec == sharding.spec_for(leaf.aval, spec,
                                                                mesh.axis_names)


def _send(client, plan) -> Array:
    """The array ``_place`` planned: a copy of the value, split and sent to the hosts."""
    if isinstance(plan, Array):
        return plan
    value, mesh, spec, aval = plan
    value = np.array(value, copy=True)
    shards = sharding.split(value, mesh.axis_sizes, mesh.axis_names, spec)
    array_id = client.shards.new_id()
    client.shards.put(array_id, mesh, shards)
    done: cf.Future = cf.Future()
    done.set_result(None)
    return Array(client, array_id, aval, mesh, spec, done, value=value)


def _on_our_mesh(obj) -> bool:
    """Whether ``obj`` is one of JAX's shardings over a pathways mesh
    (``jax.sharding.NamedSharding(mesh, spec)``: ``Mesh`` offers what it reads)."""
    return _is_jax_sharding(obj) and isinstance(getattr(obj, "mesh", None), Mesh)


def _is_jax_sharding(obj) -> bool:
    """Whether ``obj`` is one of JAX's shardings (False, importing nothing, if JAX is not
    loaded)."""
    jax_sharding = getattr(getattr(sys.modules.get("jax"), "sharding", None), "Sharding", None)
    return jax_sharding is not None and isinstance(obj, jax_sharding)


def _check_picklable(value: np.ndarray) -> None:
    """An object array travels pickled: one that cannot be must fail at ``put``, not later
    on the client's loop thread with its consumers waiting forever."""
    try:
        pickle.dumps(value, protocol=5)
    except Exception as exc:
        raise ProgramError(f"put: this object array cannot be sent to the hosts (it does not"
                           f" pickle: {exc!r}); put numeric arrays, or objects that pickle")\
            from None
