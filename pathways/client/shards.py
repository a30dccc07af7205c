"""An array's shards between a client and the hosts: put, made on the hosts, fetched, freed.

Every shard goes straight to or from the host of its device (its data address, from the
``ClusterView``), never through the coordinator, except a run's small results
(``lowering.lower.SMALL_RESULT``), which come with the run's end (``RunDone``) and are
``adopt``ed, so fetching them costs no request. Array ids are the client's id and a count
(what the hosts' object stores key shards by); shards are tagged with the client as owner, so
the hosts free everything of a client that closes or is lost.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools

import numpy as np

from plaque.shipping import ship

from .. import protocol
from ..dtypes import shippable, unwrap, wire_name
from ..errors import DeviceOutOfMemory, PathwaysError
from ..program import sharding
from . import fanout

__all__ = ["Shards"]


class Shards:
    """The shard traffic of client ``client_id`` through ``session``, to the devices of
    ``cluster`` (a ``ClusterView``); ``suspensions`` refuses a fetch from a suspended slice.
    A shard put waits at most ``hbm_wait`` seconds on its host for HBM room (None: without
    bound), then its array fails with ``DeviceOutOfMemory``."""

    def __init__(self, client_id, session, cluster, suspensions, hbm_wait: float | None = None):
        self._client_id, self._hbm_wait = client_id, hbm_wait
        self._session, self._cluster, self._suspensions = session, cluster, suspensions
        self._ids = itertools.count()

    def new_id(self) -> tuple:
        """The id of a new array of this client."""
        return (self._client_id, next(self._ids))

    def check_fits(self, nbytes: int, mesh, what: str) -> None:
        """A shard larger than a device's whole HBM can never be stored: say so at once."""
        for d in mesh.ids:
            hbm = self._cluster.hbm(d)
            if hbm is not None and nbytes > hbm:
                raise DeviceOutOfMemory(f"{what}: a shard of {nbytes} bytes is larger than the"
                                        f" whole HBM of device {d} ({hbm} bytes)")

    def put(self, array_id, mesh, shards) -> None:
        """Send each of ``shards`` to its device of ``mesh``, as array ``array_id``."""
        for d, shard in zip(mesh.ids, shards):
            self._session.send(self._cluster.data_address(d), protocol.PutShard(
                array_id, d, shippable(shard), (self._client_id, None), self._hbm_wait))

    def generate(self, array_id, fn, shape, dtype, mesh, spec,
                 timeout: float | None = None) -> cf.Future:
        """Have the hosts of ``mesh`` make the shards of ``array_id`` with ``fn``, each
        waiting at most ``timeout`` seconds for HBM room (None: without bound); the future
        resolves when all have, or fails with the first error."""
        block = sharding.shard_shape(shape, mesh.axis_sizes, mesh.axis_names, spec)
        self.check_fits(int(np.prod(block)) * dtype.itemsize, mesh, "generate")
        blob = ship(fn, [fn])
        futures = []
        for i, d in enumerate(mesh.ids):
            slices = sharding.device_slices(shape, mesh.axis_sizes, mesh.axis_names, spec, i)
            futures.append(self._session.request(self._cluster.data_address(d), protocol.Generate(
                None, array_id, d, blob, slices, block, wire_name(dtype), (self._client_id, None),
                timeout)))
        return fanout.all_done(futures, self._session.future)

    def fetch(self, array, timeout) -> np.ndarray:
        """The global value of ``array``: one shard of each distinct part, from its host,
        assembled (waits at most ``timeout`` seconds for each). Shards moved meanwhile (a
        suspension and resume, a remap: ``Array.rebind``) are fetched from where they went."""
        self._suspensions.check([array.mesh])
        m, aid = array.mesh, array.id
        parts = sharding.distinct_parts(array.aval.shape, m.axis_sizes, m.axis_names,
                                        array.spec)
        futures = {}
        for _, members in parts:
            d = m.ids[members[0]]
            futures[members[0]] = self._session.request(self._cluster.data_address(d),
                                                        protocol.GetShard(None, aid, d))
        shards = [None] * m.size
        for _, members in parts:
            try:
                value = futures[members[0]].result(timeout)
            except PathwaysError:  # freed meanwhile: say by what, if the user did it
                self._suspensions.check([array.mesh])
                if array.is_deleted():
                    raise PathwaysError("this array was deleted while it was fetched") from None
                if array.id != aid:  # moved meanwhile (suspended and resumed): from there
                    array.block_until_ready(timeout)
                    return self.fetch(array, timeout)
                raise
            for i in members:
                shards[i] = value
        return sharding.assemble(shards, m.axis_sizes, m.axis_names, array.spec)

    def adopt(self, arrays, results) -> None:
        """The small results that came with the end of the run making ``arrays``
        (``RunDone.results``: array id, mesh position, value): each array whose parts all
        came, each of its shard's shape and dtype, holds its value from now on; any other
        is fetched as usual when asked for."""
        got: dict = {}
        for aid, position, value in results:
            got.setdefault(aid, {})[position] = unwrap(value)
        for array in arrays:
            values = got.get(array.id)
            if not values or array.is_deleted() or array.local_copy() is not None:
                continue
            m, aval = array.mesh, array.aval  # (a key array's: its key data's)
            parts = sharding.distinct_parts(aval.shape, m.axis_sizes, m.axis_names, array.spec)
            pieces = [values.get(part.holders[0]) for part in parts]
            if not all(isinstance(v, np.ndarray) and v.dtype == aval.dtype
                       and v.shape == tuple(s.stop - s.start for s in part.slices)
                       for v, part in zip(pieces, parts)):
                continue  # not what the run makes: fetched when asked for
            if len(parts) == 1:  # replicated (or one device): the part is the whole
                array.hold(pieces[0])
                continue
            whole = np.empty(aval.shape, aval.dtype)
            for v, part in zip(pieces, parts):
                whole[part.slices] = v
            array.hold(whole)

    def delete(self, array) -> None:
        """Free ``array``'s shards on every host still live (a lost host's went with it)."""
        per_host: dict[str, list] = {}
        for d in array.mesh.ids:
            if d in self._cluster:
                per_host.setdefault(self._cluster.data_address(d), []).append((array.id, d))
        for address, keys in per_host.items():
            self._session.send(address, protocol.DeleteShards(keys))
