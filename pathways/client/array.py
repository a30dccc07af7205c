"""``pw.Array``: a future for a logical sharded array that lives on the hosts.

It knows its shape, dtype, mesh and spec at once; ``result()`` fetches the shards straight from
the hosts and assembles the global value (a small result of a run, up to 64 KiB, comes with the
run's end, nothing to fetch, once the client has fetched that output of the program before).
The client refcounts the logical array (this object), not its shards: when the last reference
goes (or ``delete()``), its shards are freed on every host. It follows ``concurrent.futures``:
``result(timeout)``, ``done()``, ``exception()``, ``add_done_callback``, and it is awaitable.

Its value converts as a numpy array's does, fetched: ``np.asarray(a)``, ``float(a)``,
``int(a)``, ``bool(a)``, ``operator.index(a)``, and ``jnp.asarray(a)`` (``__jax_array__``).
What numpy refuses for the shape and dtype (``float`` of a non-scalar) is refused before
anything is fetched. JAX does not trace it (``teach_jax``): it lives on the cluster.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import math
import operator
import sys
from dataclasses import dataclass

import numpy as np

from ..errors import PathwaysError, ProgramError, ShardingError
from ..program import prng
from ..program.ir import Aval, RemoteValue
from ..program.mesh import Mesh
from ..program.sharding import P, as_spec


@dataclass(frozen=True)
class NamedSharding:
    """Where an array lives, as JAX's ``NamedSharding``: a mesh (from ``client.mesh``) and a
    partition spec (a ``P``, or JAX's ``PartitionSpec``, kept as the same ``P``), for
    ``client.put(value, sharding)`` and ``client.device_put(value, sharding)``. JAX's own
    ``jax.sharding.NamedSharding(mesh, spec)`` over a pathways mesh means the same there.

    >>> x.sharding.mesh, x.sharding.spec       # the mesh and P(...) it was placed with
    >>> w = client.device_put(np.eye(4), pw.NamedSharding(mesh, P("data")))
    """

    mesh: object
    spec: object

    def __post_init__(self):
        if not isinstance(self.mesh, Mesh):
            raise ShardingError(f"NamedSharding needs a mesh from client.mesh(...), got"
                                f" {self.mesh!r} ({type(self.mesh).__name__})")
        spec = P() if self.spec is None else as_spec(self.spec)
        if not isinstance(spec, P):
            raise ShardingError(f"NamedSharding needs a partition spec P(...), got {spec!r}"
                                f" ({type(spec).__name__})")
        object.__setattr__(self, "spec", spec)

    def __repr__(self):
        return f"NamedSharding({self.mesh}, {self.spec})"


class Array(RemoteValue):
    """A future for a global array sharded over a mesh, as ``client.put``, ``client.generate``
    and compiled-function calls return it. Its shape, dtype, mesh and spec are known at once;
    its value once the run that produces it has finished.

    >>> y = step(x)                  # returns at once
    >>> y.shape, y.dtype, y.spec     # known before the run ends
    >>> value = y.result()           # a numpy array, fetched from the hosts
    """

    def __init__(self, client, array_id, aval: Aval, mesh, spec, status: cf.Future,
                 value=None, origin=None):
        self.client, self.id = client, array_id
        self.aval, self.mesh, self.spec = aval, mesh, spec
        self._status = status  # resolves (to None) when the producing run is done
        self._value = value
        self._origin = origin  # (program id, output var id) of the run that makes it
        self._unread = False  # its value came with its run's end and nobody read it yet
        self._deleted = False
        client.ledger.track(self)

    # as JAX says them: a key array's are its keys', not its key data's (``aval``)
    shape = property(lambda self: self.aval.logical_shape)
    dtype = property(lambda self: self.aval.logical_dtype)
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    sharding = property(lambda self: NamedSharding(self.mesh, self.spec))

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")  # numpy's words for a 0-d array
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(a)``: the global value (waits for it and fetches it, as result())."""
        if self.aval.key is not None:  # as JAX refuses it for its own key arrays
            raise TypeError(f"{self.aval} is an array of PRNG keys, which numpy cannot hold;"
                            " a.result() gives them as a JAX key array, and"
                            " jax.random.key_data(a.result()) their key data")
        value = self.result()
        return value if dtype is None else value.astype(dtype)

    def __jax_array__(self):
        """``jnp.asarray(a)``: the fetched value as a JAX array on JAX's default device.

        JAX 0.10 converts with it only where it asks for an array itself (``jnp.asarray``,
        ``jnp.array``, a JAX array's operators); where JAX would trace the pw.Array instead
        (``jnp.sum(a)``, an argument of ``jax.jit``) it is refused (``teach_jax``)."""
        teach_jax()
        import jax.numpy as jnp

        value = self.result()
        return value if self.aval.key is not None else jnp.asarray(value)

    def _scalar(self, convert):
        """``convert`` of the fetched value, as numpy does it; what numpy refuses for this
        shape and dtype (a size > 1 array to ``float``) it refuses first on a stand-in of
        zeros (one element, broadcast), so without waiting or fetching."""
        convert(np.broadcast_to(np.zeros((), self.dtype), self.shape))
        return convert(self.result())

    def __float__(self):
        return self._scalar(float)

    def __int__(self):
        return self._scalar(int)

    def __complex__(self):
        return self._scalar(complex)

    def __bool__(self):
        return self._scalar(bool)

    def __index__(self):
        return self._scalar(operator.index)

    def _compute_elsewhere(self, *args, **kwargs):
        raise ProgramError(
            "a pw.Array is computed on the devices, not in the client: put the arithmetic or"
            " indexing in a shard_map body (pw.shard_map(lambda x: x + 1, mesh, spec, spec)(a)),"
            " or fetch the value first (a.result() or np.asarray(a)) to use numpy on it")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _compute_elsewhere
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _compute_elsewhere
    __matmul__ = __rmatmul__ = __pow__ = __rpow__ = __mod__ = __rmod__ = _compute_elsewhere
    __neg__ = __pos__ = __abs__ = __getitem__ = __setitem__ = _compute_elsewhere
    __lt__ = __le__ = __gt__ = __ge__ = _compute_elsewhere

    def __repr__(self):
        state = "deleted" if self._deleted else ("done" if self.done() else "pending")
        return f"Array({self.aval}, {self.spec}, {state})"

    def done(self) -> bool:
        """Whether the run that produces this array has finished, successfully or not.

        >>> y = step(x)
        >>> y.done()           # False while the run is in flight
        """
        return self._status.done()

    def exception(self, timeout=None):
        """The exception the producing run failed with, or None if it succeeded. Waits up to
        ``timeout`` seconds for the run to finish (None: no limit).

        >>> err = y.exception(timeout=10)
        >>> if err is not None:
        ...     print("step failed:", err)
        """
        return self._status.exception(timeout)

    def add_done_callback(self, fn) -> None:
        """Call ``fn(array)`` once the producing run has finished. If it already has, ``fn``
        runs at once in this thread; otherwise on the client's event-loop thread, so keep it
        short and do not wait in it.

        >>> y.add_done_callback(lambda a: print("finished:", a))
        """
        self._status.add_done_callback(lambda _f: fn(self))

    def result(self, timeout=None) -> np.ndarray:
        """The global value as a numpy array (waits for it, then fetches the shards, unless
        they came with the run's end: a small result); an array of PRNG keys as a JAX key
        array.

        >>> value = y.result(timeout=60)     # np.ndarray of shape y.shape
        """
        value = self.data(timeout)
        return value if self.aval.key is None else prng.wrap(value, self.aval.key)

    def data(self, timeout=None) -> np.ndarray:
        """``result`` as numpy: a key array's key data."""
        if self._deleted:
            raise PathwaysError("this array was deleted")
        self._status.result(timeout)
        if self._value is None:
            self._value = self.client.shards.fetch(self, timeout)
            if self._origin is not None:  # later runs bring this output along (if small)
                self.client.programs.want(*self._origin)
        self._unread = False
        return self._value

    def __await__(self):
        return asyncio.wrap_future(
            self.client.executor.submit(self.result)).__await__()

    def block_until_ready(self, timeout=None) -> Array:
        """Wait until the producing run has finished, without fetching the value, and
        return this array. Raises the run's exception if it failed.

        >>> y = step(x).block_until_ready()     # computed on the devices; nothing fetched
        """
        self._status.result(timeout)
        return self

    def is_deleted(self) -> bool:
        """Whether ``delete()`` was called (as JAX's ``Array.is_deleted``).

        >>> x.delete()
        >>> x.is_deleted()
        True
        """
        return self._deleted

    def hold(self, value: np.ndarray) -> None:
        """Keep ``value`` as this array's (a small result that came with its run's end):
        ``result()`` returns it without fetching."""
        if not self._deleted:
            self._value = value
            self._unread = True

    def _unwanted(self) -> None:
        """Going away with a value that came along unread: later runs stop bringing this
        output (until it is fetched again)."""
        if self._unread and self._origin is not None:
            self._unread = False
            self.client.programs.unwant(*self._origin)

    def local_copy(self) -> np.ndarray | None:
        """The value this client holds (it put the array, or fetched it), else None; fetches
        nothing."""
        return self._value

    def rebind(self, array_id, mesh, status: cf.Future | None = None) -> None:
        """The runtime moved this array's shards (a remap, a resume): they are now array
        ``array_id`` on ``mesh``, ready once ``status`` resolves (None: as before)."""
        self.id, self.mesh = array_id, mesh
        if status is not None:
            self._status = status

    def delete(self) -> None:
        """Free the shards on the hosts: now, or once the runs already given this array (or
        the run that produces it) have finished, so deleting never pulls an input from under
        a queued call.

        >>> y = step(x)
        >>> x.delete()         # x can no longer be fetched or passed to a call; y is fine
        """
        if not self._deleted:
            self._unwanted()
            self._deleted = True
            self._value = None
            self.client.ledger.release_when_unused(self)

    def __del__(self):
        try:
            if not self._deleted:
                self._deleted = True  # first: a save that holds it from now on skips it
                self._unwanted()
                self.client.ledger.collected(self)
        except Exception:
            pass  # interpreter shutdown: the client frees everything it owns on close


def teach_jax() -> None:
    """Once JAX is loaded (any thread, idempotent): JAX refuses to trace a pw.Array -- an
    argument of ``jax.jit``, ``jax.grad`` or ``jax.vmap``, an operand of a ``jax.numpy``
    function -- with a ``ProgramError`` that says what to do, instead of its own
    "Triggering __jax_array__() during abstractification" (JAX 0.10 traces only its own
    types; ``jnp.asarray(a)`` still fetches the value). A client calls it when it starts."""
    global _taught
    if _taught or "jax" not in sys.modules:
        return
    try:
        from jax._src import core  # where JAX finds the abstract value of a Python type
    except ImportError:  # another JAX: its own error stays
        return
    mappings = getattr(core, "pytype_aval_mappings", None)
    if isinstance(mappings, dict):
        mappings.setdefault(Array, _not_traced)
        _taught = True


_taught = False  # teach_jax has registered _not_traced


def _not_traced(array: Array):
    raise ProgramError(
        f"JAX cannot trace {array!r}: a pw.Array lives on the cluster, not in JAX (an argument"
        " of jax.jit, jax.grad or jax.vmap, or of a jax.numpy function). Compute on the"
        " cluster with a pw.shard_map function (a @pw.program compiles several calls, as"
        " jax.jit does), or fetch the value first: jnp.asarray(a) or a.result()")
