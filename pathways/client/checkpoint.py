"""Checkpoints written and read by the hosts: ``client.save`` and ``client.load``.

``save`` writes the metadata of a Zarr v3 group (``pathways.checkpoint_format``) under a
temporary name next to ``path``, asks the host of one device per distinct shard to write that
shard as its chunk, and, once every host has answered, renames the directory to ``path``: the
commit. The array bytes go from each host's memory to the file system, never through the
client; a save that fails or is cut short (a host killed) leaves no ``path`` and no change to
an existing checkpoint. The commit itself enforces ``overwrite``: without it, a rename that
fails if ``path`` exists (Linux's ``renameat2`` with ``RENAME_NOREPLACE``), so of two saves
racing to one path the second fails with FileExistsError; with it, an atomic exchange
(``RENAME_EXCHANGE``) so ``path`` is never missing and racing saves each commit whole, the last
one winning, and the replaced checkpoint is removed only after. ``load`` validates all the
metadata here (``checkpoint_metadata.open_checkpoint``: a damaged checkpoint raises
CheckpointError before anything is sent to a host) and ships each host a reader for its
devices' parts (``client.generate``), which checks every chunk it reads; loading onto another
mesh or spec reshards on the hosts.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import errno
import functools
import os
import shutil
import sys
import uuid
from dataclasses import replace

from .. import checkpoint_format as fmt
from .. import checkpoint_metadata as meta
from .. import protocol
from ..errors import CheckpointError, ProgramError, ShardingError
from ..program import sharding, tree
from ..program.mesh import Mesh
from . import fanout
from .array import Array

__all__ = ["load", "reader", "save"]


def save(client, path, values, overwrite: bool = False, held: bool = False) -> cf.Future:
    """Start writing ``values`` (an array or a tree of arrays) to ``path``; the future gets
    ``path`` once the checkpoint is committed. ``held``: the caller holds the arrays since it
    chose them (a suspension), so one deleted since is still there and written."""
    path = os.path.abspath(os.fspath(path))
    structure, named = _encode(values)
    for name, a in named:
        if not isinstance(a, Array) or a.client is not client:
            raise ProgramError(f"save: {name} is {type(a).__name__}, not an array of this"
                               " client (put it first)")
    arrays = [a for _, a in named]
    client.ledger.hold(arrays)  # first: an array deleted from now on is freed after its write
    try:
        partial, writes = _start(client, path, structure, named, overwrite, held)
    except BaseException:
        client.ledger.unhold(arrays)
        raise
    done = client.session.future(f"the save of {path}")

    def finish(error):
        client.ledger.unhold(arrays)
        try:
            if error is None:
                _commit(partial, path, overwrite)
        except Exception as exc:
            error = exc
        if error is not None:
            shutil.rmtree(partial, ignore_errors=True)
            done.set_exception(error)
        else:
            done.set_result(path)

    def settled(error):
        try:  # the commit renames and may remove a replaced checkpoint: not on the loop thread
            client.executor.submit(finish, error)
        except RuntimeError:  # the client closed meanwhile: finish here
            finish(error)

    fanout.when_all(writes, settled)
    return done


def _start(client, path, structure, named, overwrite, held) -> tuple[str, list]:
    """Check the arrays, write the metadata under a temporary name and ask the hosts to write
    the chunks: the temporary directory and the hosts' answers to come."""
    for name, a in named:
        if a.is_deleted() and not held:
            raise ProgramError(f"save: {name} was deleted")
        fmt.check_dtype(a.aval.dtype, f"save: {name}")
        fmt.check_name(name, "save")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"save: {path} exists (pass overwrite=True to replace it)")
    # every writer's host is known (a lost one raises here) before anything is on disk
    writers = [(client.cluster.data_address(d), a, name, d, chunk)
               for name, a in named for d, chunk in _writers(a)]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial-{client.session.token()}"  # in the hosts' messages
    try:
        fmt.create(partial, structure, [_metadata(name, a) for name, a in named])
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return partial, [client.session.request(address, protocol.SaveShard(
        None, a.id, d, os.path.join(partial, name), chunk))
        for address, a, name, d, chunk in writers]


def load(client, path, mesh: Mesh, specs=None, timeout: float | None = None):
    """The checkpoint at ``path`` as arrays on ``mesh``, split by ``specs`` (a spec or a tree
    prefix of them; default: the spec each array was saved with); each shard waits at most
    ``timeout`` seconds for HBM room (as in ``client.generate``; None: its default). Returns
    at once, once the metadata is validated (CheckpointError if it is damaged; a damaged
    chunk fails the array)."""
    path = os.path.abspath(os.fspath(path))
    ckpt = meta.open_checkpoint(path)
    leaves, treedef = tree.flatten(ckpt.names)
    if specs is None:
        chosen = [ckpt.arrays[n].spec for n in leaves]
    else:
        chosen = tree.per_leaf(specs, ckpt.names, "load specs")
    out = []
    for name, spec in zip(leaves, chosen):
        info = ckpt.arrays[name]
        try:
            array = client.generate(fmt.ChunkReader(path, name, info.layout), info.shape,
                                    info.dtype, mesh,
                                    sharding.P(*spec) if spec is not None else None, timeout)
        except ShardingError as exc:
            raise ShardingError(f"load {name}: {exc}") from None
        if info.key is not None:  # saved from keys: keys again
            array.aval = replace(array.aval, key=info.key)
        out.append(array)
    return tree.unflatten(treedef, out)


def reader(path: str, name: str) -> fmt.ChunkReader:
    """What a host runs to read its devices' parts of array ``name`` of a checkpoint (its
    metadata validated here)."""
    path = os.path.abspath(path)
    return fmt.ChunkReader(path, name, meta.open_array(path, name).layout)


def _metadata(name, a: Array) -> tuple:
    m, aval = a.mesh, a.aval  # (a key array: its key data, and its impl's name)
    block = sharding.shard_shape(aval.shape, m.axis_sizes, m.axis_names, a.spec)
    attributes = {"spec": fmt.encode_spec(a.spec),
                  "mesh": {"shape": list(m.axis_sizes), "axes": list(m.axis_names)}}
    if aval.key is not None:
        attributes["prng_key"] = aval.key
    return name, aval.shape, aval.dtype, block, attributes


def _writers(a: Array):
    """(device, chunk index) for each distinct shard of ``a``: its first holder writes it."""
    m, shape = a.mesh, a.aval.shape
    if 0 in shape:
        return []
    block = sharding.shard_shape(shape, m.axis_sizes, m.axis_names, a.spec)
    seen, out = set(), []
    for i, d in enumerate(m.ids):
        where = sharding.device_slices(shape, m.axis_sizes, m.axis_names, a.spec, i)
        chunk = tuple(s.start // b for s, b in zip(where, block))
        if chunk not in seen:
            seen.add(chunk)
            out.append((d, chunk))
    return out


def _commit(partial: str, path: str, overwrite: bool) -> None:
    """Make the written checkpoint visible at ``path`` with one rename that never replaces
    (``overwrite`` False) or that exchanges it with the one there, removed after."""
    if not overwrite:
        try:
            _rename_noreplace(partial, path)
        except FileExistsError:
            raise FileExistsError(f"save: {path} exists (another save committed it meanwhile;"
                                  " pass overwrite=True to replace it)") from None
        return
    for _ in range(COMMIT_ATTEMPTS):
        try:
            _rename_noreplace(partial, path)
            return
        except FileExistsError:
            pass
        try:
            _exchange(partial, path)
        except (FileNotFoundError, FileExistsError):
            continue  # another save moved ``path`` meanwhile: look again
        _sync_dir(os.path.dirname(path))  # the new one is durably in place before
        _remove(partial)  # the replaced one (now under the temporary name) goes
        return
    raise CheckpointError(f"save: could not commit {path}: other saves kept replacing it"
                          f" ({COMMIT_ATTEMPTS} attempts)")


COMMIT_ATTEMPTS = 100
_AT_FDCWD, _RENAME_NOREPLACE, _RENAME_EXCHANGE = -100, 1, 2


@functools.cache
def _libc_renameat2():
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_uint]
        fn.restype = ctypes.c_int
    return fn


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """renameat2(2) with ``flags``; False where the system or file system has no such flag.
    Raises the OSError of its errno (FileExistsError, FileNotFoundError...)."""
    fn = _libc_renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), src, None, dst)


def _rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, or raise FileExistsError if ``dst`` exists. Without
    renameat2: a check, then os.rename, which fails onto a non-empty directory (a checkpoint
    never is empty) but would replace an empty one created in between."""
    if _renameat2(src, dst, _RENAME_NOREPLACE):
        return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst) from None
        raise


def _exchange(src: str, dst: str) -> None:
    """Swap ``src`` and ``dst`` atomically (FileNotFoundError if ``dst`` is gone). Without
    renameat2: ``dst`` moved aside, ``src`` renamed in (``dst`` briefly missing), the old one
    moved to ``src``; FileExistsError if another save committed in between."""
    if _renameat2(src, dst, _RENAME_EXCHANGE):
        return
    aside = f"{dst}.replaced-{uuid.uuid4().hex[:12]}"
    os.rename(dst, aside)
    try:
        _rename_noreplace(src, dst)
    except FileExistsError:
        _remove(aside)  # replaced by the save that committed in between
        raise
    os.rename(aside, src)


def _sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a directory; the rename stands
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


# ---- a tree's structure as JSON, each leaf named after its path ------------------------------

def _encode(values) -> tuple[dict, list]:
    named: list = []

    def walk(x, at):
        if x is None:  # a node without arrays, as in JAX's trees: loads as None
            return {"none": None}
        if not tree.is_node(x):
            name = fmt.leaf_name(at)
            named.append((name, x))
            return {"array": name}
        if type(x) is dict:
            pairs = []
            for k in sorted(x):
                if not fmt.valid_key(k):
                    raise ProgramError(f"save: dict key {k!r} cannot name a Zarr array (use"
                                       " str or int keys without '/', '.' or a leading '__')")
                pairs.append([k, walk(x[k], [*at, k])])
            return {"dict": pairs}
        if type(x) in (tuple, list):
            return {type(x).__name__: [walk(c, [*at, i]) for i, c in enumerate(x)]}
        raise ProgramError(f"save: {type(x).__name__} in the tree; a checkpoint holds dicts,"
                           " tuples and lists of arrays")

    try:
        structure = walk(values, [])
    finally:
        del walk  # a recursive closure is a cycle: it would keep the arrays until a GC
    return structure, named
