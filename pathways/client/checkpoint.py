"""Checkpoints written and read by the hosts: ``client.save`` and ``client.load``.

``save`` writes the metadata of a Zarr v3 group (``pathways.checkpoint_format``) under a
temporary name next to ``path``, asks the host of one device per distinct shard to write that
shard as its chunk, and, once every host has answered, renames the directory to ``path``: the
commit. The array bytes go from each host's memory to the file system, never through the
client; a save that fails or is cut short (a host killed) leaves no ``path`` and no change to
an existing checkpoint. ``load`` reads only metadata here and ships each host a reader for its
devices' parts (``client.generate``), so loading onto another mesh or spec reshards on the hosts.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import uuid

from .. import checkpoint_format as fmt
from .. import protocol
from ..errors import ProgramError, ShardingError
from ..program import sharding, tree
from ..program.mesh import Mesh
from . import fanout
from .array import Array

__all__ = ["load", "reader", "save"]


def save(client, path, values, overwrite: bool = False) -> cf.Future:
    """Start writing ``values`` (an array or a tree of arrays) to ``path``; the future gets
    ``path`` once the checkpoint is committed."""
    path = os.path.abspath(os.fspath(path))
    structure, named = _encode(values)
    for name, a in named:
        if not isinstance(a, Array) or a.client is not client:
            raise ProgramError(f"save: {name} is {type(a).__name__}, not an array of this"
                               " client (put it first)")
        if a._deleted:
            raise ProgramError(f"save: {name} was deleted")
        fmt.check_dtype(a.dtype, f"save: {name}")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"save: {path} exists (pass overwrite=True to replace it)")
    # every writer's host is known (a lost one raises here) before anything is on disk
    writers = [(client._data_address(d), a, name, d, chunk)
               for name, a in named for d, chunk in _writers(a)]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial-{uuid.uuid4().hex[:12]}"
    fmt.create(partial, structure, [_metadata(name, a) for name, a in named])
    arrays = [a for _, a in named]
    writes = [client._request(address, protocol.SaveShard(
        None, a.id, d, os.path.join(partial, name), chunk))
        for address, a, name, d, chunk in writers]
    client._hold(arrays)
    done: cf.Future = cf.Future()

    def finish(error):
        client._unhold(arrays)
        try:
            if error is None:
                _commit(partial, path)
        except Exception as exc:
            error = exc
        if error is not None:
            shutil.rmtree(partial, ignore_errors=True)
            done.set_exception(error)
        else:
            done.set_result(path)

    def settled(error):
        try:  # the commit renames and may remove a replaced checkpoint: not on the loop thread
            client._executor.submit(finish, error)
        except RuntimeError:  # the client closed meanwhile: finish here
            finish(error)

    fanout.when_all(writes, settled)
    return done


def load(client, path, mesh: Mesh, specs=None):
    """The checkpoint at ``path`` as arrays on ``mesh``, split by ``specs`` (a spec or a tree
    prefix of them; default: the spec each array was saved with). Returns at once."""
    path = os.path.abspath(os.fspath(path))
    structure, metas = fmt.read_group(path)
    names = _decode(structure)
    leaves, treedef = tree.flatten(names)
    if specs is None:
        chosen = [fmt.decode_spec(metas[n]["attributes"]["pathways"]["spec"]) for n in leaves]
    else:
        chosen = tree.per_leaf(specs, names, "load specs")
    out = []
    for name, spec in zip(leaves, chosen):
        meta = metas[name]
        try:
            out.append(client.generate(reader(path, name),
                                       meta["shape"], meta["data_type"], mesh,
                                       sharding.P(*spec) if spec is not None else None))
        except ShardingError as exc:
            raise ShardingError(f"load {name}: {exc}") from None
    return tree.unflatten(treedef, out)


def reader(path: str, name: str) -> fmt.ChunkReader:
    """What a host runs to read its devices' parts of array ``name`` of a checkpoint."""
    return fmt.ChunkReader(os.path.join(path, name))


def _metadata(name, a: Array) -> tuple:
    m = a.mesh
    block = sharding.shard_shape(a.shape, m.axis_sizes, m.axis_names, a.spec)
    attributes = {"spec": fmt.encode_spec(a.spec),
                  "mesh": {"shape": list(m.axis_sizes), "axes": list(m.axis_names)}}
    return name, a.shape, a.dtype, block, attributes


def _writers(a: Array):
    """(device, chunk index) for each distinct shard of ``a``: its first holder writes it."""
    m = a.mesh
    if 0 in a.shape:
        return []
    block = sharding.shard_shape(a.shape, m.axis_sizes, m.axis_names, a.spec)
    seen, out = set(), []
    for i, d in enumerate(m.ids):
        where = sharding.device_slices(a.shape, m.axis_sizes, m.axis_names, a.spec, i)
        chunk = tuple(s.start // b for s, b in zip(where, block))
        if chunk not in seen:
            seen.add(chunk)
            out.append((d, chunk))
    return out


def _commit(partial: str, path: str) -> None:
    """Make the written checkpoint visible at ``path`` with a rename (an existing one is moved
    aside first and removed after)."""
    if not os.path.exists(path):
        os.rename(partial, path)
        return
    old = f"{path}.replaced-{uuid.uuid4().hex[:12]}"
    os.rename(path, old)
    os.rename(partial, path)
    shutil.rmtree(old, ignore_errors=True)


# ---- a tree's structure as JSON, each leaf named after its path ------------------------------

def _encode(values) -> tuple[dict, list]:
    named: list = []

    def walk(x, at):
        if not tree.is_node(x):
            name = ".".join(at) or "value"
            named.append((name, x))
            return {"array": name}
        if type(x) is dict:
            pairs = []
            for k in sorted(x):
                if not isinstance(k, (str, int)) or isinstance(k, bool) or "/" in str(k) \
                        or "." in str(k) or str(k).startswith("__") or str(k) == "":
                    raise ProgramError(f"save: dict key {k!r} cannot name a Zarr array (use"
                                       " str or int keys without '/', '.' or a leading '__')")
                pairs.append([k, walk(x[k], [*at, str(k)])])
            return {"dict": pairs}
        if type(x) in (tuple, list):
            return {type(x).__name__: [walk(c, [*at, str(i)]) for i, c in enumerate(x)]}
        raise ProgramError(f"save: {type(x).__name__} in the tree; a checkpoint holds dicts,"
                           " tuples and lists of arrays")

    structure = walk(values, [])
    return structure, named


def _decode(node):
    """The tree ``_encode`` described, with each array's name as its leaf."""
    if "array" in node:
        return node["array"]
    if "dict" in node:
        return {k: _decode(v) for k, v in node["dict"]}
    if "tuple" in node:
        return tuple(_decode(c) for c in node["tuple"])
    return [_decode(c) for c in node["list"]]
